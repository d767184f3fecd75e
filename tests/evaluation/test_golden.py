from __future__ import annotations

import json
from pathlib import Path

import pytest

from kb_retrieval.evaluation import ExpectedBreadcrumb, GoldenCase, GoldenCaseError, load_golden

pytestmark = pytest.mark.unit

VALID = {
    "case_id": "c1",
    "scenario": "aiops",
    "query": "Redis memory high",
    "expected_docs": ["redis/memory.md"],
}


def write_lines(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "golden.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_loads_cases_in_file_order_skipping_blank_lines(golden_path: Path) -> None:
    cases = load_golden(golden_path)

    assert [case.case_id for case in cases][:3] == [
        "chat-strong-breadcrumb",
        "aiops-strong-keywords",
        "aiops-medium",
    ]
    assert len(cases) == 9


def test_list_fields_default_to_empty_and_extra_fields_are_kept(tmp_path: Path) -> None:
    extra = {"alert": {"alert_name": "RedisMemoryHigh"}, "provenance": "test", "tags": ["redis"]}
    path = write_lines(tmp_path, [json.dumps({**VALID, **extra})])

    (case,) = load_golden(path)

    assert case.acceptable_docs == case.expected_keywords == case.expected_breadcrumbs == []
    assert case.model_extra == extra


def test_no_answer_case_and_relevance_grades() -> None:
    case = GoldenCase(case_id="c", scenario="chat", query="q", expected_docs=["a"], acceptable_docs=["b"])
    empty = GoldenCase(case_id="d", scenario="chat", query="q")

    assert case.relevance() == {"a": 2, "b": 1}
    assert not case.is_no_answer
    assert empty.is_no_answer
    assert empty.relevance() == {}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"query": "   "}, "golden.jsonl:2: field 'query': must not be blank"),
        ({"scenario": ""}, "golden.jsonl:2: field 'scenario': must not be blank"),
        ({"case_id": None}, "golden.jsonl:2: field 'case_id': Input should be a valid string"),
        ({"expected_docs": "redis/memory.md"}, "golden.jsonl:2: field 'expected_docs': Input should be a valid list"),
        ({"expected_keywords": ["ok", " "]}, "golden.jsonl:2: field 'expected_keywords': item 1 must not be blank"),
        ({"acceptable_docs": ["redis/memory.md"]}, "is listed in both expected_docs and acceptable_docs"),
    ],
)
def test_bad_field_names_file_line_and_field(tmp_path: Path, change: dict[str, object], expected: str) -> None:
    path = write_lines(tmp_path, [json.dumps({**VALID, "case_id": "first"}), json.dumps({**VALID, **change})])

    with pytest.raises(GoldenCaseError) as error:
        load_golden(path)

    assert expected in str(error.value)
    assert str(error.value).startswith(f"{path}:2: ")


def test_missing_field_is_named(tmp_path: Path) -> None:
    line = {key: value for key, value in VALID.items() if key != "query"}
    path = write_lines(tmp_path, ["", json.dumps(line)])

    with pytest.raises(GoldenCaseError, match=r"golden\.jsonl:2: field 'query': is required"):
        load_golden(path)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"case_id": "c1",', r"golden\.jsonl:1: invalid JSON: .*\(column \d+\)"),
        ('["not", "an", "object"]', r"golden\.jsonl:1: expected a JSON object, got list"),
    ],
)
def test_unparseable_line_names_file_and_line(tmp_path: Path, line: str, expected: str) -> None:
    with pytest.raises(GoldenCaseError, match=expected):
        load_golden(write_lines(tmp_path, [line]))


def test_duplicate_case_id_names_both_lines(tmp_path: Path) -> None:
    path = write_lines(tmp_path, [json.dumps(VALID), "", json.dumps({**VALID, "query": "other"})])

    with pytest.raises(GoldenCaseError) as error:
        load_golden(path)

    assert str(error.value) == f"{path}:3: field 'case_id': duplicate case_id 'c1' (first defined on line 1)"


def test_byte_order_mark_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "golden.jsonl"
    path.write_text("\ufeff" + json.dumps(VALID) + "\n", encoding="utf-8")

    assert [case.case_id for case in load_golden(path)] == ["c1"]


def test_breadcrumbs_are_heading_strings_or_objects_tied_to_a_document(tmp_path: Path) -> None:
    crumb = {"doc": "docs/integrations.md", "anchor": "remote-endpoints", "heading": "Remote Endpoints"}
    path = write_lines(tmp_path, [json.dumps({**VALID, "expected_breadcrumbs": ["Mitigation", crumb]})])

    (case,) = load_golden(path)

    assert case.expected_breadcrumbs == [
        ExpectedBreadcrumb(heading="Mitigation"),
        ExpectedBreadcrumb(heading="Remote Endpoints", doc="docs/integrations.md", anchor="remote-endpoints"),
    ]


@pytest.mark.parametrize(
    ("crumbs", "expected"),
    [
        (["  "], "field 'expected_breadcrumbs.0.heading': must not be blank"),
        ([{"doc": "a.md"}], "field 'expected_breadcrumbs.0.heading': is required"),
        ([{"heading": "H", "page": "a.md"}], "field 'expected_breadcrumbs.0.page': Extra inputs are not permitted"),
        ([3], "field 'expected_breadcrumbs.0'"),
    ],
)
def test_bad_breadcrumb_is_named(tmp_path: Path, crumbs: list[object], expected: str) -> None:
    path = write_lines(tmp_path, [json.dumps({**VALID, "expected_breadcrumbs": crumbs})])

    with pytest.raises(GoldenCaseError) as error:
        load_golden(path)

    assert str(error.value).startswith(f"{path}:1: {expected}")
