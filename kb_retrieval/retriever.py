"""The whole ``lookup_knowledge`` pipeline as a LlamaIndex ``BaseRetriever``.

Its nodes are the evidence: one per document, node id = the source id (so ``RetrieverEvaluator`` compares them
with golden ``expected_docs`` as they are), score = the similarity of the document's best chunk in [0, 1] (what
``SimilarityPostprocessor(similarity_cutoff=...)`` thresholds), the nodes in the pipeline's order, whose final rerank
score (similarity + named boosts, not bounded) is ``metadata["score"]``; the trace/debug metadata is excluded from
what an LLM or an embedding model sees. Every call is a full lookup, recorded in the trace store.

Knobs as ``VectorIndexRetriever`` names them (``lookup.as_retriever(similarity_top_k=..., filters=...)``):
``similarity_top_k`` is the number of evidence documents returned at most, ``filters`` a ``MetadataFilters``
scope applied to every Milvus request of the lookup (:mod:`kb_retrieval.retrieval.scope`). With the sidecar on, each
node's metadata carries the comparison under ``sidecar``.

``aretrieve`` never runs the pipeline on the event loop: it runs in a bounded thread pool
(``KBSettings.retrieval.retriever_workers``), with the caller's context (so instrumentation spans keep their parent).

Example:
    >>> retriever = lookup.as_retriever(similarity_top_k=2)  # doctest: +SKIP
    >>> engine = RetrieverQueryEngine.from_args(retriever, llm=llm)  # doctest: +SKIP
    >>> nodes = await retriever.aretrieve("etcd has no leader")  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from kb_retrieval.result import evidence_nodes, sidecar_comparison
from kb_retrieval.retrieval.events import inside_retriever

if TYPE_CHECKING:
    from llama_index.core.vector_stores.types import MetadataFilters

    from kb_retrieval.config import KBSettings


class SupportsDetailedLookup(Protocol):
    """What the retriever needs of the pipeline (``KnowledgeLookup`` is one)."""

    settings: KBSettings

    def lookup_detailed(self, query: str, *, filters: MetadataFilters | None = None) -> Any:
        """A result with ``.result`` (the ``LookupResult``) and ``.sidecar`` (the sidecar's run, or None)."""
        ...

    def scope_expr(self, filters: MetadataFilters | None) -> str | None: ...


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def lookup_pool(workers: int) -> ThreadPoolExecutor:
    """One shared pool per size for the async faces (a pool per retriever would leak threads)."""
    with _POOLS_LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kb-lookup")
        return _POOLS[workers]


async def run_in_pool(workers: int, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` on the lookup pool, awaited without blocking the loop, in the caller's context."""
    context = contextvars.copy_context()
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(lookup_pool(workers), functools.partial(context.run, fn, *args))


class KnowledgeRetriever(BaseRetriever):
    """``lookup_knowledge`` as a retriever (see the module docstring)."""

    def __init__(
        self, lookup: SupportsDetailedLookup, *, filters: MetadataFilters | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.lookup = lookup
        self.filters = filters
        if filters is not None:
            lookup.scope_expr(filters)  # an unknown key or operator is refused here, not at the first query

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        with inside_retriever():  # BaseRetriever.retrieve sends the retrieval events: the lookup sends none
            details = self.lookup.lookup_detailed(query_bundle.query_str, filters=self.filters)
        entry = details.sidecar.trace_entry() if details.sidecar is not None else None
        return evidence_nodes(details.result, sidecar_comparison(details.result, entry) if entry else None)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        nodes: list[NodeWithScore] = await run_in_pool(
            self.lookup.settings.retrieval.retriever_workers, self._retrieve, query_bundle
        )
        return nodes
