"""Comparison on real traffic (issue 41 item 5): the trace store's queries replayed through the current settings and
an alternative, and draft golden cases from them.

The traffic is real: ``kb-retrieval lookup --queries`` over the sample KB writes the trace rows (one more query kept
hashed, as ``KB_TRACE_QUERY=hash`` keeps it), then ``compare --from-traces`` and ``golden draft --from-traces`` read
them through the CLI.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from kb_retrieval.cli import main
from kb_retrieval.cli_args import CliError
from kb_retrieval.evaluation.golden import load_golden
from kb_retrieval.evaluation.traffic import changes, is_private, traffic_queries
from kb_retrieval.evaluation.traffic_command import parse_sets
from kb_retrieval.traces import TraceStore
from tests.conftest import REPO

T0 = dt.datetime(2026, 12, 1, 8, 0, tzinfo=dt.timezone.utc)
HASHED = "sha256:" + "ab" * 32


@pytest.mark.unit
def test_the_queries_to_replay_skip_private_ones_and_repeats():
    rows = [
        ("disk full", T0),
        (HASHED, T0),
        ("[redacted: 12 characters]", T0 + dt.timedelta(hours=1)),
        ("disk full", T0 + dt.timedelta(hours=2)),
        ("redis memory", T0 + dt.timedelta(hours=3)),
        ("mysql lag", T0 + dt.timedelta(days=1)),
    ]
    everything = traffic_queries(rows)
    assert everything.queries == ["disk full", "redis memory", "mysql lag"]
    assert (everything.rows, everything.private, everything.repeats) == (6, 2, 1)
    recent = traffic_queries(rows, since=T0 + dt.timedelta(hours=1), limit=1)
    assert recent.queries == ["mysql lag"] and recent.rows == 4 and recent.beyond_limit == 2
    assert is_private(HASHED) and not is_private("sha256: what is it?")


@pytest.mark.unit
def test_settings_given_on_the_command_line_are_typed_and_checked():
    assert parse_sets(["top_k=50", "KB_EVIDENCE_THRESHOLD=0.5", "lexical_enabled=no"]) == {
        "top_k": 50,
        "evidence_threshold": 0.5,
        "lexical_enabled": False,
    }
    with pytest.raises(CliError, match="no such setting"):
        parse_sets(["topk=5"])
    with pytest.raises(CliError, match="top_k=many"):
        parse_sets(["top_k=many"])
    a = {"found": True, "first": "a.md", "evidence": ["a.md", "b.md"]}
    assert changes(a, {**a, "evidence": ["b.md", "a.md"]}) == []
    assert changes(a, {"found": False, "first": None, "evidence": []}) == ["found", "first document", "evidence set"]


def _traffic(sample_settings, tmp_path, capsys, monkeypatch) -> tuple[str, list[str]]:
    """Trace rows from real lookups: golden queries (one asked twice) and one kept hashed. Returns the trace DB URL
    and the distinct full queries."""
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    monkeypatch.setenv("KB_TRACE_DB_URL", url)
    cases = [json.loads(line) for line in (REPO / "golden" / "sample-kb.jsonl").read_text().splitlines()][:8]
    queries = tmp_path / "queries.jsonl"
    lines = [{"case_id": c["case_id"], "query": c["query"]} for c in [*cases, cases[0]]]
    queries.write_text("".join(json.dumps(line) + "\n" for line in lines))
    state = str(sample_settings.storage.state_dir)
    assert main(["lookup", "--queries", str(queries), "--state-dir", state]) == 0
    monkeypatch.setenv("KB_TRACE_QUERY", "hash")
    assert main(["lookup", "a query kept as its hash only", "--state-dir", state]) == 0
    monkeypatch.delenv("KB_TRACE_QUERY")
    capsys.readouterr()
    return url, list(dict.fromkeys(c["query"] for c in cases))


def test_compare_from_traces_reports_what_an_alternative_changes(sample_settings, tmp_path, capsys, monkeypatch):
    url, queries = _traffic(sample_settings, tmp_path, capsys, monkeypatch)
    rows_before = TraceStore(url).count()
    assert rows_before == len(queries) + 2
    state = str(sample_settings.storage.state_dir)
    reports = []
    for out in ("one", "two"):  # twice: the same traces give the same files
        argv = ["compare", "--from-traces", "--set", "max_evidence_blocks=1", "--state-dir", state]
        assert main([*argv, "--out", str(tmp_path / out)]) == 0
        reports.append({p.name: p.read_bytes() for p in sorted((tmp_path / out).iterdir()) if p.suffix != ".png"})
    out_text = capsys.readouterr().out
    assert reports[0] == reports[1] and set(reports[0]) == {"traffic.json", "traffic.md"}
    assert TraceStore(url).count() == rows_before  # the replays wrote no trace rows
    report = json.loads(reports[0]["traffic.json"])
    assert [case["query"] for case in report["cases"]] == queries
    assert report["skipped"] == {"private": 1, "repeats": 1, "beyond_limit": 0}
    assert report["b"] == "max_evidence_blocks=1"
    for case in report["cases"]:
        a, b = case["a"], case["b"]
        assert a["found"] == b["found"] and a["first"] == b["first"]  # one block: the same first document
        assert len(b["evidence"]) <= 1
        assert ("evidence set" in case["changed"]) == (len(a["evidence"]) > 1)
        assert case["b_adds"] == [] and case["b_drops"] == a["evidence"][1:]
    assert report["changed"]["evidence set"] >= 1 and report["changed"]["first document"] == 0
    assert "1 hashed or redacted skipped" in out_text
    markdown = reports[0]["traffic.md"].decode()
    assert "## Per query" in markdown and str(tmp_path) not in markdown

    limited = ["compare", "--from-traces", "--limit", "2", "--set", "top_k=5", "--state-dir", state]
    assert main([*limited, "--out", str(tmp_path / "limited")]) == 0
    report = json.loads((tmp_path / "limited" / "traffic.json").read_text())
    assert [case["query"] for case in report["cases"]] == queries[-2:]

    code = main(["compare", "--from-traces", "--state-dir", state, "--out", str(tmp_path / "none")])
    assert code == 2 and "needs one alternative" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_golden_draft_from_traces(sample_settings, sample_lookup, tmp_path, capsys, monkeypatch):
    _, queries = _traffic(sample_settings, tmp_path, capsys, monkeypatch)
    out = tmp_path / "draft.jsonl"
    argv = ["golden", "draft", "--from-traces", "--top", "2", "--state-dir", str(sample_settings.storage.state_dir)]
    assert main([*argv, "--out", str(out)]) == 0
    cases = load_golden(out)
    assert [case.query for case in cases] == queries
    for case in cases:
        result = sample_lookup.lookup(case.query)
        assert case.expected_docs == [b.source for b in result.evidence_blocks][:2]
        assert "draft" in case.model_extra["tags"]
    assert "confirm" in capsys.readouterr().out
    first = out.read_bytes()
    assert main([*argv, "--out", str(out)]) == 0 and out.read_bytes() == first


def test_compare_from_traces_against_another_state_dir_and_the_sidecar(
    sample_settings, tmp_path, capsys, monkeypatch, embed_model
):
    from kb_retrieval.config import KBSettings
    from kb_retrieval.indexing.ingest import ingest
    from kb_retrieval.indexing.milvus import release_lite
    from tests.conftest import SAMPLE_KB

    _, queries = _traffic(sample_settings, tmp_path, capsys, monkeypatch)
    redis_only = KBSettings(state_dir=tmp_path / "redis-state", vector_store_mode="sdk")
    ingest([SAMPLE_KB / "redis"], redis_only, embed_model=embed_model)
    release_lite(redis_only)
    state = str(sample_settings.storage.state_dir)
    argv = ["compare", "--from-traces", "--state-dir", state, "--against", str(redis_only.storage.state_dir)]
    assert main([*argv, "--out", str(tmp_path / "against")]) == 0
    report = json.loads((tmp_path / "against" / "traffic.json").read_text())
    assert report["b"].startswith("state dir ") and len(report["cases"]) == len(queries)
    redis = {path.relative_to(SAMPLE_KB / "redis").as_posix() for path in (SAMPLE_KB / "redis").rglob("*.md")}
    for case in report["cases"]:
        assert set(case["b"]["evidence"]) <= redis
    assert report["changed"]["first document"] >= 1  # the questions about other folders

    argv = ["compare", "--from-traces", "--sidecar", "--state-dir", state, "--out", str(tmp_path / "sidecar")]
    assert main(argv) == 0
    report = json.loads((tmp_path / "sidecar" / "traffic.json").read_text())
    assert report["b"].startswith("sidecar")
    for case in report["cases"]:
        b = case["b"]
        assert "status" not in b, b  # the stock retriever ran beside every lookup
        assert b["found"] and 1 <= len(b["evidence"]) <= sample_settings.evidence.max_evidence_blocks
