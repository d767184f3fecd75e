"""The tool_invocation trace store on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import pytest

from kb_retrieval.traces import TraceStore

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


def test_unavailable_store_does_not_fail_the_lookup(sample_settings, embed_model, tmp_path, caplog):
    from kb_retrieval.engine import KnowledgeLookup

    store = TraceStore("postgresql+psycopg://nobody:secret@127.0.0.1:9/none")
    lookup = KnowledgeLookup(sample_settings, embed_model=embed_model, trace_store=store)
    result = lookup.lookup(ALERT)
    assert result.found and result.trace_recorded is False
    assert store.failures == 1 and "OperationalError" in (store.last_error or "")
    assert "could not record lookup" in caplog.text and "secret" not in caplog.text


def test_sqlite_commits_without_an_fsync_each(tmp_path):
    store = TraceStore(f"sqlite:///{tmp_path / 'traces.db'}")
    with store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL: synced at checkpoints
    store.close()
