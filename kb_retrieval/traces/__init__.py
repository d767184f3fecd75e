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

One concern a module:

- :mod:`.schema`: the table and a row as JSON-ready data;
- :mod:`.details`: what a row says of a lookup (``retrieval_details``) and how it keeps the query (privacy);
- :mod:`.writer`: the writer threads, their bounded queue, and the drain at close and at the end of the process;
- :mod:`.store`: :class:`TraceStore`, the database (URL, timeouts, SQLite pragmas), writing and reading rows.
"""

from kb_retrieval.traces.details import QueryMode, retrieval_details
from kb_retrieval.traces.schema import TOOL_NAME, Base, ToolInvocation, row_dict
from kb_retrieval.traces.store import TraceStore, TraceStoreError
from kb_retrieval.traces.writer import QUEUE_ROWS, WAIT_MARGIN_S, WRITERS

__all__ = [
    "QUEUE_ROWS",
    "TOOL_NAME",
    "WAIT_MARGIN_S",
    "WRITERS",
    "Base",
    "QueryMode",
    "ToolInvocation",
    "TraceStore",
    "TraceStoreError",
    "retrieval_details",
    "row_dict",
]
