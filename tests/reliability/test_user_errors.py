"""A user's mistake is one ``error:`` line naming the setting or file, secrets masked, exit status 2; never a
traceback (the hostile review's reproductions, issue 40 items 6-8)."""

from __future__ import annotations

import pytest

from kb_retrieval.cli import main

pytestmark = pytest.mark.unit


def one_line_error(capsys: pytest.CaptureFixture[str], code: int) -> str:
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("command", [["stats"], ["lookup", "redis memory"], ["ingest", "."]])
@pytest.mark.parametrize(
    "uri", ["http://kbuser:Pw8#Hash@127.0.0.1:1", "http://kbuser:Pw8/Hash@127.0.0.1:1"], ids=["hash", "slash"]
)
def test_a_password_that_breaks_the_url_is_never_shown(tmp_path, capsys, monkeypatch, command, uri):
    monkeypatch.setenv("KB_MILVUS_URI", uri)
    line = one_line_error(capsys, main([*command, "--state-dir", str(tmp_path)]))
    assert "KB_MILVUS_URI" in line and "percent-encoded" in line
    assert "Pw8" not in line and "Hash" not in line


@pytest.mark.parametrize(
    ("variable", "value", "command", "fragments"),
    [
        ("KB_MILVUS_URI", "http://[::1", ["stats"], ["KB_MILVUS_URI", "not a valid URL"]),
        ("KB_INDEX_PARAMS", "{not json", ["stats"], ["KB_INDEX_PARAMS", "JSON"]),
        ("KB_TRACE_DB_URL", "garbage://", ["traces"], ["KB_TRACE_DB_URL", "no such database type"]),
        ("KB_TRACE_DB_URL", "mysql://kb:s3cret-pw@127.0.0.1/traces", ["traces"], ["driver is not installed"]),
        (
            "KB_TRACE_DB_URL",
            "postgresql+psycopg://kb:s3cret-pw@127.0.0.1:1/traces",
            ["traces"],
            ["cannot read the trace store", "kb:***@127.0.0.1:1"],
        ),
    ],
    ids=["ipv6-unclosed", "index-params-not-json", "trace-url-garbage", "mysql-no-driver", "trace-db-unreachable"],
)
def test_a_bad_setting_is_one_line_naming_it(tmp_path, capsys, monkeypatch, variable, value, command, fragments):
    monkeypatch.setenv(variable, value)
    line = one_line_error(capsys, main([*command, "--state-dir", str(tmp_path)]))
    for fragment in fragments:
        assert fragment in line, line
    assert "s3cret-pw" not in line


def test_a_query_line_with_a_lone_surrogate_names_its_line(tmp_path, capsys):
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"query": "redis memory"}\n{"query": "disk \\ud800 full"}\n', encoding="utf-8")
    line = one_line_error(capsys, main(["lookup", "--queries", str(queries), "--state-dir", str(tmp_path / "s")]))
    assert f"{queries}:2" in line and "lone surrogate" in line
