"""Small builders for golden cases and fixtures, to pin down evaluator logic case by case."""

from __future__ import annotations

from kb_retrieval.evaluation import Fixture, FixtureCandidate, GoldenCase


def make_case(**fields: object) -> GoldenCase:
    """A golden case with defaults for everything not given."""
    defaults: dict[str, object] = {"case_id": "c1", "scenario": "chat", "query": "q", "expected_docs": ["a.md"]}
    return GoldenCase.model_validate({**defaults, **fields})


def make_candidate(rank: int, source: str, **fields: object) -> FixtureCandidate:
    defaults: dict[str, object] = {"score_label": "cosine_similarity", "score": 1.0 / rank, "content": ""}
    return FixtureCandidate.model_validate({"rank": rank, "source": source, **defaults, **fields})


def make_fixture(
    candidates: list[FixtureCandidate],
    *,
    found: bool = True,
    status: str = "ok",
    evidence: list[str] | None = None,
    case_id: str = "c1",
    query: str = "q",
) -> Fixture:
    blocks = [{"source": "x.md", "content": text} for text in evidence or []]
    return Fixture(
        case_id=case_id,
        query=query,
        candidates=candidates,
        result={"found": found, "evidenceStatus": status, "evidenceBlocks": blocks},
    )
