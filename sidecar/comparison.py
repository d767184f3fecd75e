"""The current path and the sidecar compared on golden cases: per-case differences, agreement, hit levels.

For every golden case one lookup runs with the sidecar beside it (:func:`lookup_with_sidecar`, the one call into the
core's comparison API).
A :class:`CaseComparison` holds both paths' top-K documents (one per source), marks where they differ (source,
breadcrumb, category, score label at each rank; rank of every shared source), measures their agreement (overlap@K of
sources, Kendall tau-b of the shared sources' ranks, same top-1) and classifies each path's hit level with the offline
evaluator's own rules (:func:`kb_retrieval.evaluation.hit_levels.classify_case`). The sidecar's status is recorded per
case: a sidecar that cannot run leaves every current-path result in the report, marked ``unavailable``.

Scores are never compared across paths: each path's scores are listed under its own label (see ``paths``).

Example:
    >>> report = run_comparison("golden/sample-kb.jsonl", lookup, k=5)  # doctest: +SKIP
    >>> report.summary.sidecar_status, report.summary.mean_overlap_at_k  # doctest: +SKIP
    ('ok', 0.6736)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from kb_retrieval.config import KBSettings
from kb_retrieval.evaluation.fixtures import Fixture, FixtureCandidate
from kb_retrieval.evaluation.golden import GoldenCase, load_golden
from kb_retrieval.evaluation.hit_levels import CaseResult, CaseStatus, classify_case
from kb_retrieval.evaluation.metrics import MetricSet, compute_metrics
from kb_retrieval.models import Candidate, LookupResult
from kb_retrieval.reporting import Displayed, Views, display_path
from sidecar.comparable import from_main_ranking, main_path_name
from sidecar.models import DEFAULT_K, SIDECAR_PATH, ComparableResult, SidecarRun, disabled_run

if TYPE_CHECKING:
    from kb_retrieval.engine import KnowledgeLookup, LookupDetails
    from kb_retrieval.sidecar_protocol import SidecarRunProtocol

#: Decimal places of every float in the report.
DECIMALS = 4
#: Version of the JSON layout; bump it when fields change meaning.
COMPARE_SCHEMA_VERSION = 1

#: What the two paths' ranks and scores mean (the report repeats this so no one compares numbers across paths).
MAIN_RANKED_BY = "rule rerank: normalised similarity + named L0 boosts, after the L0 category filter and its fallback"
MAIN_SCORE_SEMANTICS = (
    "raw Milvus score of the document's best chunk as the main path's L1 search returned it; the rank order "
    "comes from the rule rerank, not from this number"
)
SIDECAR_RANKED_BY = "Milvus order of the raw query's top chunks (stock VectorIndexRetriever: no filter, no rerank)"
SIDECAR_SCORE_SEMANTICS = (
    "raw Milvus score that MilvusVectorStore passes through as 'similarity': with COSINE or IP a similarity "
    "(higher is better), with L2 a squared distance (lower is better)"
)


class PathInfo(BaseModel):
    """What one path's ranks and scores mean."""

    model_config = ConfigDict(frozen=True)

    name: str
    score_label: str | None
    ranked_by: str
    score_semantics: str


class PathSide(BaseModel):
    """One path's view of one case."""

    model_config = ConfigDict(frozen=True)

    path: str
    status: str
    """Current path: ``found`` / ``no_evidence``. Sidecar: ``ok``, ``unavailable``, ``failed`` or ``timeout``."""
    reason: str | None = None
    hit_level: CaseStatus
    first_expected_rank: int | None = None
    failed_checks: list[str] = []
    results: list[ComparableResult] = []
    """Its top-K documents, one per source."""


class RowDifference(BaseModel):
    """The two paths' documents at one rank, and what differs between them."""

    model_config = ConfigDict(frozen=True)

    rank: int
    current: str | None
    sidecar: str | None
    differs: list[str]
    """Any of ``source``, ``breadcrumb``, ``category``, ``score_label`` (empty when the rows agree)."""


class SharedSource(BaseModel):
    """A source both paths returned in their top K."""

    model_config = ConfigDict(frozen=True)

    source: str
    current_rank: int
    sidecar_rank: int


class Agreement(BaseModel):
    """How far the two top-K lists agree (only when the sidecar answered)."""

    model_config = ConfigDict(frozen=True)

    overlap_at_k: float | None
    """``|shared| / max(|current|, |sidecar|)``; None when both are empty."""
    kendall_tau: float | None
    """Kendall tau-b of the shared sources' ranks in the two lists; None with fewer than two shared sources."""
    top1_same: bool | None
    shared: list[SharedSource]
    only_current: list[str]
    only_sidecar: list[str]


