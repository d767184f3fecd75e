"""The document ranking's mixture, taught by the knowledge base itself.

How much a document's best section should count against the document's identity (its title, summary and static
vectors) depends on the knowledge base's shape: where one document is one alert whose title and opening say what it
is about, sibling runbooks share template sections and the identity decides; where the answer sits in one section
of a long page, the page's vectors stand for it poorly and the section decides. Measured (session 19 in
docs/tuning-history.md): no one weight holds on both.

So each knowledge base chooses, on questions it asks of itself (:mod:`kb_retrieval.indexing.pseudo_queries`: a
section's first sentence without the words that name its document, its answer that document). Each pseudo-query is
looked up with **its own chunk left out** (a scope ``id != chunk``): a real question paraphrases its section, it
never quotes it, and a quoted section would teach "the best section decides" on every knowledge base. Three numbers
are chosen on a small grid, by mean reciprocal rank of the right document over the pseudo-queries:

- ``section_weight``: ``rank_chunk``, the weight of the best section's similarity;
- ``identity_scale``: the factor on the identity weights (``rank_title``, ``rank_summary``, ``rank_static_*``);
- ``lexical_weight``: ``rank_lexical``, the weight of the best section's BM25 (relative to the query's best BM25
  hit): where the documents share a vocabulary, the words a question shares with one section tell it apart better
  than any vector (documentation: stock BM25 beats stock dense there); where sibling documents share template
  sections, they do not (session 20 in docs/tuning-history.md).

The other weights (the text vector, the title and L0 boosts) stay as set: the pseudo-queries leave out the words
naming their document, so they cannot teach those. The choice is kept only when it beats the configured
weights by more than the noise (the paired gain over the queries above :data:`NOISE_SE` standard errors), and it is
cross-validated by query (:data:`FOLDS` folds; the figure is recorded, not used to choose). Fewer than
``min_queries`` pseudo-queries: the configured weights, and the reason. The fit is deterministic (the pseudo-queries
come in a fixed order, the grid is walked in order, ties keep the configured weights) and is stored per index
version in the state directory (:func:`store_fit`, :func:`load_fit`; a fit stored in an earlier :data:`FIT_FORMAT`
is taught again).

Example:
    >>> cases = [PseudoCase("a.md", [("b.md", {"chunk": 0.4, "doc_title": 0.6}), ("a.md", {"chunk": 0.7})])]
    >>> fit = choose(cases, {"chunk": 0.0, "doc_title": 1.0}, index_version="v1", min_queries=1)
    >>> fit.reason, fit.section_weight
    ('kept: the gain is within the noise (1 pseudo-queries)', 0.0)
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kb_retrieval.atomic import atomic_write

#: The weights the identity scale multiplies (the document's own name and opening, by both models).
IDENTITY = ("doc_title", "doc_summary", "doc_static", "doc_static_title")
SECTION = "chunk"
LEXICAL = "lexical"
SECTION_WEIGHTS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)
IDENTITY_SCALES = (0.0, 0.5, 1.0)
#: BM25 weights tried beside the configured one (the signal is at most the rule reranker's ``lexical_weight``, 0.2,
#: so at 16 the best section's BM25 outweighs every vector).
LEXICAL_WEIGHTS = (1.0, 2.0, 4.0, 8.0, 16.0)
#: Changes when what a fit holds, how it is chosen or the signals it is chosen on change: a stored fit of another
#: format is taught again (3: the ``l0`` signal counts the document's title once,
#: :func:`~kb_retrieval.retrieval.doc_rank.l0_signal`; 4: a fit records what it was taught under, ``taught_under``).
FIT_FORMAT = 4
#: A choice replaces the configured weights only when its mean gain exceeds this many standard errors.
NOISE_SE = 2.0
FOLDS = 5
#: Ranks past this count as a miss (the reciprocal rank is 0).
DEPTH = 10


@dataclass(frozen=True)
class PseudoCase:
    """One pseudo-query's answer (a source) and its candidates in the order retrieval gave them, each with the
    document ranker's raw signals (weight 1 each)."""

    source: str
    candidates: list[tuple[str, dict[str, float]]]


