"""Hit levels: the deterministic verdict on one golden case given its recorded fixture.

Definitions (one place; the report's notes repeat them in prose):

- **Retrieved** documents are the fixture's candidates when the lookup said ``found=true``, and nothing when
  it said ``found=false`` (the tool returned no evidence, whatever it had ranked internally).
- **Relevant** documents are the case's expected and acceptable documents.
- A relevant document **hits** when it is retrieved at rank ``<= HIT_RANK_CUTOFF`` (5; ``k`` of
  :func:`classify_case`). ``eval`` and ``compare`` both classify with :func:`classify_case` and this cut-off, so
  the same fixture gets the same level from either command (a document at rank 15 is a miss in both).
- **Breadcrumb coverage** is met when any expected breadcrumb occurs (case-insensitive substring) in the
  breadcrumb or title of a retrieved candidate of a relevant document (of its own document, when the
  expected breadcrumb names one).
- **Keyword coverage** is met when every expected keyword occurs (case-insensitive substring) in the content
  of the retrieved candidates of relevant documents or in the content of the result's evidence blocks.
- **Coverage** is met when either listed kind is met; a case that lists neither keywords nor breadcrumbs
  meets it vacuously (the document hit alone makes it strong).

A case with relevant documents is ``strong`` (a relevant document is retrieved and coverage is met),
``medium`` (retrieved, coverage not met) or ``miss`` (none retrieved). A case with no relevant documents is
a no-answer case: ``no_answer_correct`` when the lookup said ``found=false`` or ``evidenceStatus ==
"no_evidence"``, else ``no_answer_wrong``. A case without a usable fixture is ``not_run``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kb_retrieval.evaluation.fixtures import Fixture, FixtureCandidate, fixture_filename
from kb_retrieval.evaluation.golden import ExpectedBreadcrumb, GoldenCase

CaseStatus = Literal["strong", "medium", "miss", "no_answer_correct", "no_answer_wrong", "not_run"]
#: The statuses of answerable cases (cases with relevant documents), best first.
HIT_LEVELS: tuple[CaseStatus, ...] = ("strong", "medium", "miss")
#: The ``evidenceStatus`` value meaning "the knowledge base holds no evidence for this query".
NO_EVIDENCE = "no_evidence"
#: How many top candidates a case result lists.
TOP_CANDIDATES = 5
#: The rank a relevant document must reach to count as a hit: one cut-off for ``eval`` and ``compare``
#: (``compare --k`` defaults to it).
HIT_RANK_CUTOFF = 5


class CaseResult(BaseModel):
    """The evaluation of one golden case: the per-case row of the report."""

    model_config = ConfigDict(frozen=True)

    case_id: str
    scenario: str
    query: str = ""
    """The case's query, as the golden file holds it."""
    expected_docs: list[str] = []
    """The documents the case expects first (empty for a no-answer case)."""
    status: CaseStatus
    """Hit level (``strong``/``medium``/``miss``), no-answer outcome, or ``not_run``."""
    first_expected_rank: int | None = None
    """1-based rank of the first retrieved relevant document; None when none was retrieved."""
    top_candidates: list[str] = []
    """The first retrieved candidates as ``source > breadcrumb``."""
    not_in_evidence: list[str] = []
    """The top candidates (same labels) the agent never received: ranked, but below the evidence threshold or
    left out of the context pack (see :attr:`Fixture.received_sources`)."""
    failed_checks: list[str] = []
    """Why the case is not better than its status, e.g. ``keyword 'maxmemory' not found``."""
    ranking: list[str] = Field(default=[], exclude=True)
    """All retrieved sources in rank order (input to ranking metrics; left out of the report)."""
    first_relevant_rank: int | None = Field(default=None, exclude=True)
    """1-based rank of the first relevant document anywhere in the ranking, past the hit cut-off too (input to
    ``recall@K``; left out of the report)."""

    @property
    def is_answerable_run(self) -> bool:
        """True for a run case with relevant documents (the denominator of recall, MRR and nDCG)."""
        return self.status in HIT_LEVELS


def retrieved_candidates(fixture: Fixture) -> list[FixtureCandidate]:
    """The candidates the lookup actually returned: all of them if ``found``, none otherwise."""
    return list(fixture.candidates) if fixture.found else []


