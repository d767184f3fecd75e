"""``kb-retrieval compare``: per-case differences, agreement, hit levels, an unavailable sidecar, determinism."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from kb_retrieval.cli_args import add_lookup_arguments
from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.evaluation.golden import GoldenCase, load_golden
from kb_retrieval.models import Candidate, EvidenceStatus, ScoreLabel
from kb_retrieval.reporting import draw_chart, label_problems
from sidecar.compare import add_compare_arguments, run_compare_command
from sidecar.comparison import build_report, compare_case, kendall_tau, run_comparison
from sidecar.models import ComparableResult, SidecarRun
from sidecar.report import render_markdown, report_charts, report_to_json, write_compare_report
from sidecar.runner import SidecarRunner

REPO_GOLDEN = "golden/sample-kb.jsonl"
pytestmark = pytest.mark.timeout(600)


# --- one case, pinned down with hand-made rankings ---------------------------------------------------------


def _candidate(source: str, breadcrumb: str, category: str = "redis", score: float = 0.7) -> Candidate:
    return Candidate(
        chunk_id=f"{source}#1",
        source=source,
        title=source,
        breadcrumb=breadcrumb,
        category=category,
        content=f"{breadcrumb}: set maxmemory",
        score=score,
        score_label=ScoreLabel.COSINE,
        path="sdk",
        similarity=score,
    )


def _sidecar_result(rank: int, source: str, breadcrumb: str, category: str = "redis") -> ComparableResult:
    return ComparableResult(
        path="sidecar:vectorstore",
        rank=rank,
        source=source,
        breadcrumb=breadcrumb,
        category=category,
        score_label="cosine_similarity",
        score=0.9 - rank / 10,
        content=f"{breadcrumb}: nothing relevant",
    )


def _lookup_result(found: bool, received: tuple[str, ...] = ()):
    """A lookup result whose context pack holds the ``received`` sources (what the agent reads)."""
    from kb_retrieval.models import ContextPack, ContextPackSummary, LookupResult, QueryTransform, RetrievalTrace

    summary = ContextPackSummary(budget_tokens=1, used_tokens=0, included_sources=list(received))
    return LookupResult(
        found=found,
        evidence_status=EvidenceStatus.OK if found else EvidenceStatus.NO_EVIDENCE,
        message="m",
        context_pack=ContextPack(summary=summary),
        query_transform=QueryTransform(original_query="q", normalized_query="q", filter_reason="none"),
        retrieval_trace=RetrievalTrace(path_served="sdk"),
        rerank_trace={"entries": []},
        relevance_level="high" if found else "none",
        completeness_hint="",
        retrieval_layer="L1",
    )


CASE = GoldenCase(case_id="c1", scenario="aiops", query="q", expected_docs=["a.md"], expected_keywords=["maxmemory"])


def test_case_marks_differences_and_measures_agreement():
    current = [_candidate("a.md", "A > Fix"), _candidate("b.md", "B"), _candidate("c.md", "C"), _candidate("d.md", "D")]
    sidecar = SidecarRun(
        status="ok",
        score_label="cosine_similarity",
        results=[
            _sidecar_result(1, "a.md", "A > Symptoms"),  # same source, other best chunk
            _sidecar_result(2, "c.md", "C"),
            _sidecar_result(3, "b.md", "B", category="other"),
            _sidecar_result(4, "e.md", "E"),
        ],
    )
    comparison = compare_case(CASE, _lookup_result(True, received=("a.md", "c.md")), current, sidecar, k=4)

    assert [(row.rank, row.differs) for row in comparison.rows] == [
        (1, ["breadcrumb"]),
        (2, ["source"]),
        (3, ["source"]),
        (4, ["source"]),
    ]
    agreement = comparison.agreement
    assert agreement is not None
    assert agreement.overlap_at_k == 0.75 and agreement.top1_same is True
    assert [(s.source, s.current_rank, s.sidecar_rank) for s in agreement.shared] == [
        ("a.md", 1, 1),
        ("b.md", 2, 3),
        ("c.md", 3, 2),
    ]
    assert agreement.kendall_tau == kendall_tau([1, 2, 3], [1, 3, 2]) == 0.3333
    assert agreement.only_current == ["d.md"] and agreement.only_sidecar == ["e.md"]
    # hit levels by the evaluator's rules: the current path's chunk holds the keyword, the sidecar's does not
    assert (comparison.current.hit_level, comparison.current.first_expected_rank) == ("strong", 1)
    assert comparison.sidecar.hit_level == "medium"
    assert comparison.current.path == "main:sdk" and comparison.sidecar.path == "sidecar:vectorstore"
    # what the agent received: the context pack's sources; the sidecar's documents never reach it
    assert [r.in_evidence for r in comparison.current.results] == [True, False, True, False]
    assert {r.in_evidence for r in comparison.sidecar.results} == {None}
    markdown = render_markdown(build_report([CASE], [comparison], "golden/x.jsonl", 4, KBSettings()), "x")
    rows = [line for line in markdown.splitlines() if line.startswith("| 2 | ") or line.startswith("| 3 | ")]
    assert rows[0].split(" | ")[1].endswith("<br>*(not in evidence)*")  # b.md, ranked 2nd, not received
    assert "*(not in evidence)*" not in rows[1].split(" | ")[1]  # c.md was received
    assert "| rank | current `main:sdk` | sidecar `sidecar:vectorstore` (never sent to the agent) |" in markdown


def test_case_with_a_sidecar_that_did_not_answer_keeps_the_current_results():
    current = [_candidate("a.md", "A > Fix")]
    run = SidecarRun(status="timeout", reason="no answer within 5 s (still retrieving)")
    comparison = compare_case(CASE, _lookup_result(True), current, run)
    assert comparison.sidecar.status == "timeout" and comparison.sidecar.hit_level == "not_run"
    assert comparison.agreement is None and comparison.rows == []
    assert [r.source for r in comparison.current.results] == ["a.md"]
    assert comparison.current.hit_level == "strong"


def test_disabled_sidecar_reads_as_unavailable_in_the_report():
    run = SidecarRun(status="disabled", reason="sidecar not enabled (KB_SIDECAR_ENABLED=false)")
    comparison = compare_case(CASE, _lookup_result(False), [], run)
    assert comparison.sidecar.status == "unavailable" and "not enabled" in (comparison.sidecar.reason or "")
    assert comparison.current.status == "no_evidence" and comparison.current.hit_level == "miss"


def test_charts_show_hit_levels_rank_shifts_and_overlap():
    current = [_candidate("a.md", "A > Fix"), _candidate("b.md", "B"), _candidate("c.md", "C"), _candidate("d.md", "D")]
    sidecar = SidecarRun(
        status="ok",
        score_label="cosine_similarity",
        results=[_sidecar_result(1, "a.md", "A"), _sidecar_result(2, "c.md", "C"), _sidecar_result(3, "b.md", "B")],
    )
    comparisons = [
        compare_case(CASE, _lookup_result(True), current, sidecar, k=4),
        compare_case(CASE, _lookup_result(True), current, SidecarRun(status="timeout", reason="late"), k=4),
    ]
    report = build_report([CASE, CASE], comparisons, "golden/x.jsonl", 4, KBSettings())

    levels, shifts, overlap = report_charts(report, "x")
    names = [c.file_name for c in (levels, shifts, overlap)]
    assert names == ["x-hit-levels.png", "x-rank-shifts.png", "x-overlap.png"]
    assert levels.categories == ["current", "sidecar"]
    assert levels.series["strong"] == [2, 0] and levels.series["not run"] == [0, 1]
    # a.md kept rank 1; b.md moved 2 -> 3 (+1); c.md moved 3 -> 2 (-1)
    assert shifts.categories == ["-3", "-2", "-1", "0", "+1", "+2", "+3"]
    assert shifts.series == {"documents": [0, 0, 1, 1, 1, 0, 0]}
    assert overlap.series == {"cases": [0, 0, 0, 1, 0]}  # one compared case, three shared documents
    for chart in (levels, shifts, overlap):
        assert chart.title and label_problems(draw_chart(chart)) == []


# --- golden sets against the sample KB ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def golden_subset(tmp_path_factory) -> str:
    """Eight golden cases of the sample KB, including no-answer cases, in a file of their own."""
    cases = load_golden(REPO_GOLDEN)
    chosen = [c for c in cases if c.is_no_answer][:2] + [c for c in cases if not c.is_no_answer][:6]
    path = tmp_path_factory.mktemp("golden") / "subset.jsonl"
    path.write_text("".join(c.model_dump_json() + "\n" for c in chosen), encoding="utf-8")
    return str(path)


def test_unavailable_sidecar_report_keeps_every_current_result(golden_subset, sample_settings, embed_model, tmp_path):
    settings = sample_settings.model_copy(update={"sidecar_enabled": True})

    def store_cannot_be_created():
        raise ConnectionError("cannot create MilvusVectorStore: connection refused")

    runner = SidecarRunner(settings, embed_model, factory=store_cannot_be_created)
    lookup = KnowledgeLookup(settings, embed_model=embed_model, sidecar=runner)
    try:
        report = run_comparison(golden_subset, lookup, k=5)
        expected = [lookup.lookup_ranked(c.query)[1] for c in load_golden(golden_subset)]
    finally:
        lookup.close()

    assert report.summary.sidecar_status == "unavailable" and report.summary.compared == 0
    assert report.summary.sidecar_statuses == {"unavailable": 8}
    assert report.summary.sidecar.not_run == 8 and report.summary.current.not_run == 0
    for case, ranking in zip(report.cases, expected, strict=True):
        assert case.sidecar.status == "unavailable" and "connection refused" in (case.sidecar.reason or "")
        assert [r.source for r in case.current.results] == [c.source for c in ranking[:5]]
    assert report.summary.current.strong + report.summary.current.medium >= 1

    files = write_compare_report(report, tmp_path, "unavailable")
    data = json.loads(files.json.read_text(encoding="utf-8"))
    assert data["summary"]["sidecar_status"] == "unavailable"
    assert all(case["current"]["results"] for case in data["cases"] if case["current"]["status"] == "found")
    markdown = files.markdown.read_text(encoding="utf-8")
    assert "| **UNAVAILABLE** |" in markdown and "Sidecar unavailable in 8 case(s): " in markdown
    assert "connection refused" in markdown
    # nothing to compare: the hit levels chart only
    assert [p.name for p in files.paths()] == ["unavailable.json", "unavailable.md", "unavailable-hit-levels.png"]


def _compare_args(golden: str, out: str, state_dir: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_compare_arguments(parser)
    add_lookup_arguments(parser)  # the common flags the CLI adds to every lookup command
    return parser.parse_args(["--golden", golden, "--out", out, "--state-dir", state_dir, "--mode", "sdk"])


def test_compare_command_is_byte_identical_across_runs(golden_subset, sample_settings, tmp_path, capsys, monkeypatch):
    shutil.copy(golden_subset, tmp_path / "subset.jsonl")
    monkeypatch.chdir(tmp_path)
    state_dir = str(sample_settings.storage.state_dir)
    assert run_compare_command(_compare_args("subset.jsonl", "a", state_dir)) == 0
    assert run_compare_command(_compare_args("subset.jsonl", "b", state_dir)) == 0
    assert "mean overlap@5" in capsys.readouterr().out

    charts = ["subset-hit-levels.png", "subset-rank-shifts.png", "subset-overlap.png"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(["subset.json", "subset.md", *charts])
    for name in ["subset.json", "subset.md", *charts]:
        first = (tmp_path / "a" / name).read_bytes()
        assert first == (tmp_path / "b" / name).read_bytes(), name
    for suffix in ("json", "md"):
        text = (tmp_path / "a" / f"subset.{suffix}").read_text(encoding="utf-8")
        assert str(tmp_path) not in text and state_dir not in text and "/tmp" not in text
        assert "elapsed" not in text and "waited" not in text
    markdown = (tmp_path / "a" / "subset.md").read_text(encoding="utf-8")
    assert all(f"]({chart})" in markdown for chart in charts)  # linked from the report
    data = json.loads((tmp_path / "a" / "subset.json").read_text(encoding="utf-8"))
    assert data["golden"] == "subset.jsonl"
    assert data["summary"]["sidecar_status"] == "ok" and data["summary"]["compared"] == 8
    assert data["paths"]["sidecar"]["name"] == "sidecar:vectorstore"
    assert data["paths"]["current"]["name"] == "main:sdk"
    # scores are listed per path under their own label, rounded
    for case in data["cases"]:
        for side in ("current", "sidecar"):
            for result in case[side]["results"]:
                assert result["score_label"] == "cosine_similarity" and round(result["score"], 4) == result["score"]
                assert "content" not in result and result["content_preview"]
    # the stock retriever has no notion of "no answer"
    no_answer = [c for c in data["cases"] if c["current"]["hit_level"].startswith("no_answer")]
    assert len(no_answer) == 2 and all(c["sidecar"]["hit_level"] == "no_answer_wrong" for c in no_answer)


def test_compare_command_rejects_a_missing_golden_file(tmp_path, capsys):
    args = _compare_args(str(tmp_path / "missing.jsonl"), str(tmp_path), str(tmp_path / "state"))
    assert run_compare_command(args) == 2
    assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()  # failed before connecting to anything


def test_markdown_labels_score_semantics_per_path():
    current = [_candidate("a.md", "A")]
    run = SidecarRun(status="ok", score_label="cosine_similarity", results=[_sidecar_result(1, "a.md", "A")])
    comparison = compare_case(CASE, _lookup_result(True), current, run)
    report = build_report([CASE], [comparison], "golden/x.jsonl", 5, KBSettings())
    markdown = render_markdown(report, "x")
    assert "Scores are not comparable across paths" in markdown
    assert "squared distance (lower is better)" in markdown
    assert report_to_json(report) == report_to_json(report.model_copy())


def test_offline_evaluator_never_imports_the_sidecar(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        from kb_retrieval.cli import main
        code = main(["eval", "--golden", "golden/sample-kb.jsonl", "--fixtures", "golden/fixtures/sample-kb",
                     "--out", {str(tmp_path)!r}])
        loaded = sorted(m for m in sys.modules if m == "sidecar" or m.startswith("sidecar."))
        print("RESULT", code, loaded)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "RESULT 0 []"
