from __future__ import annotations

from pathlib import Path

import pytest

from kb_retrieval.evaluation import Fixture, classify_case, load_fixture, load_golden

from .factories import make_candidate, make_case, make_fixture

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("case_id", "status", "rank", "checks"),
    [
        ("chat-strong-breadcrumb", "strong", 1, []),
        ("aiops-strong-keywords", "strong", 2, []),
        ("aiops-medium", "medium", 3, ["breadcrumb 'Cleanup' not found", "keyword 'du -sh' not found"]),
        ("chat-miss", "miss", None, ["expected doc not retrieved"]),
        (
            "aiops-miss-withheld",
            "miss",
            None,
            ["expected doc not retrieved", "lookup returned found=false (expected doc withheld at rank 2)"],
        ),
        ("chat-no-answer-correct", "no_answer_correct", None, []),
        (
            "aiops-no-answer-wrong",
            "no_answer_wrong",
            None,
            ["answered found=true (evidenceStatus 'ok') for a no-answer case"],
        ),
        (
            "chat/missing fixture",
            "not_run",
            None,
            ["no fixture file chat_missing_fixture~c77bdfea602a.json in fixtures dir"],
        ),
        (
            "aiops-stale",
            "not_run",
            None,
            ["fixture aiops-stale.json was recorded for a different query (stale: re-record it)"],
        ),
    ],
)
def test_data_cases(
    golden_path: Path, fixtures_dir: Path, case_id: str, status: str, rank: int | None, checks: list[str]
) -> None:
    case = next(case for case in load_golden(golden_path) if case.case_id == case_id)

    result = classify_case(case, load_fixture(fixtures_dir, case_id))

    assert (result.status, result.first_expected_rank, result.failed_checks) == (status, rank, checks)
    assert result.scenario == case.scenario


def test_strong_by_breadcrumb_is_case_insensitive_substring() -> None:
    case = make_case(expected_breadcrumbs=["MITIGATION"])
    fixture = make_fixture([make_candidate(1, "a.md", breadcrumb="Redis memory > Mitigation steps")])

    assert classify_case(case, fixture).status == "strong"


def test_breadcrumb_may_match_the_title() -> None:
    case = make_case(expected_breadcrumbs=["RedisMemoryHigh"])
    fixture = make_fixture([make_candidate(1, "a.md", title="RedisMemoryHigh", breadcrumb="Overview")])

    assert classify_case(case, fixture).status == "strong"


def test_breadcrumb_of_an_irrelevant_candidate_does_not_count() -> None:
    case = make_case(expected_breadcrumbs=["Mitigation"])
    fixture = make_fixture(
        [make_candidate(1, "other.md", breadcrumb="X > Mitigation"), make_candidate(2, "a.md", breadcrumb="A")]
    )

    result = classify_case(case, fixture)

    assert (result.status, result.failed_checks) == ("medium", ["breadcrumb 'Mitigation' not found"])


def test_any_one_breadcrumb_is_enough() -> None:
    case = make_case(expected_breadcrumbs=["Absent", "Mitigation"])
    fixture = make_fixture([make_candidate(1, "a.md", breadcrumb="A > Mitigation")])

    assert classify_case(case, fixture).status == "strong"


def test_breadcrumb_tied_to_a_document_needs_that_document() -> None:
    crumb = {"heading": "Batch jobs", "doc": "b.md"}
    case = make_case(expected_docs=["a.md", "b.md"], expected_breadcrumbs=[crumb])
    elsewhere = make_fixture([make_candidate(1, "a.md", breadcrumb="Batch jobs"), make_candidate(2, "b.md")])
    there = make_fixture([make_candidate(1, "a.md"), make_candidate(2, "b.md", breadcrumb="Practices > Batch jobs")])

    assert classify_case(case, elsewhere).failed_checks == ["breadcrumb 'Batch jobs' in b.md not found"]
    assert classify_case(case, there).status == "strong"


def test_every_keyword_is_needed() -> None:
    case = make_case(expected_keywords=["maxmemory", "evict"])
    fixture = make_fixture([make_candidate(1, "a.md", content="Set MAXMEMORY.")])

    result = classify_case(case, fixture)

    assert (result.status, result.failed_checks) == ("medium", ["keyword 'evict' not found"])


def test_keywords_may_come_from_evidence_blocks() -> None:
    case = make_case(expected_keywords=["maxmemory", "evict"])
    fixture = make_fixture([make_candidate(1, "a.md", content="Set maxmemory.")], evidence=["Evict keys."])

    assert classify_case(case, fixture).status == "strong"


