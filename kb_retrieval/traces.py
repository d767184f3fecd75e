"""The ``tool_invocation`` table: one compact row per ``lookup_knowledge`` call, through SQLAlchemy.

A SQLite file in the state directory by default; any SQLAlchemy URL (PostgreSQL, MySQL) for a shared deployment.
``retrieval_details`` holds the modular pipeline's trace (query transform, every retrieval attempt, rerank trace,
context pack summary, evidence summaries with content truncated) and never the full evidence content.

Rows are written by a few background threads. By default a lookup does not wait for its row: the row joins a
bounded queue and the lookup returns (``trace_recorded = true`` then says the row was accepted). Every accepted row
is either committed or its loss is logged and counted (``TraceStore.failures``), never silently dropped: a write
error is logged by the writer, and :meth:`TraceStore.close` (and, for a store left open, the end of the process)
waits while the database takes rows and gives up, logs and counts whatever is left once it has taken none for
``timeout_s``. Readers (:meth:`TraceStore.rows`, :meth:`TraceStore.count`) first wait for the rows accepted before
them, so a lookup's row is visible to the next read. A full queue (the
database far slower than the lookups) makes a lookup wait up to ``timeout_s`` for room; then its row is given up
(logged, counted, ``trace_recorded = false``). With ``wait=True`` (``KB_TRACE_WAIT``) a lookup instead waits for
its row's commit, at most ``timeout_s`` (``KB_TRACE_TIMEOUT_S``) plus a small margin, and ``trace_recorded`` says
whether it was committed. A failing trace store never fails a lookup.

The query text can be kept in full, hashed or redacted (``KB_TRACE_QUERY``); text a database cannot store (NUL in
PostgreSQL text, lone surrogates anywhere) is stored with U+FFFD in its place.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import hashlib
import logging
import math
import os
import queue
import re
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    Integer,
    String,
    Text,
    create_engine,
    event,
    func,
    insert,
    select,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import StaticPool

from kb_retrieval.beside import disabled_entry
from kb_retrieval.config import Settings, mask_secrets, url_secrets
from kb_retrieval.models import LookupResult

log = logging.getLogger(__name__)
TOOL_NAME = "lookup_knowledge"
QueryMode = Literal["full", "hash", "redact"]
#: A database that honours its own timeout reports its error within this margin of it; then the lookup moves on.
WAIT_MARGIN_S = 0.25
#: Background writer threads per store: writes to a hung database occupy them; later rows wait (bounded) in a queue.
WRITERS = 4
#: Rows a store holds for its writers at most (a few hundred KB); when full, a lookup waits up to ``timeout_s``.
QUEUE_ROWS = 1000
_SURROGATE = re.compile("[\ud800-\udfff]")


class Base(DeclarativeBase):
    pass


class ToolInvocation(Base):
    __tablename__ = "tool_invocation"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tool_name: Mapped[str] = mapped_column(String(64), index=True)
    query: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), index=True)
    duration_ms: Mapped[float] = mapped_column(Float)
    found: Mapped[bool] = mapped_column(Boolean)
    evidence_status: Mapped[str] = mapped_column(String(32))
    retrieval_layer: Mapped[str] = mapped_column(String(16))
    retrieval_details: Mapped[dict[str, Any]] = mapped_column(JSON)


#: How a row is written (the ORM reads rows back; writing needs none of its bookkeeping).
_INSERT = insert(ToolInvocation)


def retrieval_details(
    result: LookupResult, content_chars: int = 160, sidecar: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The compact trace of one call (snake_case keys, as the spec names them).

    ``sidecar`` is the compact run of a comparison retriever (``kb_retrieval.beside``) when one ran beside the
    lookup; without one the entry says ``disabled``.
    """
    hints = result.query_transform.hints
    transform = result.query_transform.model_dump(mode="json")
    return {
        "query_transform": transform,
        "l0_hints": {
            "keywords": hints.matched_keywords,
            "domains": hints.domains,
            "entities": hints.entities,
            "titles": hints.matched_titles,
            "title_coverage": hints.title_coverage,
        },
        "retrieval_trace": result.retrieval_trace.model_dump(mode="json"),
        "fallback_reason": result.retrieval_trace.fallback_reason,
        "rerank_trace": result.rerank_trace.model_dump(mode="json"),
        "context_pack_summary": result.context_pack.summary.model_dump(mode="json"),
        "evidence_blocks": [
            {
                "source": b.source,
                "title": b.title,
                "breadcrumb": b.breadcrumb,
                "retrieval_layer": b.retrieval_layer,
                "score": b.score,
                "similarity": b.similarity,
                "hit_reasons": b.hit_reasons,
                "content_preview": b.content[:content_chars],
                "content_truncated": len(b.content) > content_chars,
            }
            for b in result.evidence_blocks
        ],
        "candidate_count": result.retrieval_trace.candidate_count,
        "final_count": result.retrieval_trace.final_count,
        "relevance_level": result.relevance_level,
        "completeness_hint": result.completeness_hint,
        "stage_ms": result.stage_ms,
        "sidecar": sidecar if sidecar is not None else disabled_entry(),
    }


