"""The identity check: clock fields left out, and the first differing case found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kb_retrieval.bench.identity import first_difference, without_clocks

pytestmark = pytest.mark.unit


def test_clock_fields_are_left_out_at_every_depth() -> None:
    result = {"elapsed_ms": 3.1, "stage_ms": {"embed": 1.0}, "attempts": [{"elapsed_ms": 2.0, "outcome": "ok"}]}
    assert without_clocks(result) == {"attempts": [{"outcome": "ok"}]}


def test_the_first_differing_case_and_key_are_named(tmp_path: Path) -> None:
    cases = [{"case_id": f"c{i}", "result": {"blocks": [{"source": "a.md", "score": 0.5}]}} for i in range(3)]
    before, after, same = tmp_path / "before.jsonl", tmp_path / "after.jsonl", tmp_path / "same.jsonl"
    before.write_text("".join(json.dumps(c, sort_keys=True) + "\n" for c in cases), encoding="utf-8")
    same.write_bytes(before.read_bytes())
    cases[1]["result"]["blocks"][0]["score"] = 0.6
    after.write_text("".join(json.dumps(c, sort_keys=True) + "\n" for c in cases), encoding="utf-8")
    assert first_difference(before, same) is None
    assert first_difference(before, after) == "line 2, case c1: .result.blocks[0].score: 0.5 -> 0.6"
    after.write_text(after.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
    assert first_difference(before, after) == "3 lines before, 1 after"
