"""Aggregate retrieval metrics over case results, overall and per scenario.

Every rate is computed over the cases that were run; ``not_run`` cases are only counted (see
``fixture_coverage``). Denominators:

- ``recall@K``, ``strong_rate``, ``mrr@10``, ``ndcg@10``: answerable run cases (``strong + medium + miss``).
  ``recall@K`` is the share of them with a relevant document at rank <= K (a hit rate: one relevant
  document is enough).
- ``no_answer_accuracy``: run no-answer cases.
- ``fixture_coverage``: all golden cases.

MRR and nDCG use graded relevance (expected 2, acceptable 1) over the ranking as the pipeline returned it:
:func:`reciprocal_rank` and :func:`ndcg` below, a few lines each, pinned against ``ranx`` by the tests (ranx is a
development dependency only: it compiles with numba on first import, ~30 s, too slow for a command). Floats are
rounded to :data:`DECIMALS` places so reports are stable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from statistics import fmean

from pydantic import BaseModel, ConfigDict

from kb_retrieval.evaluation.golden import GoldenCase
from kb_retrieval.evaluation.hit_levels import CaseResult

#: Default cut-offs for ``recall@K``.
DEFAULT_KS: tuple[int, ...] = (1, 3, 5, 10)
#: Cut-off of the ranking metrics (MRR, nDCG).
RANKING_CUTOFF = 10
#: Decimal places kept in every reported float.
DECIMALS = 4

_RANKING_METRICS = (f"mrr@{RANKING_CUTOFF}", f"ndcg@{RANKING_CUTOFF}")


class MetricSet(BaseModel):
    """Counts and rates for one group of cases (all cases, or one scenario).

    ``scores`` holds every rate under the name ``--fail-under`` accepts, e.g. ``recall@5`` or ``mrr@10``;
    a rate is None when its denominator is zero.
    """

    model_config = ConfigDict(frozen=True)

    case_count: int
    not_run: int
    answerable: int
    """Run cases with relevant documents: ``strong + medium + miss``."""
    strong: int
    medium: int
    miss: int
    no_answer: int
    """Run cases with no relevant documents."""
    no_answer_correct: int
    avg_first_hit_rank: float | None
    """Mean rank of the first relevant document over answerable cases that retrieved one."""
    scores: dict[str, float | None]


def score_names(ks: Iterable[int]) -> list[str]:
    """Names of the rates in :attr:`MetricSet.scores`, in report order.

    Example:
        >>> score_names([1, 5])
        ['recall@1', 'recall@5', 'mrr@10', 'ndcg@10', 'strong_rate', 'no_answer_accuracy', 'fixture_coverage']
    """
    return [
        *(f"recall@{k}" for k in ks),
        *_RANKING_METRICS,
        "strong_rate",
        "no_answer_accuracy",
        "fixture_coverage",
    ]


def normalise_ks(ks: Iterable[int]) -> tuple[int, ...]:
    """Sorted, de-duplicated cut-offs.

    Raises:
        ValueError: A cut-off is not a positive integer, or none is given.
    """
    given = list(ks)
    if not given or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in given):
        raise ValueError(f"K values must be positive integers, got {given}")
    return tuple(sorted(set(given)))


def compute_metrics(
    cases: Sequence[GoldenCase], results: Sequence[CaseResult], ks: Iterable[int] = DEFAULT_KS
) -> tuple[MetricSet, dict[str, MetricSet]]:
    """Aggregate case results overall and per scenario.

    Args:
        cases: The golden cases.
        results: Their results (same case ids; order does not matter).
        ks: Cut-offs for ``recall@K``.

    Returns:
        The overall metrics and the metrics of each scenario (keys sorted).
    """
    ks = normalise_ks(ks)
    per_case = ranking_scores(cases, results)
    overall = _aggregate(results, per_case, ks)
    scenarios = sorted({result.scenario for result in results})
    by_scenario = {
        scenario: _aggregate([r for r in results if r.scenario == scenario], per_case, ks) for scenario in scenarios
    }
    return overall, by_scenario


def ranking_scores(cases: Sequence[GoldenCase], results: Sequence[CaseResult]) -> dict[str, dict[str, float]]:
    """Per-case MRR@10 and nDCG@10 of the answerable run cases (a case that retrieved nothing scores 0).

    Args:
        cases: The golden cases (their relevance grades).
        results: The case results (their retrieved rankings).

    Returns:
        ``{case_id: {"mrr@10": ..., "ndcg@10": ...}}`` (unrounded).
    """
    relevance = {case.case_id: case.relevance() for case in cases}
    return {
        result.case_id: {
            f"mrr@{RANKING_CUTOFF}": reciprocal_rank(result.ranking, relevance[result.case_id], RANKING_CUTOFF),
            f"ndcg@{RANKING_CUTOFF}": ndcg(result.ranking, relevance[result.case_id], RANKING_CUTOFF),
        }
        for result in results
        if result.is_answerable_run
    }


def reciprocal_rank(ranking: Sequence[str], relevance: Mapping[str, int], cutoff: int) -> float:
    """``1 / rank`` of the first relevant document within the first ``cutoff`` ranks, else 0.

    Example:
        >>> reciprocal_rank(["x.md", "a.md"], {"a.md": 2}, cutoff=10)
        0.5

    Args:
        ranking: Retrieved document ids, best first (each at most once).
        relevance: Relevance grade per document id; a grade above 0 is relevant.
        cutoff: Ranks considered (``@K``).
    """
    for rank, doc in enumerate(ranking[:cutoff], start=1):
        if relevance.get(doc, 0) > 0:
            return 1.0 / rank
    return 0.0


def ndcg(ranking: Sequence[str], relevance: Mapping[str, int], cutoff: int) -> float:
    """Normalised discounted cumulative gain at ``cutoff``: linear gains, ``log2(rank + 1)`` discount.

    The gain of a document is its relevance grade (Järvelin & Kekäläinen, 2002; ranx's ``ndcg``); the ideal
    ranking lists the relevant documents by grade. 0 when nothing is relevant.

    Example:
        >>> round(ndcg(["x.md", "b.md"], {"a.md": 2, "b.md": 1}, cutoff=10), 4)
        0.2398

    Args:
        ranking: Retrieved document ids, best first (each at most once).
        relevance: Relevance grade per document id; a grade above 0 is relevant.
        cutoff: Ranks considered (``@K``).
    """
    gains = [relevance.get(doc, 0) for doc in ranking[:cutoff]]
    ideal = sorted((grade for grade in relevance.values() if grade > 0), reverse=True)[:cutoff]
    ideal_dcg = _dcg(ideal)
    return _dcg([max(gain, 0) for gain in gains]) / ideal_dcg if ideal_dcg > 0 else 0.0


def _dcg(gains: Sequence[int]) -> float:
    return sum(gain / math.log2(rank + 1) for rank, gain in enumerate(gains, start=1))


def failed_thresholds(metrics: MetricSet, thresholds: Iterable[tuple[str, float]]) -> list[str]:
    """Check ``--fail-under`` thresholds against a metric set.

    A rate passes when it is at least its threshold; a rate that could not be computed (None) fails.

    Args:
        metrics: Usually the overall metrics.
        thresholds: ``(name, minimum)`` pairs; every name must be in ``metrics.scores``.

    Returns:
        One message per failed threshold, e.g. ``recall@5 = 0.6667 is below 0.8``.

    Raises:
        KeyError: A name is not a known rate.
    """
    failures = []
    for name, minimum in thresholds:
        value = metrics.scores[name]
        if value is None:
            failures.append(f"{name} is not available (no cases to compute it on), required >= {minimum:g}")
        elif value < minimum:
            failures.append(f"{name} = {value:.4f} is below {minimum:g}")
    return failures


def _aggregate(results: Sequence[CaseResult], per_case: dict[str, dict[str, float]], ks: tuple[int, ...]) -> MetricSet:
    statuses = [result.status for result in results]
    answerable = [result for result in results if result.is_answerable_run]
    no_answer = statuses.count("no_answer_correct") + statuses.count("no_answer_wrong")
    first_ranks = [r.first_expected_rank for r in answerable if r.first_expected_rank is not None]
    # recall@K reads the whole ranking (a K past the hit cut-off still counts); hit levels stop at the cut-off.
    relevant_ranks = [r.first_relevant_rank for r in answerable if r.first_relevant_rank is not None]

    scores: dict[str, float | None] = {
        f"recall@{k}": _share(sum(rank <= k for rank in relevant_ranks), len(answerable)) for k in ks
    }
    for metric in _RANKING_METRICS:
        values = [per_case[result.case_id][metric] for result in answerable]
        scores[metric] = _round(fmean(values)) if values else None
    scores["strong_rate"] = _share(statuses.count("strong"), len(answerable))
    scores["no_answer_accuracy"] = _share(statuses.count("no_answer_correct"), no_answer)
    scores["fixture_coverage"] = _share(len(results) - statuses.count("not_run"), len(results))

    return MetricSet(
        case_count=len(results),
        not_run=statuses.count("not_run"),
        answerable=len(answerable),
        strong=statuses.count("strong"),
        medium=statuses.count("medium"),
        miss=statuses.count("miss"),
        no_answer=no_answer,
        no_answer_correct=statuses.count("no_answer_correct"),
        avg_first_hit_rank=_round(fmean(first_ranks)) if first_ranks else None,
        scores=scores,
    )


def _share(count: int, total: int) -> float | None:
    return _round(count / total) if total else None


def _round(value: float) -> float:
    return round(value, DECIMALS)