class CaseComparison(BaseModel):
    """One golden case, both paths side by side."""

    model_config = ConfigDict(frozen=True)

    case_id: str
    scenario: str
    query: str
    expected_docs: list[str] = []
    """The documents the case expects first (empty for a no-answer case)."""
    current: PathSide
    sidecar: PathSide
    rows: list[RowDifference]
    agreement: Agreement | None
    """None when the sidecar did not answer (see ``sidecar.status``)."""
    verdicts: tuple[CaseResult, CaseResult] = Field(exclude=True)
    """The evaluator's case results of the current path and the sidecar (input to the summary metrics)."""


class CompareSummary(BaseModel):
    """Aggregates over all cases."""

    model_config = ConfigDict(frozen=True)

    case_count: int
    sidecar_status: str
    """The one sidecar status of every case, or ``mixed`` (see ``sidecar_statuses``)."""
    sidecar_statuses: dict[str, int]
    compared: int
    """Cases where the sidecar answered (the denominator of the agreement figures)."""
    mean_overlap_at_k: float | None
    mean_kendall_tau: float | None
    kendall_tau_cases: int
    """Cases with at least two shared sources (where tau is defined)."""
    top1_agreement: float | None
    cases_with_differences: int
    current: MetricSet
    """Hit levels and rates of the current path over its top K (offline evaluator rules)."""
    sidecar: MetricSet
    """The same for the sidecar; cases where it did not answer count as not run."""


class CompareReport(Displayed, BaseModel):
    """The comparison of one golden set; in a notebook the hit levels side by side and the cases
    (``to_dataframe()``: one row per case)."""

    model_config = ConfigDict(frozen=True)
    views: ClassVar[Views] = Views(
        "sidecar.report:compare_view",
        "sidecar.report:compare_repr",
        "sidecar.report:compare_rows",
        "sidecar.report:COMPARE_FRAME_COLUMNS",
    )

    schema_version: int = COMPARE_SCHEMA_VERSION
    golden: str
    k: int
    settings: dict[str, Any]
    paths: dict[str, PathInfo]
    summary: CompareSummary
    cases: list[CaseComparison]


# --- one lookup with the sidecar beside it -------------------------------------------------------------------


def lookup_with_sidecar(lookup: KnowledgeLookup, query: str) -> LookupDetails:
    """Run one lookup with the sidecar beside it: the only call the comparison makes into the core's lookup API.

    ``result`` and ``ranking`` are exactly the lookup's own (the sidecar never changes them); ``sidecar`` is the
    sidecar's run, or None when the lookup has no sidecar.
    """
    return lookup.lookup_detailed(query)


def sidecar_run(run: SidecarRunProtocol | None) -> SidecarRun:
    """The sidecar's run from what ran beside a lookup: ``disabled`` when nothing did, ``unavailable`` when some
    other comparison runner did (its run is not the sidecar's)."""
    if run is None:
        return disabled_run()
    if isinstance(run, SidecarRun):
        return run
    return SidecarRun(status="unavailable", reason=f"the lookup ran {type(run).__name__}, not the sidecar")


# --- one case ------------------------------------------------------------------------------------------------


