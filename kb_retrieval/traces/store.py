"""The trace store: the database behind the ``tool_invocation`` table (any SQLAlchemy URL; SQLite by default, its file
private to its owner), writing rows through the writer threads (:mod:`.writer`) and reading them back.

See :mod:`kb_retrieval.traces` for what a store promises about every accepted row.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, func, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from kb_retrieval.config import KBSettings
from kb_retrieval.masking import mask_secrets, url_secrets
from kb_retrieval.models import LookupResult
from kb_retrieval.settings import TraceSettings
from kb_retrieval.traces.details import QueryMode, private_details, retrieval_details, stored_query
from kb_retrieval.traces.schema import INSERT, TOOL_NAME, Base, ToolInvocation
from kb_retrieval.traces.writer import QUEUE_ROWS, WAIT_MARGIN_S, Job, RowWriter

# The package's logger: what a store logs is the trace store's, whichever of its modules says it.
log = logging.getLogger("kb_retrieval.traces")


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
        timeout_s: float = TraceSettings.model_fields["timeout_s"].default,
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
        self._state_lock = threading.Lock()  # guards failures/last_error; never held on I/O
        self._schema_lock = threading.Lock()  # schema creation (talks to the database, so apart from the above)
        self._writer = RowWriter(self._write, self._failed, timeout_s=timeout_s, queue_rows=queue_rows)
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

    def _ensure_schema(self) -> None:
        if not self._ready:
            with self._schema_lock:  # two threads creating the table at once fail on PostgreSQL
                if not self._ready:
                    Base.metadata.create_all(self.engine)
                    self._ready = True

    @classmethod
    def from_settings(cls, settings: KBSettings) -> TraceStore:
        """The store the settings describe (URL, preview sizes, timeout, waiting, query mode)."""
        return cls(
            settings.resolved_trace_db_url(),
            content_chars=settings.trace.content_chars,
            query_chars=settings.retrieval.max_query_chars,
            timeout_s=settings.trace.timeout_s,
            query_mode=settings.trace.query,
            wait=settings.trace.wait,
        )

    def record(
        self,
        query: str,
        result: LookupResult,
        *,
        tool_name: str = TOOL_NAME,
        sidecar: dict[str, Any] | None = None,
        wait: bool | None = None,
        scoring_profile: str | None = None,
    ) -> bool:
        """Write one row, in the background. On failure log and count it; never raise.

        ``wait`` (default: the store's ``wait``) False: True once the row is queued; its write, done by a writer
        thread, is committed or logged and counted as a failure. A full queue is waited on for room at most
        ``timeout_s``; then the row is given up (logged, counted) and this returns False.

        ``wait`` True: True only when the row was committed; this waits at most ``timeout_s`` + :data:`WAIT_MARGIN_S`.
        A write not done by then is given up: not started or not yet committed, it is rolled back and never lands (so
        False is the truth); in the one case of a database hanging during the commit itself, the outcome cannot be
        known in time and is logged as such.

        The row is built here, from the result as it is now (its details hold no object of the result, so what the
        caller changes later is not written); the writer thread makes its text storable and its query private
        (:func:`~kb_retrieval.traces.details.private_details`), beside the caller's next work rather than in its
        lookup. ``sidecar``: the ``retrieval_details.sidecar`` entry when a sidecar ran beside the lookup;
        ``scoring_profile``: the version of the profile that ranked it.
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
            "retrieval_details": retrieval_details(result, self.content_chars, sidecar, scoring_profile),
        }
        job = Job(row, detached=not waits)
        if not self._writer.enqueue(job):
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
                self._writer.settle(job)
                self._failed(f"TimeoutError: the trace database did not answer within {waited:g} s")
            return False
        if job.state == "abandoned":  # given up by close() meanwhile, which counted it
            return False
        if job.error is not None:
            self._failed(f"{type(job.error).__name__}: {_first_line(job.error)}")
            return False
        return True

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every row accepted so far is written, failed or given up (at most ``timeout_s``, by default
        the store's ``timeout_s`` + :data:`~kb_retrieval.traces.writer.WAIT_MARGIN_S`); True when none is left
        waiting. Gives nothing up."""
        return self._writer.flush(timeout_s)

    def stored_query(self, text: str) -> str:
        """The query as trace rows keep it: in full, as ``sha256:<hex>``, or as ``[redacted: N characters]``."""
        return stored_query(text, self.query_mode)

    def _failed(self, message: str, rows: int = 1) -> None:
        """Log and count ``rows`` lost rows (never raises: a failing store never fails a lookup)."""
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

    def _write(self, job: Job) -> None:
        with job.lock:
            if job.state == "abandoned":
                return
            job.state = "writing"
        try:
            # The details in the store's query mode and with only storable text: done here, not in the lookup.
            row = {**job.row, "retrieval_details": private_details(job.row["retrieval_details"], self.query_mode)}
            with self._sqlite_serialised():
                self._ensure_schema()
                with self.engine.connect() as connection:
                    connection.execute(INSERT, row)  # what a locked or hung database holds up
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
        self._writer.drain("when the store was closed")
        self._writer.stop()
        self.engine.dispose()


def _create_private(path: Path) -> None:
    """Create the SQLite file readable and writable by its owner only (SQLite gives its -wal and -shm files the
    same mode). An existing file keeps its mode: that is its owner's choice."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


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