def classify_case(case: GoldenCase, fixture: Fixture | None, k: int = HIT_RANK_CUTOFF) -> CaseResult:
    """Classify one golden case against its fixture.

    Example:
        >>> case = GoldenCase(case_id="c1", scenario="chat", query="q", expected_docs=["a.md"])
        >>> fixture = Fixture(case_id="c1", query="q", result={"found": True}, candidates=[
        ...     FixtureCandidate(rank=1, source="a.md", score_label="fused", score=1.0, content="")])
        >>> classify_case(case, fixture).status
        'strong'

    Args:
        case: The golden case.
        fixture: Its fixture, or None when there is none.
        k: The hit cut-off: a relevant document counts only at rank ``<= k``.

    Returns:
        The case result.
    """
    name = fixture_filename(case.case_id)
    if fixture is None:
        return _not_run(case, f"no fixture file {name} in fixtures dir")
    if fixture.query != case.query:
        return _not_run(case, f"fixture {name} was recorded for a different query (stale: re-record it)")

    retrieved = retrieved_candidates(fixture)
    status, failed_checks, first_rank = _verdict(case, fixture, retrieved, k)
    top = retrieved[:TOP_CANDIDATES]
    received = fixture.received_sources
    return CaseResult(
        case_id=case.case_id,
        scenario=case.scenario,
        query=case.query,
        expected_docs=list(case.expected_docs),
        status=status,
        first_expected_rank=first_rank,
        top_candidates=[candidate.label() for candidate in top],
        not_in_evidence=[c.label() for c in top if received is not None and c.source not in received],
        failed_checks=failed_checks,
        ranking=[candidate.source for candidate in retrieved],
        first_relevant_rank=next((c.rank for c in retrieved if c.source in case.relevance()), None),
    )


def _verdict(
    case: GoldenCase, fixture: Fixture, retrieved: list[FixtureCandidate], k: int
) -> tuple[CaseStatus, list[str], int | None]:
    """Status, failed checks and first relevant rank of a case that has a fixture."""
    if case.is_no_answer:
        if not fixture.found or fixture.evidence_status == NO_EVIDENCE:
            return "no_answer_correct", [], None
        check = f"answered found=true (evidenceStatus {fixture.evidence_status!r}) for a no-answer case"
        return "no_answer_wrong", [check], None

    relevant = case.relevance()
    hits = [candidate for candidate in retrieved if candidate.source in relevant and candidate.rank <= k]
    if not hits:
        checks = ["expected doc not retrieved"]
        later = [candidate.rank for candidate in retrieved if candidate.source in relevant]
        if later:
            checks = [f"expected doc at rank {later[0]}, below the hit cut-off {k}"]
        if not fixture.found:
            checks.append(_withheld_note(fixture, relevant))
        return "miss", checks, None

    gaps = coverage_gaps(case, hits, fixture.evidence_contents)
    return ("medium" if gaps else "strong"), gaps, hits[0].rank


def coverage_gaps(case: GoldenCase, relevant_hits: list[FixtureCandidate], evidence_contents: list[str]) -> list[str]:
    """The failed coverage checks of a case whose relevant documents were retrieved.

    Args:
        case: The golden case.
        relevant_hits: The retrieved candidates of relevant documents.
        evidence_contents: The content of the result's evidence blocks.

    Returns:
        An empty list when coverage is met (or vacuous); otherwise one check per expected breadcrumb and
        per missing keyword, e.g. ``["breadcrumb 'Mitigation' not found", "keyword 'maxmemory' not found"]``.
    """
    if not case.expected_breadcrumbs and not case.expected_keywords:
        return []

    breadcrumb_gaps: list[str] = []
    if case.expected_breadcrumbs:
        if any(_covers(crumb, candidate) for crumb in case.expected_breadcrumbs for candidate in relevant_hits):
            return []
        breadcrumb_gaps = [f"breadcrumb {crumb.describe()} not found" for crumb in case.expected_breadcrumbs]

    keyword_gaps: list[str] = []
    if case.expected_keywords:
        texts = [candidate.content.casefold() for candidate in relevant_hits]
        texts += [content.casefold() for content in evidence_contents]
        keyword_gaps = [
            f"keyword {keyword!r} not found"
            for keyword in case.expected_keywords
            if not any(keyword.casefold() in text for text in texts)
        ]
        if not keyword_gaps:
            return []

    return breadcrumb_gaps + keyword_gaps


def _covers(crumb: ExpectedBreadcrumb, candidate: FixtureCandidate) -> bool:
    if crumb.doc is not None and candidate.source != crumb.doc:
        return False
    needle = crumb.heading.casefold()
    return any(needle in heading.casefold() for heading in (candidate.breadcrumb, candidate.title) if heading)


def _withheld_note(fixture: Fixture, relevant: dict[str, int]) -> str:
    # Tells a threshold problem (the doc was ranked but withheld) from a retrieval problem.
    ranks = [candidate.rank for candidate in fixture.candidates if candidate.source in relevant]
    if ranks:
        return f"lookup returned found=false (expected doc withheld at rank {ranks[0]})"
    return "lookup returned found=false"


def _not_run(case: GoldenCase, reason: str) -> CaseResult:
    return CaseResult(
        case_id=case.case_id,
        scenario=case.scenario,
        query=case.query,
        expected_docs=list(case.expected_docs),
        status="not_run",
        failed_checks=[reason],
    )
