"""The kb-retrieval command line, in-process (the model loads once per test session)."""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from kb_retrieval.cli import build_parser, main
from kb_retrieval.config import KBSettings
from tests.conftest import REPO, SAMPLE_KB
from tests.support.kb import offline_env, write_kb

DOC = (
    "---\ntitle: Disk full\nkeywords: [NodeDiskFull]\ncategory: linux\n---\n"
    "# Disk full\n\n## Mitigation\nDelete old logs with find.\n"
)


@pytest.fixture
def kb(tmp_path: Path) -> Path:
    return write_kb(tmp_path / "kb", {"linux/disk.md": DOC})


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_ingest_json_twice(kb, tmp_path, capsys, embed_model):
    state = str(tmp_path / "state")
    code, out, _ = run(capsys, "ingest", str(kb), "--state-dir", state, "--json")
    first = json.loads(out)
    assert code == 0 and first["documents"] == 1 and first["chunks_added"] >= 1
    assert {"chunks_updated", "chunks_removed", "chunks_unchanged", "skipped_files", "seconds"} <= set(first)
    code, out, _ = run(capsys, "ingest", str(kb), "--state-dir", state, "--json")
    second = json.loads(out)
    assert (second["chunks_added"], second["chunks_updated"], second["chunks_removed"]) == (0, 0, 0)


def test_state_dir_from_environment(kb, tmp_path, capsys, monkeypatch, embed_model):
    monkeypatch.setenv("KB_STATE_DIR", str(tmp_path / "env-state"))
    assert run(capsys, "ingest", str(kb), "--json")[0] == 0
    code, out, _ = run(capsys, "stats", "--json")
    stats = json.loads(out)
    assert code == 0 and stats["documents"] == 1 and stats["chunks"] >= 1 and stats["categories"] == {"linux": 1}
    assert (tmp_path / "env-state" / "milvus.db").exists()


def test_lookup_json_and_queries_file(kb, tmp_path, capsys, embed_model):
    state = str(tmp_path / "state")
    run(capsys, "ingest", str(kb), "--state-dir", state, "--json")
    code, out, _ = run(
        capsys, "lookup", "NodeDiskFull: disk full on host-1, how do I free space?", "--state-dir", state, "--json"
    )
    assert code == 0 and json.loads(out)["evidenceBlocks"][0]["source"] == "linux/disk.md"
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"query": "NodeDiskFull"}\n\n{"query": "delete old logs", "case_id": "x"}\n')
    code, out, _ = run(capsys, "lookup", "--queries", str(queries), "--state-dir", state)
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["queryTransform"]["originalQuery"] for r in lines] == ["NodeDiskFull", "delete old logs"]
    # issue 14 item 10: every line says which case it answers: its case_id, else FILE:LINE
    assert [r["caseId"] for r in lines] == [f"{queries}:1", "x"]


def test_user_errors_exit_2_with_a_message(tmp_path, capsys):
    code, _, err = run(capsys, "ingest", str(tmp_path / "missing"), "--state-dir", str(tmp_path / "s"))
    assert code == 2 and "not found" in err and "missing" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "ok"}\n{"nope": 1}\n')
    code, _, err = run(capsys, "lookup", "--queries", str(bad), "--state-dir", str(tmp_path / "s"))
    assert code == 2 and "bad.jsonl:2" in err
    code, _, err = run(capsys, "stats", "--uri", "http://127.0.0.1:9", "--state-dir", str(tmp_path / "s"))
    assert code == 2 and "unreachable" in err and "Traceback" not in err


def test_golden_file_works_as_queries(sample_settings, capsys, tmp_path):
    golden = REPO / "golden" / "sample-kb.jsonl"
    subset = tmp_path / "g.jsonl"
    subset.write_text("".join(golden.read_text().splitlines(keepends=True)[:3]))
    code, out, _ = run(
        capsys, "lookup", "--queries", str(subset), "--state-dir", str(sample_settings.storage.state_dir)
    )
    assert code == 0 and len(out.splitlines()) == 3


# --- issue 14 item 10: what a new user runs into --------------------------------------------------------------------


