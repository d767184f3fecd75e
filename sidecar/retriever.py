"""The sidecar retriever: LlamaIndex's stock ``VectorIndexRetriever`` over ``MilvusVectorStore``, on the SAME
collection.

Built the way a LlamaIndex user would build it (``VectorStoreIndex.from_vector_store(...).as_retriever(...)``), with
the store attached to our collection exactly as the main ``vectorstore`` path attaches it
(:func:`kb_retrieval.retrieval.l1.vectorstore.make_vector_store`: our field names, no schema management). No L0
hints, no category filter, no rerank, no evidence threshold: it answers the raw query with Milvus's top chunks.

Example:
    >>> retriever = make_sidecar_retriever(KBSettings(state_dir=".kb-state/demo"), embed_model)  # doctest: +SKIP
    >>> retriever.retrieve("RedisMemoryHigh on cache-01")[0].node.metadata["source"]  # doctest: +SKIP
    'redis/memory-usage-high.md'
"""

from __future__ import annotations

from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.milvus import connect, ensure_collection
from kb_retrieval.retrieval.l1.vectorstore import make_vector_store


def make_sidecar_retriever(settings: KBSettings, embed_model: BaseEmbedding, top_k: int | None = None) -> BaseRetriever:
    """A ``VectorIndexRetriever`` over the configured collection, returning ``top_k`` chunks (default ``top_k``).

    Raises ``MilvusUnavailableError`` (server unreachable), ``SchemaMismatchError`` (collection missing or not
    matching the settings) or whatever creating the store raises: the runner reports it as ``unavailable``.
    """
    # MilvusVectorStore creates a collection that is missing: check (and load) ours first, as the main path does,
    # so the sidecar can only ever read an existing, matching collection.
    ensure_collection(connect(settings), settings, create=False)
    store = make_vector_store(settings)
    index = VectorStoreIndex.from_vector_store(store, embed_model=embed_model)
    return index.as_retriever(similarity_top_k=top_k or settings.retrieval.top_k)