def test_keyword_in_an_irrelevant_candidate_does_not_count() -> None:
    case = make_case(expected_keywords=["maxmemory"])
    fixture = make_fixture([make_candidate(1, "other.md", content="maxmemory"), make_candidate(2, "a.md")])

    assert classify_case(case, fixture).status == "medium"


def test_keywords_cover_when_breadcrumbs_do_not() -> None:
    case = make_case(expected_breadcrumbs=["Mitigation"], expected_keywords=["maxmemory"])
    fixture = make_fixture([make_candidate(1, "a.md", breadcrumb="Symptoms", content="maxmemory")])

    assert classify_case(case, fixture).status == "strong"


def test_without_keywords_or_breadcrumbs_coverage_is_vacuous() -> None:
    fixture = make_fixture([make_candidate(1, "x.md"), make_candidate(2, "a.md")])

    result = classify_case(make_case(), fixture)

    assert (result.status, result.first_expected_rank, result.failed_checks) == ("strong", 2, [])


def test_acceptable_doc_counts_as_a_hit() -> None:
    case = make_case(expected_docs=["a.md"], acceptable_docs=["b.md"])
    fixture = make_fixture([make_candidate(1, "x.md"), make_candidate(2, "b.md"), make_candidate(3, "a.md")])

    assert classify_case(case, fixture).first_expected_rank == 2


def test_acceptable_only_case_is_answerable() -> None:
    case = make_case(expected_docs=[], acceptable_docs=["b.md"])

    assert classify_case(case, make_fixture([make_candidate(1, "x.md")])).status == "miss"


def test_found_false_retrieves_nothing() -> None:
    fixture = make_fixture([make_candidate(1, "a.md")], found=False, status="no_evidence")

    result = classify_case(make_case(), fixture)

    assert result.status == "miss"
    assert result.top_candidates == [] and result.ranking == []
    assert result.failed_checks[-1] == "lookup returned found=false (expected doc withheld at rank 1)"


def test_found_true_with_no_candidates_is_a_miss() -> None:
    result = classify_case(make_case(), make_fixture([]))

    assert (result.status, result.failed_checks) == ("miss", ["expected doc not retrieved"])


@pytest.mark.parametrize(
    ("found", "status", "expected"),
    [
        (False, "no_evidence", "no_answer_correct"),
        (True, "no_evidence", "no_answer_correct"),
        (False, "ok", "no_answer_correct"),
        (True, "ok", "no_answer_wrong"),
        (True, "weak", "no_answer_wrong"),
    ],
)
def test_no_answer_cases(found: bool, status: str, expected: str) -> None:
    case = make_case(expected_docs=[])
    fixture = make_fixture([make_candidate(1, "x.md")], found=found, status=status)

    result = classify_case(case, fixture)

    assert result.status == expected
    assert result.first_expected_rank is None


def test_top_candidates_are_the_first_five_labels() -> None:
    candidates = [make_candidate(rank, f"d{rank}.md", breadcrumb=f"H{rank}") for rank in range(1, 8)]

    result = classify_case(make_case(), make_fixture(candidates))

    assert result.top_candidates == [f"d{rank}.md > H{rank}" for rank in range(1, 6)]
    assert result.ranking == [f"d{rank}.md" for rank in range(1, 8)]


def _received(*sources: str, pack: list[str] | None = None, found: bool = True) -> Fixture:
    result: dict[str, object] = {
        "found": found,
        "evidenceBlocks": [{"source": source, "content": ""} for source in sources],
    }
    if pack is not None:
        result["contextPack"] = {"blocks": [{"source": source, "content": ""} for source in pack]}
    candidates = [make_candidate(rank, f"{name}.md") for rank, name in enumerate("abcd", start=1)]
    return Fixture(case_id="c1", query="q", candidates=candidates, result=result)


def test_candidates_the_agent_never_received_are_listed() -> None:
    case = make_case()

    # Below the evidence threshold: not an evidence block.
    assert classify_case(case, _received("a.md", "c.md")).not_in_evidence == ["b.md", "d.md"]
    # Left out of the context pack (token budget): the pack, not the evidence blocks, is what the agent reads.
    assert classify_case(case, _received("a.md", "b.md", "c.md", pack=["a.md"])).not_in_evidence == [
        "b.md",
        "c.md",
        "d.md",
    ]
    assert classify_case(case, _received("a.md", "b.md", "c.md", "d.md")).not_in_evidence == []


def test_received_sources_unknown_or_none() -> None:
    unknown = Fixture(
        case_id="c1",
        query="q",
        candidates=[make_candidate(1, "a.md")],
        result={"found": True, "evidenceBlocks": [{"content": "no source recorded"}]},
    )
    assert unknown.received_sources is None
    assert classify_case(make_case(), unknown).not_in_evidence == []  # nothing can be said: no mark
    assert _received("a.md", found=False).received_sources == []