@dataclass(frozen=True)
class RankFit:
    """What a knowledge base chose for its document ranking, and the figures it chose on."""

    index_version: str
    weights: dict[str, float]
    section_weight: float
    identity_scale: float
    queries: int
    reason: str
    mrr_configured: float = 0.0
    mrr_fitted: float = 0.0
    cv_mrr_configured: float = 0.0
    cv_mrr_fitted: float = 0.0
    grid: list[dict[str, float]] = field(default_factory=list)
    #: ``rank_lexical`` as chosen (None: as configured).
    lexical_weight: float | None = None
    #: What the fit was taught under (``ScoringProfile.fit_inputs``): a lookup whose scoring profile gives other
    #: inputs teaches the version again rather than rank with a choice made on other weights or another sample.
    taught_under: dict[str, float] = field(default_factory=dict)
    format: int = FIT_FORMAT

    @property
    def fitted(self) -> bool:
        return self.reason.startswith("fitted")

    def describe(self) -> str:
        """One line for the trace: what decided and with what weight."""
        return (
            f"section {self.weights.get(SECTION, 0.0):g} identity x{self.identity_scale:g} "
            f"lexical {self.weights.get(LEXICAL, 0.0):g} "
            f"({self.reason}; pseudo-query MRR {self.mrr_configured:.3f} -> {self.mrr_fitted:.3f})"
        )


#: One point of the grid: (section weight, identity scale, lexical weight).
Point = tuple[float, float, float]


def mixture(
    configured: dict[str, float], section_weight: float, identity_scale: float, lexical_weight: float | None = None
) -> dict[str, float]:
    """``configured`` with the best section's weight (and its BM25's, when given) set and the identity weights
    scaled."""
    out = dict(configured)
    out[SECTION] = section_weight
    if lexical_weight is not None:
        out[LEXICAL] = lexical_weight
    for name in IDENTITY:
        if name in out:
            out[name] = round(out[name] * identity_scale, 6)
    return out


def order(candidates: Sequence[tuple[str, dict[str, float]]], weights: dict[str, float]) -> list[str]:
    """The candidates' sources ordered by ``weights`` (the ranker's sum, rounded as it rounds; retrieval's order
    breaks ties)."""
    scored = [
        (-round(sum(weights.get(k, 0.0) * v for k, v in signals.items()), 6), i, source)
        for i, (source, signals) in enumerate(candidates)
    ]
    return [source for _, _, source in sorted(scored)]


def reciprocal_rank(case: PseudoCase, weights: dict[str, float]) -> float:
    """1/rank of the case's source when its candidates are ordered by ``weights`` (0 past :data:`DEPTH`)."""
    for rank, source in enumerate(order(case.candidates, weights)[:DEPTH], start=1):
        if source == case.source:
            return 1.0 / rank
    return 0.0


def grid(configured: dict[str, float]) -> list[Point]:
    """The grid, the configured mixture first (so a tie keeps it)."""
    here = (configured.get(SECTION, 0.0), 1.0, configured.get(LEXICAL, 0.0))
    lexical = (here[2], *(w for w in LEXICAL_WEIGHTS if w != here[2]))
    points = ((c, s, b) for c in SECTION_WEIGHTS for s in IDENTITY_SCALES for b in lexical)
    return [here, *(p for p in points if p != here)]


@dataclass(frozen=True)
class _Ranks:
    """Every case's reciprocal rank under the configured weights (``base``) and under each grid point's mixture
    (``of``), computed once: the choice, each fold's choice and the grid table read the same figures."""

    points: list[Point]
    base: list[float]
    of: dict[Point, list[float]]

    @classmethod
    def of_cases(cls, cases: Sequence[PseudoCase], configured: dict[str, float]) -> _Ranks:
        points = grid(configured)
        ranks = {p: [reciprocal_rank(c, mixture(configured, *p)) for c in cases] for p in points}
        return cls(points, [reciprocal_rank(c, configured) for c in cases], ranks)


