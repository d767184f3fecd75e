"""The ``tool_invocation`` table, and one row as JSON-ready data."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, Integer, String, Text, insert
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: The tool a row records by default.
TOOL_NAME = "lookup_knowledge"


class Base(DeclarativeBase):
    """The trace tables' metadata."""


class ToolInvocation(Base):
    """One ``lookup_knowledge`` call: the query as kept, when, how long, what it found, and its compact trace."""

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
INSERT = insert(ToolInvocation)


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