def compare_case(
    case: GoldenCase, result: LookupResult, ranking: Sequence[Candidate], run: SidecarRun, k: int = DEFAULT_K
) -> CaseComparison:
    """Compare the two paths on one case (top ``k`` documents of each).

    Each current-path document says whether the agent received it (``in_evidence``: in the context pack).
    """
    received = set(result.context_pack.summary.included_sources) if result.found else set()
    current_top = [
        _rounded(r).model_copy(update={"in_evidence": r.source in received}) for r in from_main_ranking(ranking)[:k]
    ]
    current_fixture = Fixture(
        case_id=case.case_id,
        query=case.query,
        candidates=[_fixture_candidate(r) for r in current_top],
        result={
            "found": result.found,
            "evidenceStatus": result.evidence_status.value,
            "evidenceBlocks": [{"content": block.content} for block in result.evidence_blocks],
        },
    )
    current, current_verdict = _side(
        case,
        current_fixture,
        current_top,
        k,
        path=current_top[0].path if current_top else _served(result),
        status="found" if result.found else "no_evidence",
        reason=None if result.found else result.message,
    )

    status, reason = (run.status, run.reason) if run.status != "disabled" else ("unavailable", run.reason)
    if status == "ok":
        sidecar_top = [_rounded(r) for r in run.results[:k]]
        # The stock retriever has no evidence threshold: it "found" whatever it returned; its evidence is its top K.
        sidecar_fixture = Fixture(
            case_id=case.case_id,
            query=case.query,
            candidates=[_fixture_candidate(r) for r in sidecar_top],
            result={
                "found": bool(sidecar_top),
                "evidenceStatus": "ok" if sidecar_top else "no_evidence",
                "evidenceBlocks": [{"content": r.content} for r in sidecar_top],
            },
        )
        sidecar, sidecar_verdict = _side(
            case, sidecar_fixture, sidecar_top, k, path=run.path, status=status, reason=reason
        )
        agreement: Agreement | None = _agreement(current_top, sidecar_top)
    else:
        sidecar_top = []
        sidecar_verdict = CaseResult(
            case_id=case.case_id,
            scenario=case.scenario,
            status="not_run",
            failed_checks=[f"sidecar {status}: {reason}"],
        )
        sidecar = PathSide(
            path=run.path,
            status=status,
            reason=reason,
            hit_level=sidecar_verdict.status,
            failed_checks=sidecar_verdict.failed_checks,
        )
        agreement = None
    return CaseComparison(
        case_id=case.case_id,
        scenario=case.scenario,
        query=case.query,
        expected_docs=list(case.expected_docs),
        current=current,
        sidecar=sidecar,
        rows=_rows(current_top, sidecar_top, k) if status == "ok" else [],
        agreement=agreement,
        verdicts=(current_verdict, sidecar_verdict),
    )


def _side(
    case: GoldenCase,
    fixture: Fixture,
    top: list[ComparableResult],
    k: int,
    *,
    path: str,
    status: str,
    reason: str | None,
) -> tuple[PathSide, CaseResult]:
    verdict = classify_case(case, fixture, k)
    side = PathSide(
        path=path,
        status=status,
        reason=reason,
        hit_level=verdict.status,
        first_expected_rank=verdict.first_expected_rank,
        failed_checks=verdict.failed_checks,
        results=top,
    )
    return side, verdict


def _rows(current: list[ComparableResult], sidecar: list[ComparableResult], k: int) -> list[RowDifference]:
    rows = []
    for rank in range(1, min(k, max(len(current), len(sidecar))) + 1):
        left = current[rank - 1] if rank <= len(current) else None
        right = sidecar[rank - 1] if rank <= len(sidecar) else None
        if left is None or right is None or left.source != right.source:
            differs = ["source"]
        else:
            differs = [
                name
                for name, a, b in (
                    ("breadcrumb", left.breadcrumb, right.breadcrumb),
                    ("category", left.category, right.category),
                    ("score_label", left.score_label, right.score_label),
                )
                if a != b
            ]
        rows.append(
            RowDifference(
                rank=rank,
                current=left.source if left else None,
                sidecar=right.source if right else None,
                differs=differs,
            )
        )
    return rows


def _agreement(current: list[ComparableResult], sidecar: list[ComparableResult]) -> Agreement:
    current_rank = {r.source: r.rank for r in current}
    sidecar_rank = {r.source: r.rank for r in sidecar}
    shared = [
        SharedSource(source=r.source, current_rank=r.rank, sidecar_rank=sidecar_rank[r.source])
        for r in current
        if r.source in sidecar_rank
    ]
    longest = max(len(current), len(sidecar))
    return Agreement(
        overlap_at_k=_round(len(shared) / longest) if longest else None,
        kendall_tau=kendall_tau([s.current_rank for s in shared], [s.sidecar_rank for s in shared]),
        top1_same=(current[0].source == sidecar[0].source) if current and sidecar else None,
        shared=shared,
        only_current=[r.source for r in current if r.source not in sidecar_rank],
        only_sidecar=[r.source for r in sidecar if r.source not in current_rank],
    )


def kendall_tau(a: Sequence[int], b: Sequence[int]) -> float | None:
    """Kendall tau-b of two rankings of the same items, rounded; None with fewer than two items.

    Example:
        >>> kendall_tau([1, 2, 3], [1, 3, 2])
        0.3333
    """
    if len(a) < 2:
        return None
    from scipy.stats import kendalltau

    value = float(kendalltau(a, b).statistic)
    return None if math.isnan(value) else _round(value)


# --- the golden set ------------------------------------------------------------------------------------------