def _best(ranks: _Ranks, rows: Sequence[int] | None = None) -> tuple[Point, list[float]]:
    """The grid point whose mixture is significantly better than the configured one (else the configured one), and
    its per-case reciprocal ranks, over the cases ``rows`` (every case when ``None``)."""

    def of(values: list[float]) -> list[float]:
        return values if rows is None else [values[i] for i in rows]

    points = ranks.points
    base = of(ranks.base)
    best, best_rr = points[0], base
    for point in points[1:]:
        rr = of(ranks.of[point])
        if sum(rr) > sum(best_rr) + 1e-9:
            best, best_rr = point, rr
    if best != points[0] and not _significant([b - a for a, b in zip(base, best_rr, strict=True)]):
        return points[0], base
    return best, best_rr


def _significant(gains: list[float]) -> bool:
    n = len(gains)
    if n < 2:
        return False
    mean = sum(gains) / n
    sd = math.sqrt(sum((g - mean) ** 2 for g in gains) / (n - 1))
    return mean > NOISE_SE * sd / math.sqrt(n)


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return round(sum(values) / len(values), 4) if values else 0.0


def choose(
    cases: Sequence[PseudoCase], configured: dict[str, float], *, index_version: str, min_queries: int
) -> RankFit:
    """The mixture the pseudo-queries choose (see the module doc); the configured weights when too few."""
    n = len(cases)
    here = grid(configured)[0]
    if n < min_queries:
        reason = f"kept: {n} pseudo-queries, fewer than {min_queries}"
        return RankFit(index_version, dict(configured), here[0], 1.0, n, reason)
    ranks = _Ranks.of_cases(cases, configured)
    base = ranks.base
    chosen, rr = _best(ranks)
    # Cross-validation by query: choose on the other folds, score the held-out one.
    held = [0.0] * n
    for fold in range(FOLDS):
        point, _ = _best(ranks, [i for i in range(n) if i % FOLDS != fold])
        for i in range(fold, n, FOLDS):
            held[i] = ranks.of[point][i]  # the point's mixture, the configured point's too (as the table's)
    table = [{"section": c, "identity": s, "lexical": b, "mrr": _mean(ranks.of[(c, s, b)])} for c, s, b in ranks.points]
    kept = chosen == here
    reason = f"kept: the gain is within the noise ({n} pseudo-queries)" if kept else f"fitted on {n} pseudo-queries"
    section, scale, lexical = chosen
    return RankFit(
        index_version=index_version,
        weights=dict(configured) if kept else mixture(configured, *chosen),
        section_weight=section,
        identity_scale=scale,
        lexical_weight=None if kept else lexical,
        queries=n,
        reason=reason,
        mrr_configured=_mean(base),
        mrr_fitted=_mean(rr),
        cv_mrr_configured=_mean(base),
        cv_mrr_fitted=_mean(held),
        grid=table,
    )


def fit_path(state_dir: Path, index_version: str) -> Path:
    """Where the fit of ``index_version`` is kept (the version's ``:`` made a file-name character everywhere)."""
    return state_dir / "rank-fit" / f"{index_version.replace(':', '-')}.json"


def store_fit(state_dir: Path, fit: RankFit) -> Path:
    """Write ``fit`` for its index version (atomically: a reader sees the old file or the new one)."""
    path = fit_path(state_dir, fit.index_version)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A temporary file of its own (atomic_write): processes storing the same fit at once never share one.
    with atomic_write(path, mode="w", encoding="utf-8") as handle:
        handle.write(json.dumps(asdict(fit), indent=1, sort_keys=True) + "\n")
    return path


def load_fit(state_dir: Path, index_version: str, taught_under: dict[str, float] | None = None) -> RankFit | None:
    """The fit stored for ``index_version``; ``None`` when there is none, it cannot be read, or (``taught_under``
    given) it was taught under other inputs (``ScoringProfile.fit_inputs``: a changed profile teaches again)."""
    path = fit_path(state_dir, index_version)
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FIT_FORMAT:  # chosen on another grid: taught again
            return None
        fit = RankFit(**data)
    except (OSError, ValueError, TypeError):
        return None
    return fit if taught_under is None or fit.taught_under == taught_under else None
