"""The ``tool_invocation`` table: one compact row per ``lookup_knowledge`` call, through SQLAlchemy.

A SQLite file in the state directory by default; any SQLAlchemy URL (PostgreSQL, MySQL) for a shared deployment.
``retrieval_details`` holds the modular pipeline's trace (query transform, every retrieval attempt, rerank trace,
context pack summary, evidence summaries with content truncated) and never the full evidence content.

A failing trace store never fails a lookup: the error is logged and counted (``TraceStore.failures``) and the
result says ``trace_recorded = false``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import threading
from pathlib import Path
from typing import Any

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
    select,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import StaticPool

from kb_retrieval.models import LookupResult

log = logging.getLogger(__name__)
TOOL_NAME = "lookup_knowledge"
#: ``retrieval_details.sidecar`` of a lookup without a sidecar run (see ``sidecar.models.SidecarRun.trace_entry``).
SIDECAR_DISABLED_REASON = "sidecar not enabled (KB_SIDECAR_ENABLED=false)"


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


def retrieval_details(
    result: LookupResult, content_chars: int = 160, sidecar: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The compact trace of one call (snake_case keys, as the spec names them).

    ``sidecar`` is the sidecar's compact run (status, reason, timings, top candidates) when one ran beside the
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
        "sidecar": sidecar if sidecar is not None else {"status": "disabled", "reason": SIDECAR_DISABLED_REASON},
    }


class TraceStore:
    """Writes and reads ``tool_invocation`` rows. Thread-safe; SQLite writes are serialised.

    ``timeout_s`` bounds how long one write may wait on the database: SQLite's busy timeout on a locked file; on
    PostgreSQL the connect, lock and statement timeouts. A write that runs out of it fails like any other (logged,
    counted, ``trace_recorded = false``) and the lookup answers regardless.
    """

    def __init__(self, url: str, *, content_chars: int = 160, query_chars: int = 4000, timeout_s: float = 30.0) -> None:
        self.url = url
        self.content_chars = content_chars
        self.query_chars = query_chars
        self.timeout_s = timeout_s
        self.failures = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()  # serialises SQLite writes
        self._state_lock = threading.Lock()  # guards failures/last_error and schema creation
        self._is_sqlite = url.startswith("sqlite")
        if self._is_sqlite and url.startswith("sqlite:///") and url != "sqlite:///:memory:":
            try:
                Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # unusable location: every write will fail and be counted; lookups still answer
                log.error("trace store %s: cannot create its folder: %s", url, exc)
        # An in-memory SQLite database lives in its connection: one connection shared by every thread (writes are
        # serialised below), not one per thread, each with a database of its own that has no table.
        in_memory = self._is_sqlite and url in ("sqlite://", "sqlite:///:memory:")
        self.engine: Engine = create_engine(
            url,
            connect_args=_connect_args(url, timeout_s),
            pool_pre_ping=not self._is_sqlite,
            **({"poolclass": StaticPool} if in_memory else {}),
        )
        if self._is_sqlite:
            busy_ms = int(timeout_s * 1000)
            event.listen(self.engine, "connect", lambda conn, _record: _sqlite_pragmas(conn, busy_ms))
        self._ready = False

    def _ensure_schema(self) -> None:
        if not self._ready:
            with self._state_lock:  # two threads creating the table at once fail on PostgreSQL
                if not self._ready:
                    Base.metadata.create_all(self.engine)
                    self._ready = True

    def record(
        self,
        query: str,
        result: LookupResult,
        *,
        tool_name: str = TOOL_NAME,
        sidecar: dict[str, Any] | None = None,
    ) -> bool:
        """Write one row; on failure log, count, and return False (the lookup still answers).

        ``sidecar``: the ``retrieval_details.sidecar`` entry when a sidecar ran beside the lookup.
        """
        row = ToolInvocation(
            tool_name=tool_name,
            # PostgreSQL text cannot hold NUL; the JSON details keep the query exactly (escaped).
            query=query[: self.query_chars].replace("\x00", "\ufffd"),
            created_at=dt.datetime.now(dt.timezone.utc),
            duration_ms=round(result.elapsed_ms, 3),
            found=result.found,
            evidence_status=result.evidence_status.value,
            retrieval_layer=result.retrieval_layer,
            retrieval_details=retrieval_details(result, self.content_chars, sidecar),
        )
        try:
            if self._is_sqlite:
                with self._lock:
                    self._write(row)
            else:
                self._write(row)
            return True
        except Exception as exc:
            message = f"{type(exc).__name__}: {_first_line(exc)}"
            with self._state_lock:
                self.failures += 1
                failures = self.failures
                self.last_error = message
            log.error(
                "trace store %s: could not record lookup (%d failures so far): %s", self._safe_url(), failures, message
            )
            return False

    def _write(self, row: ToolInvocation) -> None:
        self._ensure_schema()
        with Session(self.engine) as session, session.begin():
            session.add(row)

    def rows(self, limit: int | None = None) -> list[ToolInvocation]:
        with self._sqlite_serialised():
            self._ensure_schema()
            with Session(self.engine) as session:
                stmt = select(ToolInvocation).order_by(ToolInvocation.id)
                if limit is not None:
                    stmt = stmt.limit(limit)
                return list(session.scalars(stmt))

    def count(self) -> int:
        with self._sqlite_serialised():
            self._ensure_schema()
            with Session(self.engine) as session:
                return int(session.scalar(select(func.count()).select_from(ToolInvocation)) or 0)

    def _sqlite_serialised(self) -> contextlib.AbstractContextManager[object]:
        return self._lock if self._is_sqlite else contextlib.nullcontext()

    def _safe_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def close(self) -> None:
        self.engine.dispose()


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
