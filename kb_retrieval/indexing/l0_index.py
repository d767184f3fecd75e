"""The L0 index: per document its title, keywords, category, entities and headings, stored in Milvus beside the chunks.

Ingest writes one row per document into a companion collection ``<collection>_l0``, the way it writes chunks:
per document, keyed by the source id, only what changed, and deletes only rows of the folders it ingests. So any
host pointed at the same Milvus reads the same L0 index, a killed ingest converges on the next run, and two ingests
into one collection at once cannot lose each other's entries (issue 14 item 8). A collection written by another
tool has no companion: loading it gives an empty index whose ``enabled`` is False.

The JSON file in the state dir (``KBSettings.l0_index_path()``) is a local copy ingest refreshes after writing, for
readers of :meth:`L0Index.load`; :meth:`L0Index.load_from_milvus` reads Milvus itself.

Example:
    >>> l0 = L0Index.load_from_milvus(connect(settings), settings)  # doctest: +SKIP
    >>> l0.enabled, len(l0.documents), l0.index_version  # doctest: +SKIP
    (True, 42, '3f1c0a9e2b7d4c55:8e1f2a3b4c5d')
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from pymilvus import DataType, MilvusClient

from kb_retrieval.atomic import atomic_write, remove_stale_temporaries
from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.index_version import index_version
from kb_retrieval.indexing.milvus import (
    SIDE_VECTOR,
    SIDE_VECTOR_FIELD,
    VARCHAR_LIMITS,
    companion_problem,
    ensure_side_collection,
    iter_rows,
)
from kb_retrieval.knowledge.loader import KbDocument, LoadedKnowledgeBase

#: Suffix of the companion collection holding the L0 index of ``<collection>``.
L0_COLLECTION_SUFFIX = "_l0"
#: Byte budget of one entry's JSON: Milvus refuses a JSON value over 64 KiB. Headings, then entities, then
#: keywords are cut from the end until an entry fits (documents with thousands of headings).
L0_ENTRY_MAX_BYTES = 60_000
KB_MAX_BYTES = 4096
#: Rows written or deleted per Milvus call.
WRITE_BATCH = 500


class L0Entry(BaseModel):
    """What L0 knows of one document: its knowledge base, title, category, keywords, entities and headings."""

    kb: str
    title: str
    category: str | None = None
    keywords: list[str] = Field(default_factory=list)
    entities: list[str] = Field(default_factory=list)
    headings: list[str] = Field(default_factory=list)


class L0Index(BaseModel):
    """The L0 entries by source id, and where they came from.

    ``content_hash`` digests the companion rows the index was read from (deterministic: the same documents give
    the same hash). ``index_version``, ``enabled`` and ``off_reason`` describe the load and are not written to the
    file: ``index_version`` is :func:`~kb_retrieval.indexing.index_version.index_version` as read *before* the
    rows, so a later different value means the index may be stale.
    """

    version: int = 1
    content_hash: str = ""
    documents: dict[str, L0Entry] = Field(default_factory=dict)
    index_version: str = Field(default="", exclude=True)
    enabled: bool = Field(default=True, exclude=True)
    off_reason: str | None = Field(default=None, exclude=True)

    @classmethod
    def load(cls, path: Path) -> L0Index:
        """The index saved at ``path``, or an empty one when none has been written yet."""
        if not path.exists():
            return cls()
        return cls.model_validate_json(path.read_text(encoding="utf-8"))

    @classmethod
    def load_from_milvus(cls, client: MilvusClient, settings: KBSettings) -> L0Index:
        """The L0 index of ``settings.storage.collection`` as stored in Milvus (any host reads the same).

        Without a companion collection (a collection written by another tool, or by a kb-retrieval older than the
        companion), an empty index with ``enabled=False`` and the reason in ``off_reason``.
        """
        version = index_version(client, settings)  # first: a write after this shows as a newer version
        name = l0_collection_name(settings)
        problem = companion_problem(client, name, _L0_FIELD_NAMES)
        if problem:
            return cls(
                enabled=False,
                off_reason=f"collection '{settings.storage.collection}' has no L0 index ({problem}): L0 hints "
                "and domain filters are off until `kb-retrieval ingest` writes it",
                index_version=version,
            )
        client.load_collection(name)
        documents: dict[str, L0Entry] = {}
        hashes: dict[str, str] = {}
        for row in iter_rows(client, settings, ["source", "row_hash", "entry"], collection=name):
            documents[row["source"]] = L0Entry.model_validate(row["entry"])
            hashes[row["source"]] = row["row_hash"]
        return cls(
            content_hash=content_hash(hashes),
            documents=dict(sorted(documents.items())),
            index_version=version,
        )

    def save(self, path: Path) -> None:
        """Write atomically: a temporary file in the same folder, then a rename.

        Temporary files a killed run left behind are removed first.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        payload = json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=1, ensure_ascii=False)
        with atomic_write(path) as handle:
            handle.write(payload + "\n")

    def replace_kb(self, kb: str, documents: list[KbDocument]) -> None:
        """Make the entries of one KB folder exactly ``documents``; other folders' entries are kept."""
        self.documents = {source: entry for source, entry in self.documents.items() if entry.kb != kb}
        for doc in documents:
            self.documents[doc.source_id] = entry_for(doc, kb)
        self.documents = dict(sorted(self.documents.items()))


