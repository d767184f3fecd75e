"""The query model checked against the collection when a lookup is built, so a wrong model is one clear error at
construction rather than failed searches (another dimension) or silently wrong neighbours (another model).

- **Dimension**: one probe embedding from the query model against the dimension of the collection's vector field.
- **Model**: :func:`model_id` of the query model against the id ingest recorded
  (:mod:`kb_retrieval.indexing.ingest_record`). The ONNX export of a model counts as that model. A collection
  without a record (an older ingest, another tool), or a model that names no id, is accepted with a note.

Example:
    >>> model_id(load_embed_model())  # doctest: +SKIP
    'bundled:all-MiniLM-L6-v2'
"""

from __future__ import annotations

import logging
import os
from typing import Any

from pymilvus import MilvusClient

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.embeddings import BUNDLED_MODEL, bundled_model_path

log = logging.getLogger(__name__)

_PROBE = "embedding dimension probe"
#: ``BaseEmbedding.model_name``'s default: a model that names no id.
_UNNAMED = {"", "unknown"}


class EmbeddingMismatchError(ValueError):
    """The query model does not fit the collection (dimension or model id); the message names both sides."""


def model_id(model: Any) -> str:
    """A stable id of an embedding model: ``bundled:all-MiniLM-L6-v2`` for the bundled model (torch or its ONNX
    export), the real path of a local model folder, else its ``model_name`` (``''`` when it names none)."""
    name = str(getattr(model, "model_name", "") or "")
    if " export of " in name and type(model).__name__ == "OnnxQueryEmbedding":
        name = name.split(" export of ", 1)[1]
    if name in _UNNAMED:
        return ""
    if name == BUNDLED_MODEL:
        return BUNDLED_MODEL
    if os.path.isdir(name):
        path = os.path.realpath(name)
        return BUNDLED_MODEL if path == os.path.realpath(bundled_model_path()) else path
    return name


def collection_dim(client: MilvusClient, settings: KBSettings) -> int | None:
    """The dimension of the collection's vector field (None when it has none by that name)."""
    for f in client.describe_collection(settings.storage.collection).get("fields", []):
        if f.get("name") == settings.schema_fields.vector_field:
            dim = f.get("params", {}).get("dim")
            return int(dim) if dim is not None else None
    return None


def check_query_model(client: MilvusClient, settings: KBSettings, model: Any, recorded: str) -> list[str]:
    """Raise :class:`EmbeddingMismatchError` when ``model`` cannot query the collection; else the notes on what
    could not be checked (empty when everything was)."""
    notes = []
    querying = model_id(model)
    expected = collection_dim(client, settings)
    try:
        dim = len(model.get_query_embedding(_PROBE))
    except Exception as exc:  # a model that cannot embed a probe: every lookup will say so; not checked here
        dim = None
        notes.append(f"query model dimension not checked: {type(exc).__name__}: {str(exc)[:200]}")
    if expected is not None and dim is not None and dim != expected:
        raise EmbeddingMismatchError(
            f"query model {querying or type(model).__name__!r} gives {dim}-d vectors but collection "
            f"'{settings.storage.collection}' field '{settings.schema_fields.vector_field}' holds {expected}-d vectors"
        )
    if not recorded:
        notes.append(f"embedding model not checked: collection '{settings.storage.collection}' has no recorded model")
    elif not querying:
        notes.append(f"embedding model not checked: the query model ({type(model).__name__}) names no model id")
    elif querying != recorded:
        raise EmbeddingMismatchError(
            f"collection '{settings.storage.collection}' was embedded with {recorded!r} at ingest, but the "
            f"query model is {querying!r}: query with the same model (embed_model=...) or ingest again"
        )
    for note in notes:
        log.info("%s", note)
    return notes
