"""A trace database that is locked, unusable or drops its connections: the lookup still answers, and every lost row
is reported (logged and counted in ``TraceStore.failures``), never silently dropped. SQLite and PostgreSQL; rows
queued in the background (the default) and rows a lookup waits for (``KB_TRACE_WAIT``)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, text

from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.retrieval.query_check import EmptyQueryError
from kb_retrieval.traces import WAIT_MARGIN_S, WRITERS, TraceStore
from tests.reliability.conftest import KNOWN_QUERIES, check_result

QUERY, SOURCE = next(iter(KNOWN_QUERIES.items()))
LOCK_TIMEOUT_S = 0.4


@contextmanager
def locked(url: str) -> Iterator[None]:
    """Hold the trace table exclusively from another connection (another process would do the same)."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=1, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    engine = create_engine(url)
    with engine.connect() as conn:
        transaction = conn.begin()
        conn.execute(text("LOCK TABLE tool_invocation IN ACCESS EXCLUSIVE MODE"))
        try:
            yield
        finally:
            transaction.rollback()
    engine.dispose()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("wait", [False, True], ids=["queued", "waited"])
def test_locked_store_lookup_answers_and_the_loss_is_counted(trace_url, sample_settings, embed_model, caplog, wait):
    store = TraceStore(trace_url, timeout_s=LOCK_TIMEOUT_S, wait=wait)
    lookup = KnowledgeLookup(sample_settings, embed_model=embed_model, trace_store=store)
    assert lookup.lookup(QUERY).trace_recorded  # the table exists (and SQLite is in WAL mode) before the lock
    assert store.count() == 1
    caplog.set_level(logging.ERROR, logger="kb_retrieval.traces")

    with locked(trace_url):
        started = time.monotonic()
        result = lookup.lookup(QUERY)
        seconds = time.monotonic() - started
        second = lookup.lookup(QUERY)
        if not wait:  # the lookups answered before their rows were settled; the writes then fail on the lock
            assert not store.flush(timeout_s=0)
            assert store.flush(timeout_s=LOCK_TIMEOUT_S * 2 + 15)

    check_result(result, sample_settings)
    assert result.found and result.evidence_blocks[0].source == SOURCE  # the lookup answered
    # Queued rows were accepted (their loss is counted below); a waited-for row says it was not committed.
    assert (result.trace_recorded, second.trace_recorded) == (not wait, not wait)
    assert store.failures == 2
    assert "locked" in (store.last_error or "").lower() or "timeout" in (store.last_error or "").lower()
    assert caplog.text.count("could not record lookup") == 2 and "(2 failures so far)" in caplog.text
    assert "retrieval_details" not in caplog.text  # the error's first line, not the whole row
    assert seconds < LOCK_TIMEOUT_S + 15, f"the lock held the lookup {seconds:.1f} s"

    after = lookup.lookup(QUERY)  # the lock is gone: recording resumes on the same store
    assert after.trace_recorded and store.failures == 2
    assert store.count() == 2  # one before, one after: the two lost rows are the two counted failures


@pytest.mark.parametrize("wait", [False, True], ids=["queued", "waited"])
def test_unusable_sqlite_location_still_answers(tmp_path, sample_settings, embed_model, caplog, wait):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the trace folder should be")
    store = TraceStore(f"sqlite:///{blocker / 'traces.db'}", wait=wait)  # constructing it must not fail the lookup
    lookup = KnowledgeLookup(sample_settings, embed_model=embed_model, trace_store=store)
    result = lookup.lookup(QUERY)
    assert result.found and result.trace_recorded is (not wait)
    assert store.flush()
    assert store.failures == 1 and "OperationalError" in (store.last_error or "")
    assert "could not record lookup" in caplog.text


