"""The ``vectorstore`` path: LlamaIndex ``MilvusVectorStore`` attached to the existing collection.

The store is told our field names (``text_key``, ``embedding_field``, ``output_fields``) and never manages the
schema or index (``IndexManagement.NO_VALIDATION``). Filters go in as our own escaped expression (``string_expr``)
rather than ``MetadataFilters``, whose values the store pastes into the expression unescaped.

The store's client is created with the connect timeout, and its ``search`` carries the search deadline
(``milvus_search_timeout_s``): ``MilvusVectorStore.query`` has no timeout of its own, and a hung server would
otherwise hold the lookup for a minute or more. Reconnecting after a server restart is pymilvus' own.
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any

import numpy as np
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.vector_stores.types import VectorStoreQuery
from llama_index.vector_stores.milvus import MilvusVectorStore
from llama_index.vector_stores.milvus.base import IndexManagement

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.milvus import client_options
from kb_retrieval.retrieval.l1.base import HybridRequest, L1Search, one_version_per_source, output_fields, to_candidate
from kb_retrieval.retrieval.l1.full_text import fetched_and_scored, milvus_hybrid_search

dispatcher = get_dispatcher(__name__)
_CALL_TIMEOUT: contextvars.ContextVar[float | None] = contextvars.ContextVar("kb_search_timeout", default=None)


class VectorStoreUnavailableError(RuntimeError):
    """The MilvusVectorStore could not be created for the collection."""


def make_vector_store(settings: KBSettings) -> MilvusVectorStore:
    """A ``MilvusVectorStore`` on the existing collection, its searches bounded by the lookup's deadline."""
    store = MilvusVectorStore(
        uri=settings.resolved_milvus_uri(),
        token=settings.storage.milvus_token.get_secret_value(),
        collection_name=settings.storage.collection,
        dim=settings.schema_fields.dim,
        text_key=settings.schema_fields.content_field,
        embedding_field=settings.schema_fields.vector_field,
        doc_id_field=settings.schema_fields.source_field,
        output_fields=[f for f in output_fields(settings) if f != settings.schema_fields.content_field],
        similarity_metric=settings.schema_fields.metric,
        index_management=IndexManagement.NO_VALIDATION,
        consistency_level="Strong",
        use_async_client=False,
        timeout=settings.storage.milvus_timeout_s,  # to the store's MilvusClient: the connect timeout
        **client_options(settings),
    )
    client = store.client
    search = client.search

    def search_with_deadline(*args: Any, **kwargs: Any) -> Any:
        # MilvusVectorStore.query passes no timeout on: the lookup's remaining time arrives through a context var.
        return search(*args, timeout=_CALL_TIMEOUT.get() or settings.storage.milvus_search_timeout_s, **kwargs)

    client.search = search_with_deadline
    return store


class VectorStorePath:
    """Dense search through LlamaIndex's ``MilvusVectorStore``; hybrid search and reads by key on its client."""

    name = "vectorstore"

    def __init__(self, settings: KBSettings, store: MilvusVectorStore | None = None) -> None:
        self.settings = settings
        self._store = store
        self._lock = threading.Lock()

    @property
    def store(self) -> MilvusVectorStore:
        """Created on first use, so an unavailable store is a per-call failure that ``auto`` can route around."""
        with self._lock:
            if self._store is None:
                self._store = make_vector_store(self.settings)
            return self._store

    @dispatcher.span
    def search(
        self, embedding: list[float], top_k: int, filter_expr: str | None, timeout: float | None = None
    ) -> L1Search:
        token = _CALL_TIMEOUT.set(timeout)
        try:
            result = self.store.query(
                VectorStoreQuery(query_embedding=embedding, similarity_top_k=top_k),
                string_expr=filter_expr or "",
            )
        finally:
            _CALL_TIMEOUT.reset(token)
        similarities = result.similarities or []
        ids = result.ids or []
        candidates = [
            to_candidate(
                self.settings,
                chunk_id=chunk_id,
                raw_score=score,
                fields=node.metadata,
                content=node.get_content(),
                path="vectorstore",
            )
            for node, score, chunk_id in zip(result.nodes or [], similarities, ids, strict=True)
        ]
        return L1Search(candidates=one_version_per_source(candidates), path="vectorstore")

    @dispatcher.span
    def hybrid_search(self, request: HybridRequest, timeout: float | None = None) -> L1Search:
        """Dense and BM25 in one ``hybrid_search`` call on the store's own client.

        Not through ``MilvusVectorStore.query``: its HYBRID mode returns only fused scores (neither cosine nor BM25)
        and its TEXT_SEARCH mode fails on Milvus Lite; the request and the scores are :mod:`.full_text`'s.
        """
        return milvus_hybrid_search(self.store.client, self.settings, request, timeout, "vectorstore")

    @dispatcher.span
    def fetch(
        self, embedding: list[float], filter_expr: str, timeout: float | None = None
    ) -> tuple[L1Search, dict[str, np.ndarray]]:
        """The chunks ``filter_expr`` selects, read by key on the store's own client and scored here
        (:func:`.full_text.fetched_and_scored`): ``MilvusVectorStore`` reads no vectors by key."""
        return fetched_and_scored(self.store.client, self.settings, embedding, filter_expr, timeout, "vectorstore")
