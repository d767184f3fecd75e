from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kb_retrieval.evaluation import Fixture, FixtureError, fixture_filename, load_fixture, write_fixture
from kb_retrieval.evaluation.fixtures import fixture_to_json

from .factories import make_candidate, make_fixture

pytestmark = pytest.mark.unit

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~-]*\.json")
WINDOWS_RESERVED = {"con", "prn", "aux", "nul"} | {f"{p}{n}" for p in ("com", "lpt") for n in range(1, 10)}


def assert_safe(name: str) -> None:
    assert SAFE_NAME.fullmatch(name), name
    assert len(name.encode("utf-8")) <= 255
    assert name.split(".")[0].lower() not in WINDOWS_RESERVED


def test_plain_case_ids_keep_their_name() -> None:
    assert fixture_filename("kp-001-AlertmanagerFailedReload") == "kp-001-AlertmanagerFailedReload.json"
    assert fixture_filename("case_1.v2") == "case_1.v2.json"


@pytest.mark.parametrize(
    "case_id",
    ["../../etc/passwd", "a/b", "a\\b", ".hidden", "..", "CON", "con.txt", "lpt1", "a b", "é", "x" * 500, "", "a:b"],
)
def test_unsafe_case_ids_are_escaped(case_id: str) -> None:
    name = fixture_filename(case_id)

    assert_safe(name)
    assert "~" in name
    assert "/" not in name and "\\" not in name
    assert fixture_filename(case_id) == name  # deterministic


@given(st.text(min_size=1, max_size=300))
def test_any_case_id_maps_to_a_safe_file_name(case_id: str) -> None:
    assert_safe(fixture_filename(case_id))


@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=40))
def test_distinct_case_ids_get_distinct_files(first: str, second: str) -> None:
    if first != second:
        assert fixture_filename(first) != fixture_filename(second)


def test_similar_ids_do_not_collide() -> None:
    names = {fixture_filename(case_id) for case_id in ["a b", "a_b", "a/b", "a\\b", "a:b", "a__b"]}

    assert len(names) == 6


def test_write_then_load_round_trips_byte_identically(tmp_path: Path) -> None:
    fixture = make_fixture(
        [make_candidate(1, "a.md", breadcrumb="A > B", score=0.1234567890123, similarity=0.5)],
        case_id="dir/case 1",
    )

    path = write_fixture(fixture, tmp_path / "fixtures")
    again = write_fixture(load_fixture(tmp_path / "fixtures", "dir/case 1") or fixture, tmp_path / "other")

    assert path.name == fixture_filename("dir/case 1")
    assert path.read_bytes() == again.read_bytes()
    text = path.read_text(encoding="utf-8")
    assert text.endswith("}\n")
    assert '"score": 0.1234567890123' in text  # floats as-is
    assert list(json.loads(text)) == sorted(json.loads(text))
    assert [p.name for p in (tmp_path / "fixtures").iterdir()] == [path.name]  # no temporary file left


def test_data_fixtures_are_in_canonical_form(fixtures_dir: Path) -> None:
    for path in sorted(fixtures_dir.glob("*.json")):
        fixture = Fixture.model_validate_json(path.read_text(encoding="utf-8"))
        assert path.name == fixture_filename(fixture.case_id)
        assert fixture_to_json(fixture) == path.read_text(encoding="utf-8"), path.name


def test_absent_fixture_is_none(tmp_path: Path) -> None:
    assert load_fixture(tmp_path, "nothing") is None


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{", r"c1\.json: invalid JSON"),
        ("[]", r"c1\.json: expected a JSON object, got list"),
        ('{"case_id": "c1", "query": "q", "result": {}}', r"c1\.json: field 'result': 'found' must be present"),
        (
            '{"case_id": "c1", "query": "q", "result": {"found": true}, "candidates": '
            '[{"rank": 1, "source": "a", "score_label": "l2_distance", "score": 1.0}]}',
            r"c1\.json: field 'candidates\.0\.content': is required",
        ),
        ('{"case_id": "c2", "query": "q", "result": {"found": true}}', r"c1\.json: holds case_id 'c2'"),
        ('{"case_id": "c1", "query": "q", "result": {"found": true}, "when": 1}', r"field 'when': Extra inputs"),
    ],
)
def test_malformed_fixture_names_the_file(tmp_path: Path, content: str, expected: str) -> None:
    (tmp_path / "c1.json").write_text(content, encoding="utf-8")

    with pytest.raises(FixtureError, match=expected):
        load_fixture(tmp_path, "c1")


def test_ranking_must_be_ranks_one_to_n_with_one_candidate_per_source() -> None:
    with pytest.raises(ValueError, match=r"ranks 1\.\.n, got ranks \[1, 3\]"):
        make_fixture([make_candidate(1, "a.md"), make_candidate(3, "b.md")])
    with pytest.raises(ValueError, match=r"source 'a\.md' appears twice"):
        make_fixture([make_candidate(1, "a.md"), make_candidate(2, "a.md")])


def test_candidate_label_prefers_breadcrumb_then_title() -> None:
    assert make_candidate(1, "a.md", breadcrumb="A > B", title="A").label() == "a.md > A > B"
    assert make_candidate(1, "a.md", title="A").label() == "a.md > A"
    assert make_candidate(1, "a.md").label() == "a.md"


def test_result_accessors() -> None:
    fixture = make_fixture([], found=False, status="no_evidence", evidence=["x"])

    assert fixture.found is False
    assert fixture.evidence_status == "no_evidence"
    assert fixture.evidence_contents == ["x"]