def test_stats_prints_readable_text_and_json_for_scripts(kb, tmp_path, capsys, embed_model):
    state = str(tmp_path / "state")
    run(capsys, "ingest", str(kb), "--state-dir", state)
    code, out, _ = run(capsys, "stats", "--state-dir", state)
    assert code == 0 and "{" not in out and "'" not in out  # not a Python dict
    lines = dict(line.split(None, 1) for line in out.splitlines())
    assert lines["chunks"] == "1" and lines["categories"] == "linux 1"
    assert lines["documents"] == "1 from 1 knowledge-base folder(s)"
    assert lines["collection"].startswith("kb_chunks (Milvus Lite, ")
    assert lines["vectors"] == "384 dimensions, COSINE"
    assert lines["lexical"] == "milvus_bm25"  # Milvus Lite 3.2 has full-text search: BM25 runs in Milvus
    code, out, _ = run(capsys, "stats", "--state-dir", state, "--json")
    stats = json.loads(out)
    assert code == 0 and stats["chunks"] == 1 and stats["categories"] == {"linux": 1} and stats["milvus"] == "lite"
    assert stats["lexical_mode"] == "milvus_bm25" and "milvus_bm25" not in stats["features_off"]
    assert stats["document_vectors"] == 1 and "document_ranking" not in stats["features_off"]
    assert "document vectors  1 documents (title, summary, text)" in run(capsys, "stats", "--state-dir", state)[1]


def test_lowercase_metric_is_accepted_and_a_bad_setting_names_its_variable(kb, tmp_path, capsys, monkeypatch):
    state = str(tmp_path / "state")
    monkeypatch.setenv("KB_METRIC", "cosine")
    assert KBSettings().schema_fields.metric == "COSINE"
    monkeypatch.setenv("KB_METRIC", "cosinus")
    code, out, err = run(capsys, "ingest", str(kb), "--state-dir", state)
    assert code == 2 and out == ""
    assert err.startswith("error: invalid setting KB_METRIC='COSINUS': Input should be 'COSINE', 'IP' or 'L2'")
    assert "Traceback" not in err and "validation error" not in err
    monkeypatch.delenv("KB_METRIC")
    monkeypatch.setenv("KB_TOP_K", "0")
    code, _, err = run(capsys, "lookup", "x", "--state-dir", state)
    assert code == 2 and "invalid setting KB_TOP_K='0': Input should be greater than 0" in err


def test_queries_file_is_checked_before_any_output(tmp_path, capsys):
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"query": "NodeDiskFull", "case_id": "a"}\n{"query": "  \\u200b ", "case_id": "b"}\n')
    # no ingest needed: the file fails before the model loads or Milvus is opened
    code, out, err = run(capsys, "lookup", "--queries", str(queries), "--state-dir", str(tmp_path / "s"))
    assert code == 2 and out == ""
    assert err.strip() == f"error: {queries}:2: query is empty: pass a question or an alert text"
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "no query in it"),
        (b'{"query": "ok"}\n[1, 2]\n', "q.jsonl:2: field 'query' missing or not a string"),
        (b'{"query": "ok"}\n{"query": \n', "q.jsonl:2: not valid JSON"),
        (b"\xff\xfe\x00garbage", "cannot read it as UTF-8 text"),
    ],
)
def test_malformed_queries_files_are_one_line_errors(tmp_path, capsys, content, message):
    queries = tmp_path / "q.jsonl"
    queries.write_bytes(content)
    code, out, err = run(capsys, "lookup", "--queries", str(queries), "--state-dir", str(tmp_path / "s"))
    assert code == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1


def test_query_and_queries_together_is_an_error(tmp_path, capsys):
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"query": "NodeDiskFull"}\n')
    code, out, err = run(capsys, "lookup", "disk full", "--queries", str(queries), "--state-dir", str(tmp_path / "s"))
    assert code == 2 and out == "" and "not both" in err
    code, _, err = run(capsys, "lookup", "--state-dir", str(tmp_path / "s"))
    assert code == 2 and "give a QUERY" in err