class TraceStoreError(ValueError):
    """The trace store's URL cannot be used (not a URL, an unknown database, its driver missing) or its database
    cannot be read: one line naming it, the password masked."""


def _unusable(exc: Exception) -> str:
    """Why ``create_engine`` refused a URL, with the fix where one is known."""
    if isinstance(exc, ModuleNotFoundError):
        return (
            f"its database driver is not installed (no module {exc.name!r}): install it, or name an installed one "
            "in the URL (e.g. mysql+pymysql://, postgresql+psycopg://)"
        )
    if type(exc).__name__ == "NoSuchModuleError":
        return f"no such database type ({_first_line(exc)}): use sqlite:///, postgresql+psycopg://, mysql+pymysql://"
    if type(exc).__name__ == "ArgumentError":
        return "not a database URL (dialect+driver://user:password@host:port/database)"
    return f"{type(exc).__name__}: {_first_line(exc)}"


class TraceStore:
    """Writes and reads ``tool_invocation`` rows. Thread-safe; SQLite writes are serialised.

    ``timeout_s`` bounds how long one write may wait on the database: SQLite's busy timeout on a locked file; on
    PostgreSQL the connect, lock and statement timeouts. It also bounds every wait of a caller: for room in a full
    queue, for a row's commit (``wait=True``), for the queue to drain at :meth:`close`. A write that runs out of it
    fails like any other (logged, counted) and the lookup answers regardless. ``wait``: whether :meth:`record` waits
    for the commit (``KB_TRACE_WAIT``) or returns once the row is queued (the default). ``queue_rows``: how many rows
    may wait for the writers. ``query_mode``: how the query text is kept (``full``, ``hash``, ``redact``). Build one
    from settings with :meth:`from_settings`.

    Example:
        >>> store = TraceStore("sqlite://", query_mode="hash")
        >>> store.stored_query("RedisMemoryHigh on cache-01")[:15]
        'sha256:a6c43cee'
    """

    def __init__(
        self,
        url: str,
        *,
        content_chars: int = 160,
        query_chars: int = 4000,
        timeout_s: float = Settings.model_fields["trace_timeout_s"].default,
        query_mode: QueryMode = "full",
        wait: bool = False,
        queue_rows: int = QUEUE_ROWS,
    ) -> None:
        self.url = url
        self.content_chars = content_chars
        self.query_chars = query_chars
        self.timeout_s = timeout_s
        self.query_mode = query_mode
        self.wait = wait
        self.failures = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()  # serialises SQLite writes
        self._state_lock = threading.Lock()  # guards failures/last_error, writers, outstanding rows; never held on I/O
        self._schema_lock = threading.Lock()  # schema creation (talks to the database, so apart from the above)
        self._jobs: queue.Queue[_Job | None] = queue.Queue(maxsize=queue_rows)
        self._outstanding: set[_Job] = set()  # accepted rows not yet written, failed or given up
        self._settled = 0  # rows settled so far: progress, while the queue drains
        self._writers: list[threading.Thread] = []
        self._is_sqlite = url.startswith("sqlite")
        if self._is_sqlite and url.startswith("sqlite:///") and url != "sqlite:///:memory:":
            try:
                _create_private(Path(url.removeprefix("sqlite:///")))
            except OSError as exc:  # unusable location: every write will fail and be counted; lookups still answer
                log.error("trace store %s: cannot create its file: %s", self._safe_url(), exc)
        # An in-memory SQLite database lives in its connection: one connection shared by every thread (writes are
        # serialised below), not one per thread, each with a database of its own that has no table.
        in_memory = self._is_sqlite and url in ("sqlite://", "sqlite:///:memory:")
        try:
            self.engine: Engine = create_engine(
                url,
                connect_args=_connect_args(url, timeout_s),
                pool_pre_ping=not self._is_sqlite,
                **({"poolclass": StaticPool} if in_memory else {}),
            )
        except Exception as exc:  # not a URL, an unknown database, a driver not installed: a setting to fix
            raise TraceStoreError(f"trace store {self._safe_url()} (KB_TRACE_DB_URL): {_unusable(exc)}") from None
        if self._is_sqlite:
            busy_ms = int(timeout_s * 1000)
            event.listen(self.engine, "connect", lambda conn, _record: _sqlite_pragmas(conn, busy_ms))
        self._ready = False
        _OPEN_STORES.add(self)  # rows still queued when the process ends are written then (or counted as lost)

    def _ensure_schema(self) -> None:
        if not self._ready:
            with self._schema_lock:  # two threads creating the table at once fail on PostgreSQL
                if not self._ready:
                    Base.metadata.create_all(self.engine)
                    self._ready = True

    @classmethod
    def from_settings(cls, settings: Settings) -> TraceStore:
        """The store the settings describe (URL, preview sizes, timeout, waiting, query mode)."""
        return cls(
            settings.resolved_trace_db_url(),
            content_chars=settings.trace_content_chars,
            query_chars=settings.max_query_chars,
            timeout_s=settings.trace_timeout_s,
            query_mode=settings.trace_query,
            wait=settings.trace_wait,
        )

    def record(
        self,
        query: str,
        result: LookupResult,
        *,
        tool_name: str = TOOL_NAME,
        sidecar: dict[str, Any] | None = None,
        wait: bool | None = None,
    ) -> bool:
        """Write one row, in the background. On failure log and count it; never raise.

        ``wait`` (default: the store's ``wait``) False: True once the row is queued; its write, done by a writer
        thread, is committed or logged and counted as a failure. A full queue is waited on for room at most
        ``timeout_s``; then the row is given up (logged, counted) and this returns False.

        ``wait`` True: True only when the row was committed; this waits at most ``timeout_s`` + :data:`WAIT_MARGIN_S`.
        A write not done by then is given up: not started or not yet committed, it is rolled back and never lands (so
        False is the truth); in the one case of a database hanging during the commit itself, the outcome cannot be
        known in time and is logged as such.

        The row is built here, from the result as it is now. ``sidecar``: the ``retrieval_details.sidecar`` entry
        when a sidecar ran beside the lookup.
        """
        waits = self.wait if wait is None else wait
        deadline = time.monotonic() + self.timeout_s + WAIT_MARGIN_S
        row = {  # the columns of one ToolInvocation, written by a Core INSERT (a third of an ORM flush's CPU)
            "tool_name": tool_name,
            # PostgreSQL text cannot hold NUL; the JSON details keep it (escaped).
            "query": self.stored_query(query[: self.query_chars]).replace("\x00", "\ufffd"),
            "created_at": dt.datetime.now(dt.timezone.utc),
            "duration_ms": round(result.elapsed_ms, 3),
            "found": result.found,
            "evidence_status": result.evidence_status.value,
            "retrieval_layer": result.retrieval_layer,
            "retrieval_details": self._details(result, sidecar),
        }
        job = _Job(row, detached=not waits)
        if not self._enqueue(job):
            return False
        if not waits:
            return True
        waited = self.timeout_s + WAIT_MARGIN_S
        if not job.done.wait(max(0.0, deadline - time.monotonic())):
            with job.lock:
                in_doubt = job.state == "committing"
                if not in_doubt:
                    job.state = "abandoned"  # the writer rolls it back, or never starts it
            if in_doubt:
                self._failed(f"TimeoutError: the commit was unanswered after {waited:g} s (the row may be recorded)")
            else:
                self._settle(job)
                self._failed(f"TimeoutError: the trace database did not answer within {waited:g} s")
            return False
        if job.state == "abandoned":  # given up by close() meanwhile, which counted it
            return False
        if job.error is not None:
            self._failed(f"{type(job.error).__name__}: {_first_line(job.error)}")
            return False
        return True

    def _enqueue(self, job: _Job) -> bool:
        """Hand the row to the writers; when the queue stays full for ``timeout_s``, give it up (logged, counted)."""
        self._start_writers()
        with self._state_lock:
            self._outstanding.add(job)
        try:
            self._jobs.put(job, timeout=self.timeout_s)
        except queue.Full:
            self._settle(job)
            self._failed(
                f"QueueFull: {self._jobs.maxsize} rows were already waiting for the trace database; this one was given "
                f"up after {self.timeout_s:g} s"
            )
            return False
        return True

    def _settle(self, job: _Job) -> None:
        """The row is written, failed or given up: nothing waits for it any more."""
        job.done.set()
        with self._state_lock:
            self._outstanding.discard(job)
            self._settled += 1

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every row accepted so far is written, failed or given up (at most ``timeout_s``, by default
        the store's ``timeout_s`` + :data:`WAIT_MARGIN_S`); True when none is left waiting. Gives nothing up."""
        deadline = time.monotonic() + (self.timeout_s + WAIT_MARGIN_S if timeout_s is None else timeout_s)
        with self._state_lock:
            pending = list(self._outstanding)
        return all(job.done.wait(max(0.0, deadline - time.monotonic())) for job in pending)

    def _give_up_pending(self, why: str) -> None:
        """Give up the rows still waiting (they are rolled back or never started, so they never land later), and log
        and count them; a row whose commit is under way is counted as in doubt."""
        with self._state_lock:
            pending = list(self._outstanding)
        lost = in_doubt = 0
        for job in pending:
            with job.lock:
                if job.done.is_set() or job.state == "abandoned":
                    continue
                if job.state == "committing":
                    in_doubt += 1
                    continue
                job.state = "abandoned"
            self._settle(job)
            lost += 1
        if lost:
            self._failed(f"TimeoutError: {lost} row(s) still waiting for the trace database {why}: given up", lost)
        if in_doubt:
            self._failed(f"TimeoutError: {in_doubt} commit(s) unanswered {why} (the rows may be recorded)", in_doubt)

    def _details(self, result: LookupResult, sidecar: dict[str, Any] | None) -> dict[str, Any]:
        """``retrieval_details`` with the query texts in the store's query mode and only storable text."""
        details = retrieval_details(result, self.content_chars, sidecar)
        if self.query_mode != "full":  # the query is in the transform (as given and normalised) and in each attempt
            transform = details["query_transform"]
            for key in ("original_query", "normalized_query"):
                transform[key] = self.stored_query(transform[key])
            for attempt in details["retrieval_trace"]["attempts"]:
                attempt["query"] = self.stored_query(attempt["query"])
        return _storable(details)

    def stored_query(self, text: str) -> str:
        """The query as trace rows keep it: in full, as ``sha256:<hex>``, or as ``[redacted: N characters]``."""
        if self.query_mode == "hash":
            return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        if self.query_mode == "redact":
            return f"[redacted: {len(text)} characters]"
        return _SURROGATE.sub("\ufffd", text)

    def _failed(self, message: str, rows: int = 1) -> None:
        with self._state_lock:
            self.failures += rows
            failures = self.failures
            self.last_error = message
        log.error(
            "trace store %s: could not record lookup (%d failures so far): %s",
            self._safe_url(),
            failures,
            mask_secrets(message, url_secrets(self.url)),
        )

    def _start_writers(self) -> None:
        if self._writers:
            return
        with self._state_lock:
            while len(self._writers) < WRITERS:
                # Daemon threads: a write stuck on a hung database never keeps the process from exiting (rows still
                # queued at exit are written, or given up and counted, by the atexit hook below).
                thread = threading.Thread(target=self._write_jobs, name="kb-trace-writer", daemon=True)
                thread.start()
                self._writers.append(thread)

    def _write_jobs(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self._write(job)
            finally:
                self._settle(job)

    def _write(self, job: _Job) -> None:
        with job.lock:
            if job.state == "abandoned":
                return
            job.state = "writing"
        try:
            with self._sqlite_serialised():
                self._ensure_schema()
                with self.engine.connect() as connection:
                    connection.execute(_INSERT, job.row)  # what a locked or hung database holds up
                    with job.lock:
                        abandoned = job.state == "abandoned"
                        if not abandoned:
                            job.state = "committing"
                    if abandoned:
                        connection.rollback()  # the caller was already told the row is not recorded
                    else:
                        connection.commit()
        except Exception as exc:
            job.error = exc
            with job.lock:
                given_up = job.state == "abandoned"  # whoever gave it up counted it
            if job.detached and not given_up:  # nobody waits for this row: its loss is reported here
                self._failed(f"{type(exc).__name__}: {_first_line(exc)}")

    def rows(self, limit: int | None = None) -> list[ToolInvocation]:
        """The rows in the order written; rows this store accepted before the call are waited for (bounded)."""
        self.flush()
        with self._sqlite_serialised():
            self._ensure_schema()
            with Session(self.engine) as session:
                stmt = select(ToolInvocation).order_by(ToolInvocation.id)
                if limit is not None:
                    stmt = stmt.limit(limit)
                return list(session.scalars(stmt))

    def latest(self, limit: int) -> list[ToolInvocation]:
        """The ``limit`` most recent rows, newest first; rows this store accepted before the call are waited for.
        Raises ``TraceStoreError`` (one line, the URL masked) when the database cannot be read."""
        self.flush()
        try:
            with self._sqlite_serialised():
                self._ensure_schema()
                with Session(self.engine) as session:
                    stmt = select(ToolInvocation).order_by(ToolInvocation.id.desc()).limit(limit)
                    return list(session.scalars(stmt))
        except SQLAlchemyError as exc:
            raise TraceStoreError(f"cannot read the trace store {self._safe_url()}: {_first_line(exc)}") from None

    def count(self) -> int:
        """How many rows the table holds; rows this store accepted before the call are waited for (bounded)."""
        self.flush()
        with self._sqlite_serialised():
            self._ensure_schema()
            with Session(self.engine) as session:
                return int(session.scalar(select(func.count()).select_from(ToolInvocation)) or 0)

    def _sqlite_serialised(self) -> contextlib.AbstractContextManager[object]:
        return self._lock if self._is_sqlite else contextlib.nullcontext()

    def _safe_url(self) -> str:
        """The URL as logs show it: its password and secret query parameters masked (a password may hold spaces)."""
        return mask_secrets(self.url, url_secrets(self.url))

    def close(self) -> None:
        """Write the queued rows (while the database takes them: a database that takes none for ``timeout_s`` +
        :data:`WAIT_MARGIN_S` has the rest given up, logged and counted), stop the writer threads once idle and
        release the connections. A closed store can record again."""
        self._drain("when the store was closed")
        with self._state_lock:
            for _ in self._writers:
                with contextlib.suppress(queue.Full):  # writers stuck on a hung database: daemon threads, left
                    self._jobs.put_nowait(None)
            self._writers = []
        self.engine.dispose()

    def _drain(self, why: str) -> None:
        """Wait for the accepted rows while the database keeps taking them; once none has been settled for
        ``timeout_s`` + :data:`WAIT_MARGIN_S`, give up the rest (logged, counted)."""
        while True:
            settled = self._settled
            if self.flush():
                return
            if self._settled == settled:
                self._give_up_pending(f"{why} (none settled for {self.timeout_s + WAIT_MARGIN_S:g} s)")
                return


def row_dict(row: ToolInvocation, *, details: bool = True) -> dict[str, Any]:
    """One row as JSON-ready data (what ``kb-retrieval traces --json`` prints and ``GET /v1/traces`` answers): its
    columns, with ``retrieval_details`` when ``details``."""
    created = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=dt.timezone.utc)
    out: dict[str, Any] = {
        "id": row.id,
        "tool_name": row.tool_name,
        "query": row.query,
        "created_at": created.isoformat(),
        "duration_ms": row.duration_ms,
        "found": row.found,
        "evidence_status": row.evidence_status,
        "retrieval_layer": row.retrieval_layer,
    }
    if details:
        out["retrieval_details"] = row.retrieval_details
    return out


class _Job:
    """One row on its way to the database, and what became of it. ``detached``: nobody waits for it, so the writer
    reports its failure."""

    def __init__(self, row: dict[str, Any], *, detached: bool) -> None:
        self.row = row
        self.detached = detached
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.state: Literal["queued", "writing", "committing", "abandoned"] = "queued"
        self.error: Exception | None = None


_OPEN_STORES: weakref.WeakSet[TraceStore] = weakref.WeakSet()


@atexit.register
def _drain_open_stores() -> None:
    """At the end of the process (the writers are daemon threads), write the rows every store still holds, or, once
    its database takes none for ``timeout_s``, give them up, logged and counted: a lookup that returned before its
    row was written never loses it silently."""
    for store in list(_OPEN_STORES):
        store._drain("at the end of the process")


def _create_private(path: Path) -> None:
    """Create the SQLite file readable and writable by its owner only (SQLite gives its -wal and -shm files the
    same mode). An existing file keeps its mode: that is its owner's choice."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _storable(value: Any) -> Any:
    """``value`` (JSON details) with lone surrogates, which no database stores, replaced by U+FFFD."""
    if isinstance(value, str):
        return value if value.isascii() else _SURROGATE.sub("\ufffd", value)  # most are ASCII: no surrogate
    if isinstance(value, dict):
        return {key: _storable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_storable(item) for item in value]
    return value


def _connect_args(url: str, timeout_s: float) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {"timeout": timeout_s, "check_same_thread": False}
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":  # libpq parameters, for psycopg and psycopg2 alike
        ms = max(1, int(timeout_s * 1000))
        given = parsed.query.get("options") or ""  # the URL's own ?options=... (a search_path, say) are kept
        given = " ".join(given) if isinstance(given, tuple) else given
        args: dict[str, Any] = {"options": f"{given} -c lock_timeout={ms} -c statement_timeout={ms}".strip()}
        if "connect_timeout" not in parsed.query:
            args["connect_timeout"] = max(2, math.ceil(timeout_s))  # libpq's minimum is 2 s
        return args
    return {}


def _first_line(exc: Exception) -> str:
    """The error without SQLAlchemy's appended statement and parameters (the whole row would be logged)."""
    lines = str(exc).strip().splitlines()
    return lines[0][:500] if lines else ""


def _sqlite_pragmas(dbapi_connection: Any, busy_ms: int) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={int(busy_ms)}")  # first: the WAL switch below may itself wait
    cursor.execute("PRAGMA journal_mode=WAL")
    # In WAL mode NORMAL syncs at checkpoints, not at every commit: a committed row survives a crash of the process;
    # only an OS crash or power loss can drop the last rows, never corrupt the file (and a commit is no fsync).
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
