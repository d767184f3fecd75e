"""The L1 retriever: a LlamaIndex ``BaseRetriever`` over one vector-store path.

``search`` is the pipeline's call (embedding given, optional category filter, path details returned);
``retrieve`` is the ordinary LlamaIndex face, returning ``NodeWithScore`` whose score is the normalised similarity
and whose stage data (:mod:`kb_retrieval.retrieval.stage`) carries the candidate with its raw score, label and path.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import NodeWithScore, QueryBundle
from pymilvus import MilvusClient

from kb_retrieval.config import Settings
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.retrieval.filters import equals_expr, in_expr
from kb_retrieval.retrieval.l1.auto import AutoPath
from kb_retrieval.retrieval.l1.base import HybridRequest, L1Search, VectorPath
from kb_retrieval.retrieval.l1.memory import MemoryMirror
from kb_retrieval.retrieval.l1.sdk import SdkPath
from kb_retrieval.retrieval.l1.vectorstore import VectorStorePath
from kb_retrieval.retrieval.stage import candidate_node


def make_path(settings: Settings, client: MilvusClient) -> VectorPath:
    """The configured path: ``vectorstore``, ``sdk`` or ``auto``."""
    if settings.vector_store_mode == "sdk":
        return SdkPath(client, settings)
    if settings.vector_store_mode == "vectorstore":
        return VectorStorePath(settings)
    return AutoPath(VectorStorePath(settings), SdkPath(client, settings))


class L1Retriever(BaseRetriever):
    """Dense retrieval over Milvus through one path, with an optional category filter.

    ``memory`` (the memory plan, :mod:`kb_retrieval.retrieval.l1.memory`): the collection mirrored in this process
    serves every search without a caller's scope instead of the path; ``None``, or a scoped search: the path
    searches Milvus.
    """

    def __init__(
        self,
        path: VectorPath,
        settings: Settings,
        embed_model: BaseEmbedding,
        *,
        category_filter: str | None = None,
        memory: MemoryMirror | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.path = path
        self.memory = memory
        self.settings = settings
        self.embed_model = embed_model
        self.category_filter = category_filter

    def filter_expr(self, category: str | None, ids: list[str] | None = None, scope: str | None = None) -> str | None:
        """The expression of one request: the caller's ``scope`` (a translated ``MetadataFilters``, always applied),
        the category hint and an id restriction, joined by AND."""
        parts = [f"({scope})"] if scope else []
        if category and self.settings.category_field:
            parts.append(equals_expr(self.settings.category_field, category))
        if ids:
            parts.append(in_expr(self.settings.id_field, ids))
        return " and ".join(parts) or None

    def search(
        self,
        embedding: list[float],
        category: str | None = None,
        top_k: int | None = None,
        ids: list[str] | None = None,
        timeout: float | None = None,
        scope: str | None = None,
    ) -> L1Search:
        """Dense search in Milvus; ``ids`` restricts it to those chunks (scoring lexical candidates in Milvus)."""
        limit = len(ids) if ids else top_k or self.settings.top_k
        memory = self.memory
        if memory is not None and scope is None:
            return memory.search(embedding, limit, category, ids)
        return self.path.search(embedding, limit, self.filter_expr(category, ids, scope), timeout)

    def hybrid_search(
        self,
        embedding: list[float],
        terms: str,
        category: str | None = None,
        timeout: float | None = None,
        ids: list[str] | None = None,
        scope: str | None = None,
    ) -> L1Search:
        """Dense (``top_k``) and BM25 (``lexical_top_k``) in one Milvus call, both under the category filter, and
        ``ids`` (the exact-identifier candidates) by a dense request restricted to them in the same call; the path must
        support it (:func:`~kb_retrieval.retrieval.l1.base.supports_hybrid`)."""
        memory = self.memory
        if memory is not None and scope is None:  # a caller's scope is a Milvus expression: Milvus evaluates it
            return memory.hybrid_search(embedding, terms, category, ids)
        request = HybridRequest(
            embedding,
            terms,
            self.settings.top_k,
            self.settings.lexical_top_k,
            self.filter_expr(category, scope=scope),
            ids_filter=self.filter_expr(category, ids, scope) if ids else None,
            ids_count=len(ids or []),
        )
        path: Any = self.path
        return path.hybrid_search(request, timeout)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        embedding = query_bundle.embedding or embed_query(self.embed_model, query_bundle.query_str)
        result = self.search(embedding, self.category_filter)
        return [candidate_node(c) for c in result.candidates]
