"""The committed baselines are current: regenerated here from fresh ingests, they match the committed ones.

``make baselines`` writes them (the sample KB's fixtures, the offline evaluation of those, which
tests/evaluation/test_baseline.py checks, and the sidecar comparison on the runbooks corpus); a change to the pipeline
that moves a result fails here until they are regenerated on purpose.

What must match exactly is everything but the scores: sources, their order (every rank), labels, counts, outcomes,
texts. A score may differ by :data:`SCORE_TOLERANCE`. The baselines are made as `make baselines` makes them: a fresh
``kb-retrieval ingest`` (the ONNX passage encoder, not the test session's model, whose vectors differ in the fourth
decimal) and queries through the fp32 ONNX export (``KB_QUERY_ENCODER=onnx``), not the default int8 one, whose
similarities differ by up to ~0.01 from one kind of CPU to another (onnxruntime's int8 kernels follow the
instruction set): enough to swap two close candidates, so int8 baselines recorded on one kind of CPU failed on
another (an AVX-512/AMX machine). fp32 kernels differ by rounding only, so the baselines made on one machine hold on
another without ``make baselines``. A chart (PNG) is a drawing of the report's figures, compared through them: it
must exist, and be a PNG.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, SHARED

REGENERATE = "regenerate with `make baselines` on purpose"
#: The query encoder of the baselines (`make baselines` sets KB_QUERY_ENCODER=onnx): the same on every kind of CPU.
FP32 = "onnx"
#: How far a score may move between two kinds of CPU (twice the ~0.01 measured between two).
SCORE_TOLERANCE = 0.02
_DECIMAL = re.compile(r"-?\d+\.\d+")
_PNG = b"\x89PNG\r\n\x1a\n"


def _close(made: Any, committed: Any, where: str) -> None:
    """``made`` equals ``committed`` (parsed JSON), but for floats, which may differ by :data:`SCORE_TOLERANCE`."""
    if isinstance(made, float) or isinstance(committed, float):
        numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (made, committed))
        assert numbers and abs(made - committed) <= SCORE_TOLERANCE, f"{where}: {made} vs {committed}: {REGENERATE}"
    elif isinstance(made, dict) and isinstance(committed, dict):
        assert sorted(made) == sorted(committed), f"{where}: keys differ: {REGENERATE}"
        for key in made:
            _close(made[key], committed[key], f"{where}.{key}")
    elif isinstance(made, list) and isinstance(committed, list):
        assert len(made) == len(committed), f"{where}: {len(made)} items vs {len(committed)}: {REGENERATE}"
        for i, (a, b) in enumerate(zip(made, committed, strict=True)):
            _close(a, b, f"{where}[{i}]")
    else:
        assert made == committed, f"{where}: {made!r} vs {committed!r}: {REGENERATE}"


def _same_text(made: str, committed: str, where: str) -> None:
    """The same text, but for its decimal numbers, which may differ by :data:`SCORE_TOLERANCE`."""
    assert _DECIMAL.sub("#", made) == _DECIMAL.sub("#", committed), f"{where}: the text differs: {REGENERATE}"
    _close([float(x) for x in _DECIMAL.findall(made)], [float(x) for x in _DECIMAL.findall(committed)], where)


def _same_files(produced: Path, committed: Path, pattern: str) -> None:
    made = sorted(p.name for p in produced.glob(pattern))
    assert made == sorted(p.name for p in committed.glob(pattern)), f"files differ in {committed}: {REGENERATE}"
    assert made, f"no {pattern} file in {committed}"
    for name in made:
        new, old = produced / name, committed / name
        if name.endswith(".json"):
            _close(json.loads(new.read_text(encoding="utf-8")), json.loads(old.read_text(encoding="utf-8")), name)
        elif name.endswith(".png"):
            assert new.read_bytes().startswith(_PNG) and old.read_bytes().startswith(_PNG), name
        else:
            _same_text(new.read_text(encoding="utf-8"), old.read_text(encoding="utf-8"), name)


def _ingested(kb: Path, state_dir: Path, **update: Any) -> Any:
    """Settings of a fresh state dir holding ``kb``, ingested as `make baselines` ingests it (``kb-retrieval ingest``:
    the ONNX passage encoder, not the test session's model, whose vectors differ in the fourth decimal), queries
    through the fp32 encoder."""
    from kb_retrieval.config import KBSettings
    from kb_retrieval.indexing.ingest import ingest

    settings = KBSettings(state_dir=state_dir)
    ingest([kb], settings)
    return settings.model_copy(update={"query_encoder": FP32, **update})


@pytest.mark.timeout(900)
def test_sample_kb_fixtures_are_current(tmp_path, monkeypatch):
    """`fixtures record --mode sdk` on a fresh ingest of the sample KB gives the committed fixtures."""
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.evaluation.recorder import record_fixtures

    monkeypatch.chdir(REPO)
    settings = _ingested(REPO / "kb_retrieval" / "sample_kb", tmp_path / "state", vector_store_mode="sdk")
    lookup = KnowledgeLookup(settings)
    try:
        record_fixtures(Path("golden/sample-kb.jsonl"), tmp_path / "fixtures", settings, lookup=lookup)
    finally:
        lookup.close()
    _same_files(tmp_path / "fixtures", REPO / "golden" / "fixtures" / "sample-kb", "*.json")


@pytest.mark.timeout(1800)
def test_compare_report_is_current(tmp_path, monkeypatch):
    """`compare` on a fresh ingest of the runbooks corpus (mode auto, sidecar on) gives the committed report."""
    from kb_retrieval.engine import KnowledgeLookup
    from sidecar.comparison import run_comparison
    from sidecar.report import write_compare_report

    golden = SHARED / "golden" / "runbooks-alerts-dev.jsonl"
    assert golden.is_file(), f"the shared golden set is missing at {golden}"
    corpus = SHARED / "corpora" / "runbooks"
    settings = _ingested(corpus, tmp_path / "state", vector_store_mode="auto", sidecar_enabled=True)
    monkeypatch.chdir(REPO)  # the report names the golden file as `make baselines` gives it
    lookup = KnowledgeLookup(settings)
    try:
        report = run_comparison("../shared/golden/runbooks-alerts-dev.jsonl", lookup, 5)
    finally:
        lookup.close()
    write_compare_report(report, tmp_path / "report", "runbooks-alerts-dev")
    for pattern in ("*.json", "*.md", "*.png"):
        _same_files(tmp_path / "report", REPO / "reports" / "compare", pattern)


@pytest.mark.unit
def test_the_comparison_allows_score_drift_and_nothing_else() -> None:
    _close({"score": 0.81, "source": "a.md", "rank": [1, 2]}, {"score": 0.8, "source": "a.md", "rank": [1, 2]}, "x")
    _same_text("hit@1 0.715 (a.md)", "hit@1 0.72 (a.md)", "x")
    for made, committed in (
        ({"score": 0.85}, {"score": 0.8}),  # past the tolerance
        ({"source": "b.md"}, {"source": "a.md"}),
        ({"rank": [2, 1]}, {"rank": [1, 2]}),  # another order
        ({"found": True}, {"found": 1.0}),
    ):
        with pytest.raises(AssertionError):
            _close(made, committed, "x")
    with pytest.raises(AssertionError):
        _same_text("hit@1 0.72 (b.md)", "hit@1 0.72 (a.md)", "x")