def test_lookup_dash_reads_the_query_from_stdin(kb, tmp_path, capsys, monkeypatch, embed_model):
    state = str(tmp_path / "state")
    run(capsys, "ingest", str(kb), "--state-dir", state)
    monkeypatch.setattr("sys.stdin", io.StringIO("NodeDiskFull: disk full on host-1\nhow do I free space?\n"))
    code, out, _ = run(capsys, "lookup", "-", "--state-dir", state, "--json")
    result = json.loads(out)
    assert code == 0 and result["queryTransform"]["originalQuery"].startswith("NodeDiskFull: disk full on host-1")
    assert result["evidenceBlocks"][0]["source"] == "linux/disk.md"
    monkeypatch.setattr("sys.stdin", io.StringIO('{"query": "delete old logs", "case_id": "from-stdin"}\n'))
    code, out, _ = run(capsys, "lookup", "--queries", "-", "--state-dir", state)
    assert code == 0 and json.loads(out)["caseId"] == "from-stdin"
    monkeypatch.setattr("sys.stdin", io.StringIO("   \n"))
    code, out, err = run(capsys, "lookup", "-", "--state-dir", state)
    assert code == 2 and out == "" and "stdin: query is empty" in err


def test_output_to_a_closed_pipe_ends_quietly(kb, tmp_path, capsys, monkeypatch, embed_model):
    state = str(tmp_path / "state")
    run(capsys, "ingest", str(kb), "--state-dir", state)
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"query": "NodeDiskFull"}\n{"query": "delete old logs"}\n')

    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("sys.stdout", ClosedPipe())
    code = main(["lookup", "--queries", str(queries), "--state-dir", state])
    err = capsys.readouterr().err
    assert code == 141 and "Traceback" not in err and "BrokenPipe" not in err


def test_symlinked_folder_and_empty_ingest_are_reported(tmp_path, capsys, caplog, embed_model):
    state = str(tmp_path / "state")
    empty = tmp_path / "empty"
    (empty / "notes").mkdir(parents=True)
    (empty / "notes" / "diagram.png").write_bytes(b"\x89PNG\r\n")  # a file type ingest does not read
    code, out, err = run(capsys, "ingest", str(empty), "--state-dir", state)
    assert code == 1 and "documents: 0" in out and "skipped files: 1" in out
    assert "notes/diagram.png: unsupported file type .png" in err + caplog.text
    assert f"warning: no document found in {empty}" in err and "error: no document ingested" in err
    code, out, err = run(capsys, "ingest", str(empty), "--state-dir", state, "--json")
    assert code == 1 and json.loads(out)["empty_kb_dirs"] == [str(empty)]

    kb = write_kb(tmp_path / "kb", {"linux/disk.md": DOC})
    (kb / "alias").symlink_to(kb / "linux", target_is_directory=True)
    code, out, err = run(capsys, "ingest", str(kb), "--state-dir", state)
    skipped = "skipped alias/: refused: a symlinked folder is not followed"
    assert code == 0 and (skipped in err or skipped in caplog.text) and "skipped files: 1" in out
    assert "skipped alias/: refused" in caplog.text  # the warning as it happens, too


def test_edited_document_reports_replaced_chunks(kb, tmp_path, capsys, embed_model):
    """Issue 14 item 15: an edit replaces chunks; nothing was removed."""
    state = str(tmp_path / "state")
    first = json.loads(run(capsys, "ingest", str(kb), "--state-dir", state, "--json")[1])
    (kb / "linux" / "disk.md").write_text(DOC.replace("Delete old logs", "Delete old logs and rotated journals"))
    code, out, _ = run(capsys, "ingest", str(kb), "--state-dir", state, "--json")
    edited = json.loads(out)
    assert code == 0 and (edited["documents_updated"], edited["chunks_removed"]) == (1, 0)
    assert edited["chunks_replaced"] == first["chunks_added"] and edited["chunks_updated"] >= 1
    (kb / "linux" / "disk.md").write_text(DOC.replace("Disk full", "Disk nearly full"))
    code, out, _ = run(capsys, "ingest", str(kb), "--state-dir", state)
    assert code == 0 and f"updated 1 (replacing {edited['chunks_updated']}), removed 0" in out


