"""What ingest records beside the index version, in the same meta collection: which embedding model wrote the
vectors, which knowledge-base folders the sources are relative to, and which metadata keys the chunks carry.

A lookup reads it once when it is built: the model id is checked against the one querying
(:mod:`kb_retrieval.indexing.model_check`), the roots map a stock node's absolute ``file_path`` to a source id
(:func:`source_id_for`), and the keys are what a ``MetadataFilters`` scope may name
(:mod:`kb_retrieval.retrieval.scope`). A collection from an older ingest (or another tool) has no record: every
part is empty, and the checks that need it say so instead of failing.

Rows (key -> value): ``embed_model`` -> the model id; ``root:<hash>`` -> an absolute KB folder;
``field:<name>`` -> ``metadata`` (a key of the chunks' JSON metadata).

Example:
    >>> record = read_ingest_record(client, settings)  # doctest: +SKIP
    >>> record.embed_model  # doctest: +SKIP
    'bundled:all-MiniLM-L6-v2'
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pymilvus import MilvusClient

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.index_version import ensure_meta_collection, meta_collection_name
from kb_retrieval.indexing.milvus import SIDE_VECTOR, SIDE_VECTOR_FIELD
from kb_retrieval.retrieval.filters import string_literal

log = logging.getLogger(__name__)

MODEL_KEY = "embed_model"
ROOT_PREFIX = "root:"
FIELD_PREFIX = "field:"
_MAX_VALUE = 1024  # the meta collection's value length
_MAX_KEY = 64


@dataclass(frozen=True)
class IngestRecord:
    """The record of the ingests into a collection (empty parts: not recorded)."""

    embed_model: str = ""
    roots: tuple[str, ...] = ()
    metadata_keys: frozenset[str] = field(default_factory=frozenset)


def record_ingest(
    client: MilvusClient,
    settings: KBSettings,
    *,
    embed_model: str | None,
    roots: Iterable[str | Path],
    metadata_keys: Iterable[str],
) -> None:
    """Add this ingest's roots and metadata keys to the record, and set the model id when given."""
    name = ensure_meta_collection(client, settings)
    rows = []
    if embed_model:
        rows.append((MODEL_KEY, embed_model))
    for root in roots:
        path = os.path.realpath(root)
        rows.append((_root_key(path), path))
    rows += [(FIELD_PREFIX + key, "metadata") for key in sorted(set(metadata_keys))]
    kept = [(k, v) for k, v in rows if len(k) <= _MAX_KEY and len(v) <= _MAX_VALUE]
    if len(kept) < len(rows):
        log.warning(
            "ingest record: %d entries too long for the meta collection were not recorded", len(rows) - len(kept)
        )
    if kept:
        client.upsert(name, [{"key": k, "value": v, SIDE_VECTOR_FIELD: list(SIDE_VECTOR)} for k, v in kept])


def _root_key(path: str) -> str:
    return ROOT_PREFIX + hashlib.sha256(path.encode()).hexdigest()[:16]


def forget_root(client: MilvusClient, settings: KBSettings, root: str | Path) -> None:
    """Take a root out of the record (``kb-retrieval ingest --remove-root``)."""
    name = meta_collection_name(settings)
    if client.has_collection(name):
        client.delete(name, ids=[_root_key(os.path.realpath(root))])


def read_ingest_record(client: MilvusClient, settings: KBSettings) -> IngestRecord:
    """The record, or an empty one when the collection has none (or it cannot be read: logged)."""
    name = meta_collection_name(settings)
    try:
        if not client.has_collection(name):
            return IngestRecord()
        client.load_collection(name)
        rows = client.query(
            name,
            filter=f'key == {string_literal(MODEL_KEY)} or key like "{ROOT_PREFIX}%" or key like "{FIELD_PREFIX}%"',
            output_fields=["key", "value"],
        )
    except Exception as exc:  # an unreadable record disables the checks that need it, never the lookup
        log.warning("the ingest record in %s cannot be read: %s", name, exc)
        return IngestRecord()
    values = {str(r["key"]): str(r["value"]) for r in rows}
    return IngestRecord(
        embed_model=values.get(MODEL_KEY, ""),
        roots=tuple(sorted(v for k, v in values.items() if k.startswith(ROOT_PREFIX))),
        metadata_keys=frozenset(k[len(FIELD_PREFIX) :] for k in values if k.startswith(FIELD_PREFIX)),
    )


def source_id_for(file_path: str, roots: Iterable[str]) -> str | None:
    """The source id of an absolute ``file_path`` under one of ``roots`` (relative to it, ``/``-separated), or
    None when it is under none. The longest root wins (a KB folder inside another)."""
    path = os.path.realpath(file_path)
    for root in sorted(roots, key=len, reverse=True):
        if path.startswith(root.rstrip(os.sep) + os.sep):
            return Path(path).relative_to(root).as_posix()
    return None
