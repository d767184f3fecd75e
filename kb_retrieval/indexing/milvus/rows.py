"""Reading a collection's rows: all of them, or those a filter selects, in batches past Milvus' query window, or their
count, at strong consistency."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from pymilvus import MilvusClient

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.milvus.connection import quiet_lite_unimplemented_rpcs

#: Milvus' query window: offset + limit of one query at most this many rows.
QUERY_WINDOW = 16_384
#: Rows a page of :func:`iter_rows` reads: each page of Milvus Lite's query iterator costs ~0.2 s beside its rows
#: (a read of 100k chunks: ~29 s in pages of 2000, ~20 s in pages of 8000 or 16384; the same rows in the same order).
PAGE_ROWS = QUERY_WINDOW // 2


def iter_rows(
    client: MilvusClient,
    settings: KBSettings,
    output_fields: list[str],
    batch_size: int = PAGE_ROWS,
    *,
    collection: str | None = None,
) -> Any:
    """Every row of the collection (or of ``collection``), selected fields, at strong consistency (every write
    acknowledged before the call is seen), in batches past Milvus' query window.

    On a server a collection of fewer rows than half the query window is read in one query: the query iterator of
    Milvus 2.3 waits for the next time tick on every page (~1.3 s for 50 rows, measured), one strong query once.
    """
    name = collection or settings.storage.collection
    if settings.is_milvus_server():
        counted = client.query(name, filter="", output_fields=["count(*)"])
        if counted and int(counted[0]["count(*)"]) < QUERY_WINDOW // 2:
            rows = client.query(
                name, filter="", output_fields=output_fields, limit=QUERY_WINDOW, consistency_level="Strong"
            )
            if len(rows) < QUERY_WINDOW:  # all of them (rows written since the count are within the slack)
                yield from rows
                return
    yield from _iterated(client, name, "", output_fields, batch_size)


def rows_where(
    client: MilvusClient,
    settings: KBSettings,
    expr: str,
    output_fields: list[str],
    *,
    timeout: float | None = None,
    consistency_level: str | None = None,
    batch_size: int = PAGE_ROWS,
) -> list[dict[str, Any]]:
    """Every row of the collection that ``expr`` selects, selected fields: one query while they fit in Milvus' query
    window, else read again by the query iterator. A query returns at most the window and does not say that it cut
    (the sources of 50 documents of 330 chunks each fill it)."""
    name = settings.storage.collection
    level = {"consistency_level": consistency_level} if consistency_level else {}
    rows: list[dict[str, Any]] = client.query(
        name, filter=expr, output_fields=output_fields, limit=QUERY_WINDOW, timeout=timeout, **level
    )
    if len(rows) < QUERY_WINDOW:
        return rows
    return list(_iterated(client, name, expr, output_fields, batch_size, timeout=timeout))


def _iterated(
    client: MilvusClient,
    name: str,
    expr: str,
    output_fields: list[str],
    batch_size: int,
    *,
    timeout: float | None = None,
) -> Iterator[dict[str, Any]]:
    """The rows ``expr`` selects (every row when it is ""), page by page through the query iterator."""
    # Milvus Lite has no AllocTimestamp RPC; the iterator falls back to a client-side timestamp, which is correct
    # for our reads but logs a warning and a server-side error each time. Keep those out of the user's terminal.
    logging.getLogger("pymilvus.orm.iterator").setLevel(logging.ERROR)
    quiet_lite_unimplemented_rpcs()
    iterator = client.query_iterator(
        name, batch_size=batch_size, filter=expr, output_fields=output_fields, timeout=timeout
    )
    try:
        while batch := iterator.next():
            yield from batch
    finally:
        iterator.close()


def count_rows(client: MilvusClient, settings: KBSettings, *, collection: str | None = None) -> int:
    """The number of rows (chunks) the collection (or ``collection``) holds now.

    A ``count(*)`` query at strong consistency: a server's ``get_collection_stats`` counts only flushed segments
    (0 right after an ingest) and still counts deleted rows until compaction.
    """
    rows = client.query(
        collection or settings.storage.collection, filter="", output_fields=["count(*)"], consistency_level="Strong"
    )
    return int(rows[0]["count(*)"]) if rows else 0