@pytest.mark.postgres
def test_postgres_connections_killed_midrun_are_replaced(postgres_schema_url, sample_settings, embed_model):
    """A database restart or failover ends every pooled connection: the next write reconnects (pre-ping)."""
    trace_url = postgres_schema_url
    store = TraceStore(trace_url)
    lookup = KnowledgeLookup(sample_settings, embed_model=embed_model, trace_store=store)
    assert lookup.lookup(QUERY).trace_recorded and store.count() == 1  # written: its connection idle in the pool
    application = trace_url.rsplit("application_name=", 1)[1]
    admin = create_engine(trace_url.split("?", 1)[0])
    with admin.begin() as conn:
        ended = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = :app AND pid <> pg_backend_pid()"
            ),
            {"app": application},
        ).scalar_one()
    admin.dispose()
    assert ended >= 1
    assert lookup.lookup(QUERY).trace_recorded and store.failures == 0 and store.count() == 2


def test_query_with_nul_and_control_characters_is_recorded(trace_url, sample_settings, embed_model):
    """PostgreSQL text cannot hold NUL: the row keeps a replacement character, the JSON details the exact query."""
    store = TraceStore(trace_url)
    lookup = KnowledgeLookup(sample_settings, embed_model=embed_model, trace_store=store)
    query = "Redis\x00Memory\x1b[31mHigh\u202e on cache-01 \u0007 内存 высокая"
    result = lookup.lookup(query)
    assert result.trace_recorded, store.last_error
    row = store.rows()[-1]
    assert row.query == query.replace("\x00", "\ufffd")
    assert row.retrieval_details["query_transform"]["original_query"] == query
    assert "\x00" not in result.query_transform.normalized_query
    assert "\x1b" not in result.query_transform.normalized_query


@pytest.mark.parametrize("wait", [False, True], ids=["queued", "waited"])
def test_store_shared_by_threads_loses_no_row(trace_url, sample_lookup, wait) -> None:
    """Eight threads recording at once, on a file, on PostgreSQL and on an in-memory SQLite database (whose rows
    live in its one connection: a connection per thread would each see an empty database without the table)."""
    result = sample_lookup.lookup(QUERY)
    for url in (trace_url, "sqlite://"):
        store = TraceStore(url, wait=wait, timeout_s=30)  # correctness under contention, not the bound
        outcomes: list[bool] = []

        def work(store: TraceStore = store, outcomes: list[bool] = outcomes) -> None:
            outcomes.extend(store.record(f"{QUERY} #{i}", result) for i in range(40))

        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert outcomes.count(True) == 320 and store.flush() and store.failures == 0, (url, store.last_error)
        assert store.count() == 320 and len({row.query for row in store.rows()}) == 40
        store.close()


# --- a database that does not answer at all (issue 14 item 2) -----------------------------------------------------


