"""What a person sees on a terminal: progress on long work, a quiet stderr, the lookup view (issue 25 items 2-4).

The console script runs as a subprocess where the stream a user sees matters (stderr of a real process, a real
pseudo-terminal); in-process runs with an injected terminal stream cover the rest at less cost.
"""

from __future__ import annotations

import io
import json
import os
import pty
import select
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kb_retrieval.cli import main
from tests.conftest import SAMPLE_KB
from tests.support.kb import offline_env

SCRIPT = Path(sys.executable).parent / "kb-retrieval"
ENV = offline_env()
QUESTION = "RedisMemoryHigh: Redis memory usage above 90% of maxmemory on redis-cache-01:6379"


class TerminalStream(io.StringIO):
    """A captured stream that says it is a terminal, as a user's stderr or stdout is."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def small_kb(tmp_path: Path) -> Path:
    """Part of the sample KB (its Redis runbooks) plus one file the loader skips."""
    root = tmp_path / "kb"
    shutil.copytree(SAMPLE_KB / "redis", root / "redis")
    (root / "redis" / "_index.md").write_text("---\ntitle: Redis\n---\n", encoding="utf-8")
    return root


def _run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, env=ENV, timeout=timeout)


def _on_pseudo_terminal(argv: list[str], columns: int) -> tuple[int, str, str]:
    """Run the console script with its stdout on a real pseudo-terminal ``columns`` wide."""
    primary, secondary = pty.openpty()
    process = subprocess.Popen(
        [str(SCRIPT), *argv],
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=subprocess.PIPE,
        env={**ENV, "COLUMNS": str(columns)},
    )
    os.close(secondary)
    chunks = []
    while select.select([primary], [], [], 120)[0]:
        try:
            data = os.read(primary, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(primary)
    code = process.wait(timeout=120)
    assert process.stderr is not None
    err = process.stderr.read().decode("utf-8")
    return code, b"".join(chunks).decode("utf-8").replace("\r\n", "\n"), err


@pytest.mark.timeout(900)
def test_console_script_stderr_is_clean_and_the_lookup_view_fits_a_terminal(small_kb, tmp_path):
    """No weight-loading bar, deprecation banner or library line on a user's stderr; each skip said once; on a
    real terminal the document lines fit its width."""
    state = str(tmp_path / "state")
    ingest = _run("ingest", str(small_kb), "--state-dir", state)
    assert ingest.returncode == 0, ingest.stderr
    reason = "no content after the frontmatter"
    assert (ingest.stdout + ingest.stderr).count(reason) == 1, ingest.stdout + ingest.stderr
    others = [line for line in ingest.stderr.splitlines() if reason not in line]
    assert others == [], others  # not a terminal: no bar either
    assert "skipped files: 1 (each named in a warning above)" in ingest.stdout

    lookup = _run("lookup", QUESTION, "--state-dir", state)
    assert lookup.returncode == 0 and lookup.stderr == "", lookup.stderr
    whole = lookup.stdout.splitlines()
    assert "evidence document(s)" in whole[0] and whole[2].startswith("#  source")

    code, text, err = _on_pseudo_terminal(["lookup", QUESTION, "--state-dir", state], columns=90)
    assert code == 0 and err == "", err
    lines = text.splitlines()
    table = lines[2 : lines.index("", 3)]
    assert table[0].startswith("#  source") and len(table) >= 2
    assert all(len(line) <= 90 for line in table), table
    assert any(len(line) > 90 for line in whole[2 : 2 + len(table)])  # the pipe got them whole
    assert "[1] redis/memory-usage-high.md - Redis memory usage high" in text

    verbose = _run("-v", "lookup", QUESTION, "--state-dir", state, "--json")
    assert verbose.returncode == 0 and "INFO" in verbose.stderr  # -v is where library detail goes


def test_lookup_view_names_every_document_and_what_was_left_out(sample_settings, capsys):
    """Not a terminal: whole lines (nothing cut); one line per evidence document; the omitted ones named."""
    code = main(["lookup", QUESTION, "--state-dir", str(sample_settings.storage.state_dir), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    sources = [block["source"] for block in result["evidenceBlocks"]]
    omitted = result["contextPack"]["summary"]["omittedSources"]

    assert main(["lookup", QUESTION, "--state-dir", str(sample_settings.storage.state_dir)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"{len(sources)} evidence document(s), relevance {result['relevanceLevel']}")
    rows = lines[3 : 3 + len(sources)]
    for rank, (row, source) in enumerate(zip(rows, sources, strict=True), start=1):
        assert row.startswith(f"{rank}  {source}"), row
        assert "l1_document:" not in row and "lexical_bm25:" not in row  # reasons in words
    assert "keyword RedisMemoryHigh" in rows[0]
    if omitted:
        assert f"Left out of the agent's context by the token budget: {', '.join(omitted)}" in out
    assert out.count("\n[") == 1 and "--full prints every document's text" in out

    assert main(["lookup", QUESTION, "--state-dir", str(sample_settings.storage.state_dir), "--full"]) == 0
    full = capsys.readouterr().out
    for rank, source in enumerate(sources, start=1):
        assert f"\n[{rank}] {source}" in full
    for block in result["evidenceBlocks"]:
        assert block["content"].strip().splitlines()[-1].strip() in full


def test_lookup_view_on_a_terminal_cuts_lines_to_its_width(sample_settings, monkeypatch):
    stream = TerminalStream()
    monkeypatch.setattr(sys, "stdout", stream)
    monkeypatch.setenv("COLUMNS", "72")
    assert main(["lookup", QUESTION, "--state-dir", str(sample_settings.storage.state_dir)]) == 0
    lines = stream.getvalue().splitlines()
    table = lines[2 : lines.index("", 3)]
    assert len(table) >= 2 and all(len(line) <= 72 for line in table) and table[1].endswith("...")


def test_json_output_is_the_result_contract(sample_settings, capsys):
    """``--json`` is the result's JSON as before: the terminal view never leaks into it."""
    from kb_retrieval.engine import KnowledgeLookup

    assert (
        main(["lookup", QUESTION, "--state-dir", str(sample_settings.storage.state_dir), "--json", "--mode", "sdk"])
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    lookup = KnowledgeLookup(sample_settings)
    try:
        expected = lookup.lookup(QUESTION).to_json_dict()
    finally:
        lookup.close()
    assert _without_timings(printed) == _without_timings(expected)


def _without_timings(value: object) -> object:
    """A result's JSON without what differs from run to run (timings, whether the trace row was accepted)."""
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k not in {"elapsedMs", "stageMs", "traceRecorded"}}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