def run_comparison(
    golden_path: str | Path, lookup: KnowledgeLookup, k: int = DEFAULT_K, *, progress: bool = False
) -> CompareReport:
    """Run every golden case through a lookup with the sidecar beside it (:func:`lookup_with_sidecar`); compare the
    paths.

    Args:
        golden_path: Golden JSON Lines file.
        lookup: A lookup, normally with ``sidecar_enabled``; without a sidecar every case says ``unavailable``.
        k: Documents compared per path.
        progress: Show a bar of cases on stderr when it is a terminal.

    Returns:
        The report (cases in golden-file order), deterministic for the same collection and settings.
    """
    from kb_retrieval.progress import progress_bar

    cases = load_golden(golden_path)
    comparisons = []
    bar = progress_bar(len(cases), "comparing", "case", enabled=progress)
    for case in cases:
        detail = lookup_with_sidecar(lookup, case.query)
        comparisons.append(compare_case(case, detail.result, detail.ranking, sidecar_run(detail.sidecar), k))
        bar.update()
    bar.close()
    return build_report(cases, comparisons, display_path(golden_path), k, lookup.settings)


def build_report(
    cases: Sequence[GoldenCase], comparisons: Sequence[CaseComparison], golden: str, k: int, settings: KBSettings
) -> CompareReport:
    """Aggregate the case comparisons into the report."""
    statuses = Counter(c.sidecar.status for c in comparisons)
    compared = [c.agreement for c in comparisons if c.agreement is not None]
    overlaps = [a.overlap_at_k for a in compared if a.overlap_at_k is not None]
    taus = [a.kendall_tau for a in compared if a.kendall_tau is not None]
    top1 = [a.top1_same for a in compared if a.top1_same is not None]
    current_metrics, _ = compute_metrics(cases, [c.verdicts[0] for c in comparisons], [1, k])
    sidecar_metrics, _ = compute_metrics(cases, [c.verdicts[1] for c in comparisons], [1, k])
    served = sorted({c.current.path for c in comparisons if c.current.results})
    score_label = ", ".join(sorted({r.score_label for c in comparisons for r in c.current.results})) or None
    return CompareReport(
        golden=golden,
        k=k,
        settings={
            "collection": settings.storage.collection,
            "metric": settings.schema_fields.metric,
            "vector_store_mode": settings.retrieval.vector_store_mode,
            "top_k": settings.retrieval.top_k,
            "sidecar_timeout_s": settings.sidecar.timeout_s,
        },
        paths={
            "current": PathInfo(
                name=", ".join(served) or "main",
                score_label=score_label,
                ranked_by=MAIN_RANKED_BY,
                score_semantics=MAIN_SCORE_SEMANTICS,
            ),
            "sidecar": PathInfo(
                name=SIDECAR_PATH,
                score_label=next((r.score_label for c in comparisons for r in c.sidecar.results), None),
                ranked_by=SIDECAR_RANKED_BY,
                score_semantics=SIDECAR_SCORE_SEMANTICS,
            ),
        },
        summary=CompareSummary(
            case_count=len(comparisons),
            sidecar_status=next(iter(statuses)) if len(statuses) == 1 else ("mixed" if statuses else "none"),
            sidecar_statuses=dict(sorted(statuses.items())),
            compared=len(compared),
            mean_overlap_at_k=_mean(overlaps),
            mean_kendall_tau=_mean(taus),
            kendall_tau_cases=len(taus),
            top1_agreement=_mean([1.0 if same else 0.0 for same in top1]),
            cases_with_differences=sum(any(row.differs for row in c.rows) for c in comparisons),
            current=current_metrics,
            sidecar=sidecar_metrics,
        ),
        cases=list(comparisons),
    )


# --- helpers -------------------------------------------------------------------------------------------------


def _fixture_candidate(result: ComparableResult) -> FixtureCandidate:
    return FixtureCandidate(
        rank=result.rank,
        source=result.source,
        title=result.title,
        breadcrumb=result.breadcrumb,
        category=result.category,
        score_label=result.score_label,
        score=result.score,
        path=result.path,
        content=result.content,
    )


def _served(result: LookupResult) -> str:
    return main_path_name(result.retrieval_trace.path_served)


def _rounded(result: ComparableResult) -> ComparableResult:
    return result.model_copy(update={"score": _round(result.score)})


def _round(value: float) -> float:
    return round(value, DECIMALS)


def _mean(values: Sequence[float]) -> float | None:
    return _round(sum(values) / len(values)) if values else None
