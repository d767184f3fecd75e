from __future__ import annotations

import math
from pathlib import Path

import pytest

from kb_retrieval.evaluation import (
    classify_case,
    compute_metrics,
    evaluate,
    score_names,
)
from kb_retrieval.evaluation.metrics import failed_thresholds, normalise_ks

from .factories import make_candidate, make_case, make_fixture

pytestmark = pytest.mark.unit


def test_mrr_and_ndcg_for_ranks_one_two_and_absent() -> None:
    cases = [make_case(case_id=f"c{i}") for i in range(3)]
    fixtures = [
        make_fixture([make_candidate(1, "a.md")], case_id="c0"),
        make_fixture([make_candidate(1, "x.md"), make_candidate(2, "a.md")], case_id="c1"),
        make_fixture([make_candidate(1, "x.md")], case_id="c2"),
    ]
    results = [classify_case(case, fixture) for case, fixture in zip(cases, fixtures, strict=True)]

    overall, _ = compute_metrics(cases, results, ks=[1, 2])

    assert overall.scores["mrr@10"] == 0.5  # (1 + 1/2 + 0) / 3
    assert overall.scores["ndcg@10"] == round((1 + 1 / math.log2(3)) / 3, 4)  # single relevant doc, grade 2
    assert overall.scores["recall@1"] == round(1 / 3, 4)
    assert overall.scores["recall@2"] == round(2 / 3, 4)
    assert overall.avg_first_hit_rank == 1.5


def test_graded_relevance_in_ndcg() -> None:
    case = make_case(expected_docs=["a.md"], acceptable_docs=["b.md"])
    fixture = make_fixture([make_candidate(1, "x.md"), make_candidate(2, "b.md")])

    overall, _ = compute_metrics([case], [classify_case(case, fixture)])

    # DCG = 1/log2(3); ideal = 2/log2(2) + 1/log2(3).
    ideal = 2 + 1 / math.log2(3)
    assert overall.scores["ndcg@10"] == round((1 / math.log2(3)) / ideal, 4)
    assert overall.scores["mrr@10"] == 0.5


def test_hits_beyond_the_cutoff_do_not_count_in_mrr() -> None:
    case = make_case()
    candidates = [make_candidate(rank, f"x{rank}.md") for rank in range(1, 11)] + [make_candidate(11, "a.md")]

    overall, _ = compute_metrics([case], [classify_case(case, make_fixture(candidates))], ks=[10, 20])

    assert overall.scores["mrr@10"] == 0.0
    assert overall.scores["recall@10"] == 0.0
    assert overall.scores["recall@20"] == 1.0
    # Past the hit cut-off (rank 5) the case is a miss, as `compare` calls it (issue 41: one definition).
    assert overall.miss == 1 and overall.avg_first_hit_rank is None


def test_data_set_against_hand_computed_values(golden_path: Path, fixtures_dir: Path) -> None:
    report = evaluate(golden_path, fixtures_dir)
    overall, aiops, chat = report.overall, report.by_scenario["aiops"], report.by_scenario["chat"]

    counts = ("case_count", "not_run", "answerable", "strong", "medium", "miss", "no_answer", "no_answer_correct")
    assert [getattr(overall, name) for name in counts] == [9, 2, 5, 2, 1, 2, 2, 1]
    assert [getattr(aiops, name) for name in counts] == [5, 1, 3, 1, 1, 1, 1, 0]
    assert [getattr(chat, name) for name in counts] == [4, 1, 2, 1, 0, 1, 1, 1]
    # Answerable ranks: 1 (chat), 2 and 3 (aiops), two misses.
    ndcg_rank2_graded = (1 / math.log2(3)) / (2 + 1 / math.log2(3))  # acceptable doc (grade 1) at rank 2
    assert overall.scores == {
        "recall@1": 0.2,
        "recall@3": 0.6,
        "recall@5": 0.6,
        "recall@10": 0.6,
        "mrr@10": round((1 + 1 / 2 + 1 / 3) / 5, 4),
        "ndcg@10": round((1 + ndcg_rank2_graded + 0.5) / 5, 4),
        "strong_rate": 0.4,
        "no_answer_accuracy": 0.5,
        "fixture_coverage": round(7 / 9, 4),
    }
    assert overall.avg_first_hit_rank == 2.0
    assert aiops.scores["mrr@10"] == round((1 / 2 + 1 / 3) / 3, 4)
    assert aiops.scores["recall@1"] == 0.0
    assert aiops.avg_first_hit_rank == 2.5
    assert chat.scores["ndcg@10"] == 0.5
    assert chat.scores["no_answer_accuracy"] == 1.0


def test_rates_without_a_denominator_are_none() -> None:
    case = make_case(expected_docs=[])
    overall, by_scenario = compute_metrics([case], [classify_case(case, make_fixture([], found=False))])

    assert overall.answerable == 0
    assert overall.scores["recall@1"] is None
    assert overall.scores["mrr@10"] is None
    assert overall.avg_first_hit_rank is None
    assert overall.scores["no_answer_accuracy"] == 1.0
    assert list(by_scenario) == ["chat"]


def test_all_cases_not_run() -> None:
    case = make_case()
    overall, _ = compute_metrics([case], [classify_case(case, None)])

    assert (overall.not_run, overall.scores["fixture_coverage"], overall.scores["strong_rate"]) == (1, 0.0, None)


def test_answerable_cases_that_retrieved_nothing_score_zero() -> None:
    cases = [make_case(case_id="c0"), make_case(case_id="c1")]
    results = [classify_case(c, make_fixture([], found=False, case_id=c.case_id)) for c in cases]

    overall, _ = compute_metrics(cases, results)

    assert (overall.scores["mrr@10"], overall.scores["ndcg@10"], overall.miss) == (0.0, 0.0, 2)


def test_score_names_and_ks() -> None:
    assert score_names(normalise_ks([5, 1, 5])) == [
        "recall@1",
        "recall@5",
        "mrr@10",
        "ndcg@10",
        "strong_rate",
        "no_answer_accuracy",
        "fixture_coverage",
    ]
    with pytest.raises(ValueError, match="positive integers"):
        normalise_ks([0])
    with pytest.raises(ValueError, match="positive integers"):
        normalise_ks([])


def test_failed_thresholds(golden_path: Path, fixtures_dir: Path) -> None:
    overall = evaluate(golden_path, fixtures_dir).overall

    assert failed_thresholds(overall, [("recall@3", 0.6), ("mrr@10", 0.3)]) == []
    assert failed_thresholds(overall, [("recall@5", 0.8)]) == ["recall@5 = 0.6000 is below 0.8"]
