"""The tool_invocation trace store on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.traces import TraceStore
from kb_retrieval.traces.details import storable

ALERT = "MySQLReplicationLag: replica is 340 seconds behind"


def _roundtrip(store: TraceStore, sample_lookup) -> None:
    result = sample_lookup.lookup(ALERT)
    before = store.count()
    assert store.record(ALERT, result) is True
    row = store.rows()[-1]
    assert store.count() == before + 1
    assert row.tool_name == "lookup_knowledge" and row.query == ALERT and row.found is True
    assert row.retrieval_layer == result.retrieval_layer and row.duration_ms > 0
    details = row.retrieval_details
    assert details["evidence_blocks"][0]["source"] == result.evidence_blocks[0].source
    assert details["retrieval_trace"]["attempts"][0]["filtered"] is True


def test_sqlite_store(tmp_path, sample_lookup):
    _roundtrip(TraceStore(f"sqlite:///{tmp_path / 'traces.db'}"), sample_lookup)


@pytest.mark.postgres
def test_postgres_store(postgres_url, sample_lookup):
    _roundtrip(TraceStore(postgres_url), sample_lookup)


@pytest.mark.parametrize("wait", [False, True], ids=["queued", "waited"])
def test_unavailable_store_does_not_fail_the_lookup(sample_settings, embed_model, tmp_path, caplog, wait):
    from kb_retrieval.engine import KnowledgeLookup

    store = TraceStore("postgresql+psycopg://nobody:secret@127.0.0.1:9/none", wait=wait)
    lookup = KnowledgeLookup(sample_settings, embed_model=embed_model, trace_store=store)
    result = lookup.lookup(ALERT)
    # Queued: accepted, and its loss is counted once the writer fails; waited for: not recorded.
    assert result.found and result.trace_recorded is (not wait)
    assert store.flush()
    assert store.failures == 1 and "OperationalError" in (store.last_error or "")
    assert "could not record lookup" in caplog.text and "secret" not in caplog.text


def test_sqlite_commits_without_an_fsync_each(tmp_path):
    store = TraceStore(f"sqlite:///{tmp_path / 'traces.db'}")
    with store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL: synced at checkpoints
    store.close()


# --- what a row keeps of the query (issue 14 item 4) ----------------------------------------------------------------

SECRET_ALERT = "MySQLReplicationLag: replica db-secret-host-77 is 340 seconds behind (password=hunter2)"


@pytest.mark.parametrize("mode", ["hash", "redact"])
def test_query_text_can_be_hashed_or_redacted(tmp_path, sample_settings, embed_model, mode):
    from kb_retrieval.engine import KnowledgeLookup

    settings = sample_settings.model_copy(
        update={"trace_db_url": f"sqlite:///{tmp_path / 'traces.db'}", "trace_query": mode}
    )
    store = TraceStore.from_settings(settings)
    lookup = KnowledgeLookup(settings, embed_model=embed_model, trace_store=store)
    result = lookup.lookup(SECRET_ALERT)
    assert result.found and result.trace_recorded
    assert result.query_transform.original_query == SECRET_ALERT  # the answer itself is untouched
    row = store.rows()[-1]
    stored = json.dumps([row.query, row.retrieval_details], ensure_ascii=False)
    for secret in ("db-secret-host-77", "hunter2", "340 seconds"):
        assert secret not in stored
    raw = (tmp_path / "traces.db").read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("traces.db-*"))
    assert b"db-secret-host-77" not in raw  # nor anywhere in the database files
    if mode == "hash":
        digest = "sha256:" + hashlib.sha256(SECRET_ALERT.encode()).hexdigest()
        assert row.query == digest == row.retrieval_details["query_transform"]["original_query"]
    else:
        assert row.query == f"[redacted: {len(SECRET_ALERT)} characters]"
    # the rest of the trace is kept
    assert row.retrieval_details["evidence_blocks"][0]["source"] == result.evidence_blocks[0].source
    store.close()


def test_full_query_text_is_the_default(tmp_path, sample_lookup):
    store = TraceStore.from_settings(KBSettings(state_dir=tmp_path))
    assert store.query_mode == "full"
    result = sample_lookup.lookup(SECRET_ALERT)
    assert store.record(SECRET_ALERT, result) and store.rows()[-1].query == SECRET_ALERT


def test_trace_query_setting_from_environment(monkeypatch):
    assert TraceStore.from_settings(KBSettings()).wait is False  # rows are queued unless a lookup must wait for them
    monkeypatch.setenv("KB_TRACE_QUERY", "hash")
    monkeypatch.setenv("KB_TRACE_TIMEOUT_S", "0.7")
    monkeypatch.setenv("KB_TRACE_WAIT", "true")
    store = TraceStore.from_settings(KBSettings())
    assert (store.query_mode, store.timeout_s, store.wait) == ("hash", 0.7, True)


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_sqlite_trace_file_is_readable_by_its_owner_only(tmp_path, sample_lookup):
    old_umask = os.umask(0o022)  # a usual umask, which would give 0644
    try:
        store = TraceStore(f"sqlite:///{tmp_path / 'state' / 'traces.db'}")
        assert store.record(ALERT, sample_lookup.lookup(ALERT)) and store.flush()  # written under that umask
    finally:
        os.umask(old_umask)
    files = sorted(p.name for p in (tmp_path / "state").iterdir())
    assert "traces.db" in files and "traces.db-wal" in files
    for name in files:
        assert stat.S_IMODE((tmp_path / "state" / name).stat().st_mode) == 0o600, name
    store.close()


def test_lookup_builds_its_trace_store_from_the_settings(sample_settings, embed_model, tmp_path):
    from kb_retrieval.engine import KnowledgeLookup

    settings = sample_settings.model_copy(
        update={"trace_query": "redact", "trace_timeout_s": 0.9, "trace_db_url": f"sqlite:///{tmp_path / 't.db'}"}
    )
    lookup = KnowledgeLookup(settings, embed_model=embed_model)
    assert (lookup.traces.query_mode, lookup.traces.timeout_s) == ("redact", 0.9)
    lookup.lookup(ALERT)
    assert ALERT not in lookup.traces.rows()[-1].query
    lookup.close()


@pytest.mark.unit
def test_storable_replaces_lone_surrogates_at_any_depth_and_keeps_everything_else() -> None:
    details = {
        "query": "etcd \ud800 down",
        "found": True,
        "score": 0.5,
        "count": 3,
        "none": None,
        "ascii": "RedisMemoryHigh",
        "unicode": "über",
        "nested": [{"reasons": ["l0_keyword:etcd", "content_match:\udfff"]}, [1.5, "ok", "\ud83d"]],
    }
    stored = storable(details)
    assert stored == {
        **details,
        "query": "etcd \ufffd down",
        "nested": [{"reasons": ["l0_keyword:etcd", "content_match:\ufffd"]}, [1.5, "ok", "\ufffd"]],
    }
    assert stored["nested"] is not details["nested"] and stored["nested"][0] is not details["nested"][0]
    assert details["query"] == "etcd \ud800 down"  # the details themselves are left as they are


def test_a_row_holds_the_result_as_recorded_not_as_changed_after(tmp_path, sample_lookup):
    # The writer thread finishes the row's details after record() returns: what the caller changes in the result
    # meanwhile (the engine adds the trace write's own clock to stage_ms) must not reach the row.
    store = TraceStore(f"sqlite:///{tmp_path / 'traces.db'}", wait=False)
    result = sample_lookup.lookup(ALERT)
    assert result.evidence_blocks and result.query_transform.hints.matched_keywords
    written = json.loads(json.dumps(storable(json.loads(result.model_dump_json()))))
    assert store.record(ALERT, result) is True
    result.stage_ms["after_the_record"] = 1.0  # no call between: the writer thread cannot run before these
    result.evidence_blocks[0].hit_reasons.append("changed:after")
    result.query_transform.hints.matched_keywords.append("changed-after")
    result.query_transform.hints.title_coverage["changed/after.md"] = 1.0
    assert store.flush()
    details = store.rows()[-1].retrieval_details
    assert details["stage_ms"] == written["stage_ms"]
    assert details["evidence_blocks"][0]["hit_reasons"] == written["evidence_blocks"][0]["hit_reasons"]
    assert details["l0_hints"]["keywords"] == written["query_transform"]["hints"]["matched_keywords"]
    assert details["l0_hints"]["title_coverage"] == written["query_transform"]["hints"]["title_coverage"]
    store.close()
