"""Reading a collection's rows: all of them in batches past Milvus' query window, or their count, at strong
consistency."""

from __future__ import annotations

import logging
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
    # Milvus Lite has no AllocTimestamp RPC; the iterator falls back to a client-side timestamp, which is correct
    # for our reads but logs a warning and a server-side error each time. Keep those out of the user's terminal.
    logging.getLogger("pymilvus.orm.iterator").setLevel(logging.ERROR)
    quiet_lite_unimplemented_rpcs()
    iterator = client.query_iterator(name, batch_size=batch_size, filter="", output_fields=output_fields)
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
