"""``eval`` and ``compare`` call every case by the same hit level: one classifier, one rank cut-off.

The shared fixture is the committed sample-KB recording: ``eval`` reads each case's fixture as it is; ``compare``
gets the same lookup (the fixture's result and ranking) through :func:`sidecar.comparison.compare_case`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kb_retrieval.evaluation.fixtures import Fixture, FixtureCandidate, load_fixture
from kb_retrieval.evaluation.golden import GoldenCase, load_golden
from kb_retrieval.evaluation.hit_levels import HIT_RANK_CUTOFF, classify_case
from kb_retrieval.models import Candidate, LookupResult, ScoreLabel
from sidecar.comparison import compare_case
from sidecar.models import DEFAULT_K, disabled_run

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "golden" / "sample-kb.jsonl"
FIXTURES = REPO / "golden" / "fixtures" / "sample-kb"


def _lookup_of(fixture: Fixture) -> tuple[LookupResult, list[Candidate]]:
    """The lookup the fixture froze, as ``compare`` receives it from the engine."""
    result = LookupResult.model_validate(fixture.result)
    ranking = [
        Candidate(
            chunk_id=f"{c.source}#{c.rank}",
            source=c.source,
            title=c.title,
            breadcrumb=c.breadcrumb,
            category=c.category,
            content=c.content,
            score=c.score,
            score_label=ScoreLabel(c.score_label),
            path=c.path or "sdk",  # type: ignore[arg-type]
            similarity=c.similarity if c.similarity is not None else 0.0,
        )
        for c in fixture.candidates
    ]
    return result, ranking


def _agreeing(case: GoldenCase, fixture: Fixture) -> tuple[str, str]:
    eval_level = classify_case(case, fixture)
    result, ranking = _lookup_of(fixture)
    compared = compare_case(case, result, ranking, disabled_run(), DEFAULT_K)
    assert compared.current.first_expected_rank == eval_level.first_expected_rank, case.case_id
    return eval_level.status, compared.current.hit_level


def test_one_cut_off():
    assert DEFAULT_K == HIT_RANK_CUTOFF


def test_eval_and_compare_agree_case_by_case_on_the_sample_fixtures():
    cases = load_golden(GOLDEN)
    pairs = {}
    for case in cases:
        fixture = load_fixture(FIXTURES, case.case_id)
        assert fixture is not None, case.case_id
        pairs[case.case_id] = _agreeing(case, fixture)
    disagreements = {case_id: pair for case_id, pair in pairs.items() if pair[0] != pair[1]}
    assert not disagreements
    assert {level for level, _ in pairs.values()} >= {"strong", "no_answer_correct"}  # the fixture is not trivial


@pytest.mark.parametrize(
    ("rank", "level"), [(1, "strong"), (HIT_RANK_CUTOFF, "strong"), (HIT_RANK_CUTOFF + 10, "miss")]
)
def test_a_relevant_document_below_the_cut_off_is_a_miss_for_both(rank: int, level: str):
    case = GoldenCase(case_id="c1", scenario="chat", query="disk full", expected_docs=["wanted.md"])
    candidates = [
        FixtureCandidate(
            rank=r,
            source="wanted.md" if r == rank else f"other-{r}.md",
            score_label="cosine_similarity",
            score=1.0 - r / 100,
            similarity=1.0 - r / 100,
            path="sdk",
            content="text",
        )
        for r in range(1, rank + 1)
    ]
    fixture = Fixture(
        case_id="c1",
        query="disk full",
        candidates=candidates,
        result=_result_json([c.source for c in candidates[:3]]),
    )
    assert _agreeing(case, fixture) == (level, level)
    if level == "miss":
        assert classify_case(case, fixture).failed_checks[0] == (
            f"expected doc at rank {rank}, below the hit cut-off {HIT_RANK_CUTOFF}"
        )


def _result_json(sources: list[str]) -> dict:
    blocks = [
        {"source": s, "content": "text", "retrievalLayer": "L1", "score": 0.9, "similarity": 0.9} for s in sources
    ]
    return {
        "found": True,
        "evidenceStatus": "ok",
        "message": "Found",
        "evidenceBlocks": blocks,
        "contextPack": {
            "blocks": [{"source": s, "content": "text"} for s in sources],
            "summary": {"budgetTokens": 100, "usedTokens": 10, "includedSources": sources},
        },
        "queryTransform": {"originalQuery": "disk full", "normalizedQuery": "disk full", "filterReason": "none"},
        "retrievalTrace": {},
        "rerankTrace": {},
        "relevanceLevel": "high",
        "completenessHint": "multiple_sources",
        "retrievalLayer": "L1",
    }