def _actions(parser: argparse.ArgumentParser, path: str = "kb-retrieval") -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _actions(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            found.append((path, action))
    return found


def test_every_option_and_positional_has_help():
    # compare and eval load their options only when they run
    actions = _actions(build_parser("compare")) + _actions(build_parser("eval"))
    assert len(actions) > 40
    missing = [f"{path} {a.option_strings or a.dest}" for path, a in actions if not a.help]
    assert missing == []


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == "kb-retrieval 0.1.0"


def test_bench_without_its_extra_is_one_clear_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    code, out, err = run(capsys, "bench", "--shared", str(tmp_path))
    assert code == 2 and out == ""
    assert err.strip() == (
        "error: `kb-retrieval bench` needs the 'bench' extra (matplotlib is not installed): "
        "pip install 'kb-retrieval[bench]'"
    )


# --- issue 14 item 3: no secret on screen ------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["stats"], ["lookup", "disk full"], ["ingest", "KB"]])
def test_password_in_the_milvus_uri_is_masked(kb, tmp_path, capsys, command):
    argv = [str(kb) if a == "KB" else a for a in command]
    code, out, err = run(capsys, *argv, "--uri", "http://root:PASSWORD1@127.0.0.1:1", "--state-dir", str(tmp_path))
    assert code == 2 and "unreachable at http://root:***@127.0.0.1:1" in err
    assert "PASSWORD1" not in out + err and "Traceback" not in err


def test_token_is_a_secret_and_never_in_a_settings_error(kb, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KB_MILVUS_TOKEN", "root:TOKEN-SECRET-1")
    assert "TOKEN-SECRET-1" not in repr(KBSettings()) and KBSettings().storage.milvus_token.get_secret_value().endswith(
        "-1"
    )
    monkeypatch.setenv("KB_CHUNK_OVERLAP", "500")  # an error of the whole model: pydantic would show every input
    code, out, err = run(capsys, "ingest", str(kb), "--state-dir", str(tmp_path))
    assert code == 2 and "chunk_overlap (500) must be below chunk_tokens (220)" in err
    assert "TOKEN-SECRET" not in out + err
    with pytest.raises(ValidationError) as info:
        KBSettings()
    assert "TOKEN-SECRET" not in str(info.value)  # the library's own error, too


def test_demo_masks_the_trace_database_password(sample_settings, tmp_path, capsys, caplog, monkeypatch):
    """The trace database is unreachable here: its failures are logged and counted, the password never shown."""
    monkeypatch.setenv("KB_TRACE_DB_URL", "postgresql+psycopg://kb:DB-PASSWORD-9@127.0.0.1:1/traces")
    monkeypatch.setenv("KB_TRACE_TIMEOUT_S", "0.5")
    code, out, err = run(
        capsys, "demo", "disk full on a node", "--state-dir", str(sample_settings.storage.state_dir), "--mode", "sdk"
    )
    assert code == 0 and "== lookup_knowledge: disk full on a node" in out
    assert "trace store postgresql+psycopg://kb:***@127.0.0.1:1/traces unavailable (OperationalError)" in out
    assert "DB-PASSWORD-9" not in out + err + caplog.text and "Traceback" not in err


# --- the console script, as a user runs it (issue 14 items 9 and 10) --------------------------------------------


@pytest.mark.timeout(300)
def test_console_script_first_ingest_is_quiet_and_head_ends_it_cleanly(kb, tmp_path):
    script = Path(sys.executable).parent / "kb-retrieval"
    state = str(tmp_path / "state")
    env = offline_env()
    ingest = subprocess.run(
        [script, "ingest", str(kb), "--state-dir", state], capture_output=True, text=True, env=env, timeout=240
    )
    assert ingest.returncode == 0, ingest.stderr
    assert "Traceback" not in ingest.stderr and "Method not implemented" not in ingest.stderr  # item 9

    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(f'{{"query": "NodeDiskFull {i}"}}\n' for i in range(50)))
    lookup = subprocess.Popen(
        [script, "lookup", "--queries", str(queries), "--state-dir", state],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert lookup.stdout is not None and lookup.stderr is not None
    first = lookup.stdout.readline()  # what `| head -1` reads before it exits
    lookup.stdout.close()
    err = lookup.stderr.read()
    assert lookup.wait(timeout=240) == 141
    assert json.loads(first)["caseId"] == f"{queries}:1"
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


# --- issue 14 item 5: the chunk count on a Milvus server --------------------------------------------------------


@pytest.mark.server
def test_stats_on_a_server_counts_the_chunks_right_after_an_ingest(milvus_server, tmp_path, capsys, embed_model):
    kb = tmp_path / "kb"
    shutil.copytree(SAMPLE_KB / "redis", kb / "redis")
    where = ["--uri", milvus_server.uri, "--collection", "kb_stats_test", "--state-dir", str(tmp_path / "state")]
    code, out, _ = run(capsys, "ingest", str(kb), *where, "--json")
    first = json.loads(out)
    assert code == 0 and first["chunks_added"] > 20
    stats = json.loads(run(capsys, "stats", *where, "--json")[1])
    assert stats["chunks"] == first["chunks_added"]  # not 0: unflushed rows count too
    # The document vectors' companion (one vector field of 3 x dim) works on a Milvus 2.3 server too.
    assert stats["document_vectors"] == first["documents_added"] and "document_ranking" not in stats["features_off"]
    edited = next(iter(sorted((kb / "redis").glob("*.md"))))
    edited.write_text(edited.read_text(encoding="utf-8") + "\n## Extra\n\nOne more section.\n", encoding="utf-8")
    code, out, _ = run(capsys, "ingest", str(kb), *where, "--json")
    second = json.loads(out)
    assert code == 0 and second["chunks_replaced"] > 0
    stats = json.loads(run(capsys, "stats", *where, "--json")[1])
    assert stats["chunks"] == second["chunks_updated"] + second["chunks_unchanged"]  # replaced rows not counted


def test_unusable_state_dir_and_queries_path_are_one_line_errors(kb, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, out, err = run(capsys, "ingest", str(kb), "--state-dir", str(blocker / "state"))
    assert code == 2 and out == "" and "Not a directory" in err and "Traceback" not in err
    code, _, err = run(capsys, "lookup", "--queries", str(tmp_path), "--state-dir", str(tmp_path / "s"))
    assert code == 2 and f"queries file is not a file: {tmp_path}" in err


# --- issue 23 item 5: every URL form masked, by parsing the URL --------------------------------------------------

MILVUS_URL_FORMS = {
    "space in the password": ("http://root:pa ss-S1@127.0.0.1:1", "pa ss-S1", "http://root:***@127.0.0.1:1"),
    "token parameter": ("http://127.0.0.1:1/?token=TOK-S2", "TOK-S2", "http://127.0.0.1:1/?token=***"),
    "api_key parameter": ("http://127.0.0.1:1?API_KEY=KEY-S3&db_name=x", "KEY-S3", "?API_KEY=***&db_name=x"),
    "percent-encoded password": ("http://root:p%40ss-S4@127.0.0.1:1", "ss-S4", "http://root:***@127.0.0.1:1"),
}


@pytest.mark.parametrize("form", sorted(MILVUS_URL_FORMS))
def test_every_milvus_uri_form_is_masked_by_stats(tmp_path, capsys, caplog, form):
    uri, secret, shown = MILVUS_URL_FORMS[form]
    code, out, err = run(capsys, "stats", "--uri", uri, "--state-dir", str(tmp_path))
    assert code == 2 and "Traceback" not in err and shown in err, err
    assert secret not in out + err + caplog.text


TRACE_URL_FORMS = {
    "password parameter": (
        "postgresql+psycopg://kb@127.0.0.1:1/nodb?password=PW-Q1",
        "PW-Q1",
        "postgresql+psycopg://kb@127.0.0.1:1/nodb?password=***",
    ),
    "space in the password": (
        "postgresql+psycopg://kb:my pass-Q2@127.0.0.1:1/traces",
        "pass-Q2",
        "postgresql+psycopg://kb:***@127.0.0.1:1/traces",
    ),
    "secret parameter": (
        "postgresql+psycopg://kb@127.0.0.1:1/t?sslmode=disable&client_secret=SEC-Q3",
        "SEC-Q3",
        "?sslmode=disable&client_secret=***",
    ),
}


@pytest.mark.parametrize("form", sorted(TRACE_URL_FORMS))
def test_every_trace_url_form_is_masked_in_output_and_the_trace_store_error_log(
    sample_settings, capsys, caplog, monkeypatch, form
):
    """The trace database is unreachable: its error log line and the demo's summary name it, masked."""
    url, secret, shown = TRACE_URL_FORMS[form]
    monkeypatch.setenv("KB_TRACE_DB_URL", url)
    monkeypatch.setenv("KB_TRACE_TIMEOUT_S", "0.5")
    state = str(sample_settings.storage.state_dir)
    code, out, err = run(capsys, "demo", "disk full on a node", "--state-dir", state, "--mode", "sdk")
    assert code == 0 and shown in out, out
    logged = [r.getMessage() for r in caplog.records if r.name == "kb_retrieval.traces"]
    assert logged and all(shown in line for line in logged if line.startswith("trace store")), logged
    assert secret not in out + err + caplog.text
