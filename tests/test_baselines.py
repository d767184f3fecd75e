"""The committed baselines are current: regenerated here from fresh ingests, they match byte for byte.

``make baselines`` writes them (the sample KB's fixtures, the offline evaluation of those, which
tests/evaluation/test_baseline.py checks, and the sidecar comparison on the runbooks corpus); a change to the pipeline
that moves a result fails here until they are regenerated on purpose.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED

REGENERATE = (
    "regenerate with `make baselines` on purpose (with the same packages, the int8 query encoder's similarities "
    "differ by up to ~0.01 from one machine's CPU to another's: onnxruntime's int8 kernels follow the instruction set)"
)


def _same_files(produced: Path, committed: Path, pattern: str) -> None:
    made = sorted(p.name for p in produced.glob(pattern))
    assert made == sorted(p.name for p in committed.glob(pattern)), f"files differ in {committed}: {REGENERATE}"
    for name in made:
        assert (produced / name).read_bytes() == (committed / name).read_bytes(), f"{name} differs: {REGENERATE}"


@pytest.mark.timeout(900)
def test_sample_kb_fixtures_are_current(sample_lookup, tmp_path, monkeypatch):
    """`fixtures record --mode sdk` on a fresh ingest of the sample KB gives the committed fixtures."""
    from kb_retrieval.evaluation.recorder import record_fixtures

    monkeypatch.chdir(REPO)
    assert sample_lookup.settings.vector_store_mode == "sdk"
    record_fixtures(Path("golden/sample-kb.jsonl"), tmp_path, sample_lookup.settings, lookup=sample_lookup)
    _same_files(tmp_path, REPO / "golden" / "fixtures" / "sample-kb", "*.json")


@pytest.mark.timeout(1800)
def test_compare_report_is_current(runbooks_lookup, tmp_path, monkeypatch):
    """`compare` on a fresh ingest of the runbooks corpus (mode auto, sidecar on) gives the committed report."""
    from kb_retrieval.engine import KnowledgeLookup
    from sidecar.comparison import run_comparison
    from sidecar.report import write_compare_report

    golden = SHARED / "golden" / "runbooks-alerts-dev.jsonl"
    assert golden.is_file(), f"the shared golden set is missing at {golden}"
    monkeypatch.chdir(REPO)  # the report names the golden file as `make baselines` gives it
    settings = runbooks_lookup.settings.model_copy(update={"vector_store_mode": "auto", "sidecar_enabled": True})
    lookup = KnowledgeLookup(settings)  # queries embedded as `kb-retrieval compare` embeds them (ONNX)
    try:
        report = run_comparison("../shared/golden/runbooks-alerts-dev.jsonl", lookup, 5)
    finally:
        lookup.close()
    write_compare_report(report, tmp_path, "runbooks-alerts-dev")
    _same_files(tmp_path, REPO / "reports" / "compare", "*.json")
    _same_files(tmp_path, REPO / "reports" / "compare", "*.md")
    _same_files(tmp_path, REPO / "reports" / "compare", "*.png")