@contextmanager
def silent_server() -> Iterator[int]:
    """A port whose server accepts connections and never answers: what a hung database looks like to a client."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        listener.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("wait", [False, True], ids=["queued", "waited"])
def test_hung_trace_database_holds_the_answer_only_briefly(tmp_path, sample_settings, embed_model, caplog, wait):
    """KBSettings.trace.timeout_s bounds every wait; libpq alone would wait out the URL's connect_timeout (20 s).

    Queued rows: the lookups do not wait at all, and closing the store gives up the rows the database never took,
    each counted. Waited-for rows: each lookup waits its bound and says its row was not recorded."""
    with silent_server() as port:
        settings = sample_settings.model_copy(
            update={
                "trace_db_url": f"postgresql+psycopg://kb:hunter2@127.0.0.1:{port}/traces?connect_timeout=20",
                "trace_timeout_s": 0.3,
                "trace_wait": wait,
            }
        )
        store = TraceStore.from_settings(settings)
        lookup = KnowledgeLookup(settings, embed_model=embed_model, trace_store=store)
        for _ in range(6):  # more lookups than writer threads: the later rows wait in the queue, bounded too
            started = time.monotonic()
            result = lookup.lookup(QUERY)
            waited = time.monotonic() - started
            assert result.found and result.evidence_blocks[0].source == SOURCE
            assert result.trace_recorded is (not wait)
            assert waited < 0.3 + 5, f"a hung trace database held the lookup {waited:.1f} s"
            assert result.stage_ms["trace_write"] < (0.3 + WAIT_MARGIN_S) * 1000 + 500
        if wait:
            assert store.failures == 6 and "did not answer within 0.55 s" in (store.last_error or "")
        else:
            assert store.failures == 0  # nothing is known yet: the writers still wait for the database
            started = time.monotonic()
            lookup.close()
            assert time.monotonic() - started < 0.3 + WAIT_MARGIN_S + 5
            assert store.failures == 6
            assert "6 row(s) still waiting for the trace database when the store was closed" in (store.last_error or "")
        assert "hunter2" not in caplog.text and "could not record lookup (6 failures so far)" in caplog.text


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_row_given_up_on_a_stopped_database_never_lands(postgres_schema_url, sample_lookup):
    """trace_recorded = false stays true: the database is frozen (SIGSTOP) mid-write, the lookup gives the row up,
    and when the database runs again the write is rolled back, not committed behind the result's back."""
    result = sample_lookup.lookup(QUERY)
    store = TraceStore(postgres_schema_url, timeout_s=0.5, wait=True)
    assert store.record(QUERY, result) and store.count() == 1  # a pooled connection, its backend known
    application = postgres_schema_url.rsplit("application_name=", 1)[1]
    admin = create_engine(postgres_schema_url.split("?", 1)[0])
    with admin.begin() as conn:
        pids = conn.execute(
            text("SELECT pid FROM pg_stat_activity WHERE application_name = :app AND pid <> pg_backend_pid()"),
            {"app": application},
        ).scalars()
        backends = list(pids)
    admin.dispose()
    assert backends
    try:
        for pid in backends:
            os.kill(pid, signal.SIGSTOP)
    except (PermissionError, ProcessLookupError) as error:  # a server on another host or of another user
        pytest.skip(f"cannot stop the PostgreSQL backend from here: {error}")
    try:
        started = time.monotonic()
        recorded = store.record(f"{QUERY} (frozen)", result)
        waited = time.monotonic() - started
    finally:
        for pid in backends:
            os.kill(pid, signal.SIGCONT)
    assert recorded is False and waited < 0.5 + 5
    assert store.failures == 1 and "did not answer" in (store.last_error or "")
    deadline = time.monotonic() + 10
    while _busy(store) and time.monotonic() < deadline:  # the released write finishing (its rollback)
        time.sleep(0.1)
    assert store.record(f"{QUERY} (after)", result)  # the store works again
    assert [row.query for row in store.rows()] == [QUERY, f"{QUERY} (after)"]  # the given-up row never landed
    store.close()


def _busy(store: TraceStore) -> bool:
    """True while a writer still holds a connection (the released write finishing its rollback)."""
    return store.engine.pool.checkedout() > 0


# --- text a database cannot store (issue 14 item 6) ----------------------------------------------------------------


def test_query_with_a_lone_surrogate_keeps_its_row(trace_url, sample_settings, embed_model):
    store = TraceStore(trace_url)
    lookup = KnowledgeLookup(sample_settings, embed_model=embed_model, trace_store=store)
    query = "RedisMemoryHigh \ud800 on cache-01 \udfff memory above maxmemory \ud83d\ude00"
    # A query that is not Unicode text is refused before any work (issue 40): no half-written row.
    before = len(store.rows())
    with pytest.raises(EmptyQueryError, match="lone surrogate"):
        lookup.lookup(query)
    assert len(store.rows()) == before
    assert store.failures == 0


# --- rows queued in the background: a full queue, a store closed or a process ended with rows still waiting ----------


