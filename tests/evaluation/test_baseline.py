"""The committed baseline is exactly what the evaluator makes of the committed golden set and fixtures."""

from __future__ import annotations

import os
from pathlib import Path

from kb_retrieval.evaluation.runner import main
from kb_retrieval.reporting import png_software

REPO = Path(__file__).resolve().parents[2]


def test_baseline_regenerates_byte_for_byte(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # paths inside the report are relative to the repository, as `make eval` runs it
    code = main(
        ["--golden", "golden/sample-kb.jsonl", "--fixtures", "golden/fixtures/sample-kb", "--out", os.fspath(tmp_path)]
    )
    assert code == 0
    committed_dir = REPO / "reports" / "retrieval-eval"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in committed_dir.iterdir())
    for name in ("sample-kb.json", "sample-kb.md"):
        committed = (committed_dir / name).read_bytes()
        assert (tmp_path / name).read_bytes() == committed, f"{name} differs: run `make baselines`"
    for chart in sorted(committed_dir.glob("*.png")):
        # Charts are byte-identical for the same figures and matplotlib version (the PNG names the version).
        if png_software(chart) == png_software(tmp_path / chart.name):
            assert (tmp_path / chart.name).read_bytes() == chart.read_bytes(), f"{chart.name} differs"


def test_baseline_gate_holds(tmp_path):
    # The floor CI holds the pipeline to, from the committed baseline (see README).
    code = main(
        [
            "--golden", os.fspath(REPO / "golden/sample-kb.jsonl"),
            "--fixtures", os.fspath(REPO / "golden/fixtures/sample-kb"),
            "--out", os.fspath(tmp_path),
            "--fail-under", "recall@1=0.9", "recall@5=1.0", "fixture_coverage=1", "no_answer_accuracy=0.7",
        ]
    )  # fmt: skip
    assert code == 0