def entry_for(doc: KbDocument, kb: str) -> L0Entry:
    """The L0 entry of one document, cut to fit a Milvus JSON value (the same cut on every path)."""
    entry = L0Entry(
        kb=kb,
        title=doc.title,
        category=doc.category,
        keywords=list(doc.keywords),
        entities=list(doc.entities),
        headings=list(doc.headings),
    )
    for field in ("headings", "entities", "keywords"):
        values: list[str] = getattr(entry, field)
        while values and len(entry.model_dump_json().encode()) > L0_ENTRY_MAX_BYTES:
            values.pop()
    return entry


def l0_collection_name(settings: KBSettings) -> str:
    """The companion collection holding the L0 index of ``settings.storage.collection``."""
    return settings.storage.collection + L0_COLLECTION_SUFFIX


def _l0_fields(schema: Any) -> None:
    schema.add_field("source", DataType.VARCHAR, is_primary=True, max_length=VARCHAR_LIMITS["source"])
    schema.add_field("kb", DataType.VARCHAR, max_length=KB_MAX_BYTES)
    schema.add_field("doc_hash", DataType.VARCHAR, max_length=64)
    schema.add_field("row_hash", DataType.VARCHAR, max_length=64)
    schema.add_field("entry", DataType.JSON)


#: What a companion collection must have to be read as one.
_L0_FIELD_NAMES = {"source", "kb", "doc_hash", "row_hash", "entry"}


def ensure_l0_collection(client: MilvusClient, settings: KBSettings) -> str:
    """Create the companion collection when missing, and load it; returns its name."""
    name = l0_collection_name(settings)
    ensure_side_collection(client, settings, name, _l0_fields)
    return name


def l0_row(doc: KbDocument, kb: str, chunk_ids: Iterable[str]) -> dict[str, Any]:
    """The companion row of one document. ``row_hash`` covers everything a reader caches from it: the entry, the
    document's hash and its chunk ids (so a change of chunking changes it too)."""
    entry = entry_for(doc, kb).model_dump(mode="json")
    digest = json.dumps(
        {"kb": kb, "doc_hash": doc.content_hash, "entry": entry, "chunks": sorted(chunk_ids)},
        sort_keys=True,
        ensure_ascii=False,
    )
    return {
        "source": doc.source_id,
        "kb": kb,
        "doc_hash": doc.content_hash,
        "row_hash": hashlib.sha256(digest.encode()).hexdigest(),
        "entry": entry,
    }


def write_l0(
    client: MilvusClient,
    settings: KBSettings,
    kbs: Sequence[LoadedKnowledgeBase],
    chunk_ids: dict[str, list[str]],
) -> int:
    """Make the companion rows of each KB folder exactly its documents; returns the rows written plus deleted.

    Per document and convergent: a row is upserted only when its ``row_hash`` differs, and only rows of the
    folders given here are deleted, so a concurrent ingest of another folder keeps its entries.
    """
    name = ensure_l0_collection(client, settings)
    rows = iter_rows(client, settings, ["source", "kb", "row_hash"], collection=name)
    existing = {row["source"]: row for row in rows}
    upserts: list[dict[str, Any]] = []
    deletes: list[str] = []
    for kb in kbs:
        current = set()
        for doc in kb.documents:
            current.add(doc.source_id)
            row = l0_row(doc, kb.kb_id, chunk_ids.get(doc.source_id, ()))
            if existing.get(doc.source_id, {}).get("row_hash") != row["row_hash"]:
                upserts.append({**row, SIDE_VECTOR_FIELD: list(SIDE_VECTOR)})
        if kb.complete:  # documents handed in by a program are upserted: the root may hold others
            deletes += sorted(s for s, row in existing.items() if row["kb"] == kb.kb_id and s not in current)
    for start in range(0, len(upserts), WRITE_BATCH):
        client.upsert(name, upserts[start : start + WRITE_BATCH])
    for start in range(0, len(deletes), WRITE_BATCH):
        client.delete(name, ids=deletes[start : start + WRITE_BATCH])
    return len(upserts) + len(deletes)


def content_hash(row_hashes: dict[str, str]) -> str:
    """A digest of the companion rows (source and row hash of each), the same for the same documents."""
    digest = hashlib.sha256()
    for source in sorted(row_hashes):
        digest.update(f"{source}\x00{row_hashes[source]}\n".encode())
    return digest.hexdigest()[:16]


def l0_content_hash(client: MilvusClient, settings: KBSettings) -> str:
    """:func:`content_hash` of the companion collection as it is now ('' when it does not exist)."""
    name = l0_collection_name(settings)
    if not client.has_collection(name):
        return ""
    rows = iter_rows(client, settings, ["source", "row_hash"], collection=name)
    return content_hash({row["source"]: row["row_hash"] for row in rows})