@pytest.mark.timeout(120)
def test_full_queue_gives_the_row_up_after_the_bound(sample_lookup, caplog):
    """A database that takes no row: each writer holds one, the queue fills, and the next row waits at most
    timeout_s for room, then is given up (counted, logged, recorded = False). Closing gives up the rest, counted."""
    result = sample_lookup.lookup(QUERY)
    with silent_server() as port:
        store = TraceStore(
            f"postgresql+psycopg://kb@127.0.0.1:{port}/traces?connect_timeout=20", timeout_s=0.3, queue_rows=2
        )
        accepted = [store.record(f"{QUERY} #{i}", result) for i in range(WRITERS + 2)]
        started = time.monotonic()
        given_up = store.record(f"{QUERY} (no room)", result)
        waited = time.monotonic() - started
        assert accepted == [True] * (WRITERS + 2) and given_up is False
        assert 0.29 <= waited < 0.3 + 5
        assert store.failures == 1 and "2 rows were already waiting" in (store.last_error or "")
        store.close()
        assert store.failures == 1 + WRITERS + 2
        assert f"{WRITERS + 2} row(s) still waiting for the trace database when the store was closed" in caplog.text


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_queued_row_given_up_at_close_never_lands(postgres_schema_url, sample_lookup):
    """A row queued for a frozen database (SIGSTOP) is given up when the store closes (counted) and rolled back
    when the database runs again, not committed behind the count's back."""
    result = sample_lookup.lookup(QUERY)
    store = TraceStore(postgres_schema_url, timeout_s=0.5)
    assert store.record(QUERY, result) and store.count() == 1  # a pooled connection, its backend known
    backends = _backends(postgres_schema_url)
    try:
        for pid in backends:
            os.kill(pid, signal.SIGSTOP)
    except (PermissionError, ProcessLookupError) as error:  # a server on another host or of another user
        pytest.skip(f"cannot stop the PostgreSQL backend from here: {error}")
    try:
        assert store.record(f"{QUERY} (frozen)", result)  # accepted: the lookup does not wait
        started = time.monotonic()
        store.close()
        assert time.monotonic() - started < 0.5 + WAIT_MARGIN_S + 5
    finally:
        for pid in backends:
            os.kill(pid, signal.SIGCONT)
    assert store.failures == 1 and "when the store was closed" in (store.last_error or "")
    deadline = time.monotonic() + 10
    while _busy(store) and time.monotonic() < deadline:  # the released write finishing (its rollback)
        time.sleep(0.1)
    assert store.record(f"{QUERY} (after)", result)  # a closed store records again
    assert [row.query for row in store.rows()] == [QUERY, f"{QUERY} (after)"]  # the given-up row never landed
    store.close()


def _backends(url: str) -> list[int]:
    """PIDs of the PostgreSQL backends serving this test's connections (by their application name)."""
    application = url.rsplit("application_name=", 1)[1]
    admin = create_engine(url.split("?", 1)[0])
    with admin.begin() as conn:
        pids = conn.execute(
            text("SELECT pid FROM pg_stat_activity WHERE application_name = :app AND pid <> pg_backend_pid()"),
            {"app": application},
        ).scalars()
        backends = list(pids)
    admin.dispose()
    assert backends
    return backends


_CHILD = """
import sys
from pathlib import Path
from kb_retrieval.models import LookupResult
from kb_retrieval.traces import TraceStore
result = LookupResult.model_validate_json(Path(sys.argv[2]).read_text())
store = TraceStore(sys.argv[1], timeout_s=0.3)
print(sum(store.record(f"row {i}", result) for i in range(int(sys.argv[3]))), flush=True)
# no close(): the process ends with rows still queued
"""


@pytest.mark.timeout(120)
def test_rows_still_queued_when_the_process_ends_are_written_or_counted(tmp_path, sample_lookup):
    """The writers are daemon threads; an exit hook writes what they still hold, or gives it up and logs it."""
    import subprocess
    import sys

    result_file = tmp_path / "result.json"
    result_file.write_text(sample_lookup.lookup(QUERY).model_dump_json(), encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, url, str(result_file), "50"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "50", done.stderr
    assert TraceStore(url).count() == 50 and "could not record" not in done.stderr

    with silent_server() as port:  # a database that never answers: the hook gives up after timeout_s, logging it
        hung = f"postgresql+psycopg://kb@127.0.0.1:{port}/traces?connect_timeout=20"
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, hung, str(result_file), "3"], capture_output=True, text=True, timeout=60
        )
        seconds = time.monotonic() - started
    assert done.returncode == 0 and done.stdout.strip() == "3", done.stderr
    assert "could not record lookup (3 failures so far)" in done.stderr
    assert "3 row(s) still waiting for the trace database at the end of the process" in done.stderr
    assert seconds < 30
