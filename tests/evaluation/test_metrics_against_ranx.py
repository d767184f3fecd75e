"""Our MRR, nDCG and recall pinned against ranx (an independent implementation) on the same inputs.

ranx is a development dependency only: the shipped ``eval`` command computes the metrics itself
(:mod:`kb_retrieval.evaluation.metrics`), so it starts in a second instead of compiling ranx's numba kernels.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kb_retrieval.evaluation import classify_case, evaluate, load_fixture, load_golden
from kb_retrieval.evaluation.metrics import RANKING_CUTOFF, ndcg, ranking_scores, reciprocal_rank

ranx = pytest.importorskip("ranx")  # dev extra; `make test` installs it
REPO = Path(__file__).resolve().parents[2]
DOCS = [f"d{i}.md" for i in range(12)]


def _ranx_scores(qrels: dict[str, dict[str, int]], rankings: dict[str, list[str]], metrics: list[str]) -> dict:
    """Per-query scores from ranx, each ranking scored ``1 / rank`` so ranx keeps its order."""
    run = {q: {doc: 1.0 / rank for rank, doc in enumerate(ranking, start=1)} for q, ranking in rankings.items()}
    ranx_run = ranx.Run.from_dict({q: docs for q, docs in run.items() if docs}) if any(run.values()) else ranx.Run()
    ranx.evaluate(ranx.Qrels.from_dict(qrels), ranx_run, metrics, make_comparable=True)
    return {metric: {q: float(ranx_run.scores[metric][q]) for q in qrels} for metric in metrics}


queries = st.dictionaries(
    keys=st.sampled_from([f"q{i}" for i in range(6)]),
    values=st.tuples(
        st.dictionaries(st.sampled_from(DOCS), st.integers(min_value=1, max_value=3), min_size=1, max_size=5),
        st.lists(st.sampled_from(DOCS), unique=True, max_size=12),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=150, deadline=None)
@given(queries=queries, cutoff=st.sampled_from([1, 3, 5, 10]))
def test_mrr_and_ndcg_match_ranx(queries: dict[str, tuple[dict[str, int], list[str]]], cutoff: int) -> None:
    qrels = {q: relevance for q, (relevance, _) in queries.items()}
    rankings = {q: ranking for q, (_, ranking) in queries.items()}

    expected = _ranx_scores(qrels, rankings, [f"mrr@{cutoff}", f"ndcg@{cutoff}"])

    for q in queries:
        assert reciprocal_rank(rankings[q], qrels[q], cutoff) == pytest.approx(expected[f"mrr@{cutoff}"][q], abs=1e-12)
        assert ndcg(rankings[q], qrels[q], cutoff) == pytest.approx(expected[f"ndcg@{cutoff}"][q], abs=1e-12)


def test_per_case_scores_of_the_committed_golden_set_match_ranx() -> None:
    golden, fixtures = REPO / "golden" / "sample-kb.jsonl", REPO / "golden" / "fixtures" / "sample-kb"
    cases = load_golden(golden)
    results = [classify_case(case, load_fixture(fixtures, case.case_id)) for case in cases]
    answerable = [r for r in results if r.is_answerable_run]
    metrics = [f"mrr@{RANKING_CUTOFF}", f"ndcg@{RANKING_CUTOFF}"]

    expected = _ranx_scores(
        {r.case_id: next(c for c in cases if c.case_id == r.case_id).relevance() for r in answerable},
        {r.case_id: r.ranking for r in answerable},
        metrics,
    )
    ours = ranking_scores(cases, results)

    assert sorted(ours) == sorted(r.case_id for r in answerable)
    assert any(ours[case_id][metrics[1]] < 1.0 for case_id in ours)  # graded relevance at work, not all perfect
    for metric in metrics:
        for case_id, value in ours.items():
            assert value[metric] == pytest.approx(expected[metric][case_id], abs=1e-12), (metric, case_id)


def test_recall_matches_ranx_hit_rate(golden_path: Path, fixtures_dir: Path) -> None:
    cases = load_golden(golden_path)
    report = evaluate(golden_path, fixtures_dir, ks=[1, 2, 3])
    results = [classify_case(case, load_fixture(fixtures_dir, case.case_id)) for case in cases]
    answerable = {r.case_id: r for r in results if r.is_answerable_run}

    expected = _ranx_scores(
        {c.case_id: c.relevance() for c in cases if c.case_id in answerable},
        {case_id: r.ranking for case_id, r in answerable.items()},
        ["hit_rate@1", "hit_rate@2", "hit_rate@3"],
    )

    for k in (1, 2, 3):
        mean = sum(expected[f"hit_rate@{k}"].values()) / len(answerable)
        assert report.overall.scores[f"recall@{k}"] == pytest.approx(mean, abs=1e-4)