@pytest.mark.parametrize("terminal", [True, False])
def test_ingest_progress_only_on_a_terminal(small_kb, tmp_path, monkeypatch, embed_model, terminal):
    stream = TerminalStream() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    assert main(["ingest", str(small_kb), "--state-dir", str(tmp_path / "state")]) == 0
    err = stream.getvalue()
    if terminal:
        assert "embedding:" in err and "chunk/s" in err and "<" in err  # tqdm's rate and ETA
        assert "/7 documents" in err and "document vectors:" in err
    else:
        assert "embedding" not in err and "chunk/s" not in err


def test_ingest_json_on_a_terminal_has_no_progress(small_kb, tmp_path, monkeypatch, capsys, embed_model):
    stream = TerminalStream()
    monkeypatch.setattr(sys, "stderr", stream)
    assert main(["ingest", str(small_kb), "--state-dir", str(tmp_path / "state"), "--json"]) == 0
    assert "embedding" not in stream.getvalue()
    assert json.loads(capsys.readouterr().out)["documents"] == 7


def test_fixtures_record_shows_progress_on_a_terminal(sample_settings, tmp_path, monkeypatch):
    golden = tmp_path / "golden.jsonl"
    golden.write_text(
        "".join(
            json.dumps({"case_id": f"c{i}", "scenario": "chat", "query": q, "expected_docs": []}) + "\n"
            for i, q in enumerate(["etcd has no leader", "disk full on a node"])
        ),
        encoding="utf-8",
    )
    stream = TerminalStream()
    monkeypatch.setattr(sys, "stderr", stream)
    argv = ["fixtures", "record", "--golden", str(golden), "--out", str(tmp_path / "fx")]
    assert main([*argv, "--state-dir", str(sample_settings.storage.state_dir)]) == 0
    assert "recording fixtures:" in stream.getvalue() and "2/2" in stream.getvalue()


def test_demo_ends_with_the_next_commands(sample_settings, capsys):
    code = main(["demo", "disk full on a node", "--state-dir", str(sample_settings.storage.state_dir), "--mode", "sdk"])
    out = capsys.readouterr().out
    assert code == 0
    tail = out[out.index("Next, try:") :].splitlines()
    assert len(tail) == 4, tail
    assert f"lookup --state-dir {sample_settings.storage.state_dir} " in tail[1]
    assert "ingest path/to/your/kb" in tail[2] and "lookup --state-dir .kb-state/mine" in tail[3]
    assert "l1_document:" not in out  # the demo's blocks say why in words too
    suggested = shlex.split(tail[1].split("  # ")[0])  # the first suggestion, run as printed: it finds evidence
    assert main([*suggested[1:], "--json", "--mode", "sdk"]) == 0
    assert json.loads(capsys.readouterr().out)["found"] is True


@pytest.mark.unit
def test_reasons_read_as_words():
    from kb_retrieval.terminal import reason_in_words

    assert reason_in_words("lexical_bm25:0.791") == "same words (BM25 0.79 of the best)"
    assert reason_in_words("l0_title_terms:0.90") == "90% of the title's words in the query"
    assert reason_in_words("exact_match:maxmemory-policy") == "exact identifier maxmemory-policy"
    assert reason_in_words("l1_document:title 0.547 summary 0.511 text 0.616") == (
        "whole-document similarity (text 0.62)"
    )
    assert reason_in_words("something_new:x") == "something_new:x"  # an unknown kind is shown as it is


@pytest.mark.unit
def test_progress_bar_is_off_when_stderr_is_not_a_terminal(monkeypatch):
    from kb_retrieval.progress import progress_bar

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert progress_bar(5, "x", "case").disable
    monkeypatch.setattr(sys, "stderr", TerminalStream())
    assert not progress_bar(5, "x", "case").disable
    assert progress_bar(5, "x", "case", enabled=False).disable
    assert progress_bar(0, "x", "case").disable
