"""The kb-retrieval command line, in-process (the model loads once per test session)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kb_retrieval.cli import main
from tests.conftest import REPO

DOC = (
    "---\ntitle: Disk full\nkeywords: [NodeDiskFull]\ncategory: linux\n---\n"
    "# Disk full\n\n## Mitigation\nDelete old logs with find.\n"
)


@pytest.fixture
def kb(tmp_path: Path) -> Path:
    (tmp_path / "kb" / "linux").mkdir(parents=True)
    (tmp_path / "kb" / "linux" / "disk.md").write_text(DOC)
    return tmp_path / "kb"


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


def test_user_errors_exit_2_with_a_message(tmp_path, capsys):
    code, _, err = run(capsys, "ingest", str(tmp_path / "missing"), "--state-dir", str(tmp_path / "s"))
    assert code == 2 and "not found" in err and "missing" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "ok"}\n{"nope": 1}\n')
    code, _, err = run(capsys, "lookup", "--queries", str(bad), "--state-dir", str(tmp_path / "s"))
    assert code == 2 and "bad.jsonl:2" in err
    code, _, err = run(capsys, "stats", "--uri", "http://127.0.0.1:9", "--state-dir", str(tmp_path / "s"))
    assert code == 2 and "unreachable" in err


def test_golden_file_works_as_queries(sample_settings, capsys, tmp_path):
    golden = REPO / "golden" / "sample-kb.jsonl"
    subset = tmp_path / "g.jsonl"
    subset.write_text("".join(golden.read_text().splitlines(keepends=True)[:3]))
    code, out, _ = run(capsys, "lookup", "--queries", str(subset), "--state-dir", str(sample_settings.state_dir))
    assert code == 0 and len(out.splitlines()) == 3
