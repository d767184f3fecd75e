"""The L1 retriever: a LlamaIndex ``BaseRetriever`` over one vector-store path.

``search`` is the pipeline's call (embedding given, optional category filter, path details returned);
``retrieve`` is the ordinary LlamaIndex face, returning ``NodeWithScore`` whose score is the normalised similarity
and whose stage data (:mod:`kb_retrieval.retrieval.stage`) carries the candidate with its raw score, label and path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import NodeWithScore, QueryBundle
from pymilvus import MilvusClient

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.models import Candidate
from kb_retrieval.retrieval.deadline import MIN_CALL_S
from kb_retrieval.retrieval.filters import equals_expr, in_expr
from kb_retrieval.retrieval.l1.auto import AutoPath
from kb_retrieval.retrieval.l1.base import (
    FetchPath,
    HybridPath,
    HybridRequest,
    IdSearchPath,
    L1Search,
    PathName,
    SendIdsPath,
    VectorPath,
    one_version_per_source,
    rescored,
    supports,
    supports_hybrid,
)
from kb_retrieval.retrieval.l1.full_text import dense_scores
from kb_retrieval.retrieval.l1.memory import MemoryMirror, estimated_mirror_mb
from kb_retrieval.retrieval.l1.sdk import SdkPath
from kb_retrieval.retrieval.l1.vectorstore import VectorStorePath
from kb_retrieval.retrieval.scope import FieldTest, Scope
from kb_retrieval.retrieval.stage import candidate_node


def make_path(settings: KBSettings, client: MilvusClient) -> VectorPath:
    """The configured path: ``vectorstore``, ``sdk`` or ``auto``."""
    if settings.retrieval.vector_store_mode == "sdk":
        return SdkPath(client, settings)
    if settings.retrieval.vector_store_mode == "vectorstore":
        return VectorStorePath(settings)
    return AutoPath(VectorStorePath(settings), SdkPath(client, settings))


@dataclass(frozen=True)
class PathFeatures:
    """What a path can do beside its dense search, found once when the L1 retriever is built: each the path itself
    typed for that feature, or ``None``.

    ``ids_only``: a dense search returning ids and scores only, the rows read by key (the sdk path); ``fetch``: a read
    by key with the vectors, to score chunks here; ``hybrid``: dense and BM25 in one call (for ``auto``, when both of
    its paths can); ``sends``: the ids-only search sent ahead and answered later (the sdk path)."""

    ids_only: IdSearchPath | None
    fetch: FetchPath | None
    hybrid: HybridPath | None
    sends: SendIdsPath | None

    @classmethod
    def of(cls, path: VectorPath) -> PathFeatures:
        """The features of ``path``."""
        return cls(
            ids_only=path if isinstance(path, IdSearchPath) else None,
            fetch=path if isinstance(path, FetchPath) and supports(path, FetchPath) else None,
            hybrid=path if isinstance(path, HybridPath) and supports_hybrid(path) else None,
            sends=path if isinstance(path, SendIdsPath) else None,
        )


class KeptChunks:
    """What was read of chunks by id, kept so that a later lookup needs no request for it (on the milvus plan): each
    chunk's row (its fields, as a candidate to rescore) and, for the chunks read by key with their vector (the BM25
    hits the dense search misses, on a server with BM25 in process), the vector, so such a chunk is scored here.
    A chunk's id names its content (:func:`~kb_retrieval.knowledge.chunker.chunk_id_for`), so what is kept stays true
    while the chunk exists; the owner starts a new one with each index version. Bounded like the memory plan's mirror
    (``memory_plan_max_mb``, a chunk counted with its vector): past it nothing more is kept."""

    def __init__(self, settings: KBSettings) -> None:
        self.settings = settings
        self.max_chunks = int(settings.retrieval.memory_plan_max_mb / estimated_mirror_mb(1, settings))
        self._rows: dict[str, Candidate] = {}
        self._vectors: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()  # the dense search and the read by key keep from two threads

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def full(self) -> bool:
        """At the bound: a search then returns its hits' fields (see ``L1Retriever.search``)."""
        return len(self._rows) >= self.max_chunks

    def has_vector(self, chunk_id: str) -> bool:
        return chunk_id in self._vectors

    def row(self, chunk_id: str) -> Candidate | None:
        return self._rows.get(chunk_id)

    def keep(self, candidates: list[Candidate], vectors: dict[str, np.ndarray] | None = None) -> None:
        """Keep the candidates' rows (a copy of each) and the vectors given for them, up to the bound."""
        with self._lock:
            for candidate in candidates:
                chunk_id = candidate.chunk_id
                if chunk_id not in self._rows:
                    if len(self._rows) >= self.max_chunks:
                        continue
                    self._rows[chunk_id] = rescored(candidate, candidate.score)
                if vectors is not None and (vector := vectors.get(chunk_id)) is not None:
                    self._vectors[chunk_id] = vector

    def scored(self, embedding: list[float], ids: list[str], category: str | None) -> list[Candidate]:
        """The chunks of ``ids`` kept with their vector, under the category filter, scored here as a dense search
        scores them."""
        held = [(self._vectors[i], self._rows[i]) for i in ids if i in self._vectors]
        if category is not None and self.settings.schema_fields.category_field:
            held = [(v, c) for v, c in held if c.category == category]
        if not held:
            return []
        query = np.asarray(embedding, dtype=np.float32)
        scores = dense_scores(query, np.stack([v for v, _ in held]), self.settings.schema_fields.metric)
        return [rescored(c, s) for (_, c), s in zip(held, scores.tolist(), strict=True)]


class L1Retriever(BaseRetriever):
    """Dense retrieval over Milvus through one path, with an optional category filter.

    ``memory`` (the memory plan, :mod:`kb_retrieval.retrieval.l1.memory`): the collection mirrored in this process
    serves every search instead of the path, but for one under a caller's scope the mirror cannot evaluate; ``None``,
    or such a scope: the path searches Milvus.
    """

    def __init__(
        self,
        path: VectorPath,
        settings: KBSettings,
        embed_model: BaseEmbedding,
        *,
        category_filter: str | None = None,
        memory: MemoryMirror | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.path = path
        self.features = PathFeatures.of(path)
        self.memory = memory
        self.settings = settings
        self.embed_model = embed_model
        self.category_filter = category_filter

    def mirror_for(self, scope: Scope | None) -> MemoryMirror | None:
        """The memory plan's mirror when it serves a search under ``scope``, else ``None`` (the path searches Milvus).
        The one place that decides it: the mirror serves a scope made only of field tests it evaluates exactly
        (:attr:`Scope.tests` on the fields it holds); any other scope is a Milvus expression only Milvus evaluates."""
        if self.memory is None or scope is None:
            return self.memory
        return self.memory if scope.tests is not None and self.memory.evaluates(scope.tests) else None

    def filter_expr(self, category: str | None, ids: list[str] | None = None, scope: Scope | None = None) -> str | None:
        """The expression of one request: the caller's ``scope`` (a translated ``MetadataFilters``, always applied),
        the category hint and an id restriction, joined by AND."""
        parts = [f"({scope.expr})"] if scope else []
        if category and self.settings.schema_fields.category_field:
            parts.append(equals_expr(self.settings.schema_fields.category_field, category))
        if ids:
            parts.append(in_expr(self.settings.schema_fields.id_field, ids))
        return " and ".join(parts) or None

    def search(
        self,
        embedding: list[float],
        category: str | None = None,
        top_k: int | None = None,
        ids: list[str] | None = None,
        timeout: float | None = None,
        scope: Scope | None = None,
        kept: KeptChunks | None = None,
    ) -> L1Search:
        """Dense search in Milvus; ``ids`` restricts it to those chunks (scoring lexical candidates in Milvus).

        With ``kept``, on a path that can search for ids alone (``search_ids``: the sdk path), the search returns ids
        and scores only and the rows come from ``kept``; the rows it lacks are read by key (and kept) after the
        search. The same candidates as a search returning the fields, which on the Milvus 2.3 server cost about as much
        as the search itself (docs/tuning-history.md). Once ``kept`` is full, the search returns the fields again."""
        limit = len(ids) if ids else top_k or self.settings.retrieval.top_k
        if (memory := self.mirror_for(scope)) is not None:
            return memory.search(embedding, limit, category, ids, _tests(scope))
        expr = self.filter_expr(category, ids, scope)
        path = self.features.ids_only
        if kept is None or kept.full or path is None:
            return self.path.search(embedding, limit, expr, timeout)
        started = time.monotonic()
        return self._with_rows(path, path.search_ids(embedding, limit, expr, timeout), kept, timeout, started)

    def send(
        self,
        embedding: list[float],
        category: str | None,
        timeout: float,
        scope: Scope | None,
        kept: KeptChunks,
    ) -> Callable[[], L1Search] | None:
        """:meth:`search` (``top_k``, ids only, rows from ``kept``) sent now and answered by the call returned, which
        waits for it; ``None`` where the search cannot be sent ahead (the memory plan, a path without ``send_ids``,
        ``kept`` full): the caller then calls :meth:`search`. Lets a plan do its own work while Milvus searches,
        with no thread between."""
        path = self.features.sends
        if path is None or kept.full or self.mirror_for(scope) is not None:
            return None
        started = time.monotonic()
        answer = path.send_ids(
            embedding, self.settings.retrieval.top_k, self.filter_expr(category, None, scope), timeout
        )
        return lambda: self._with_rows(path, answer(), kept, timeout, started)

    def _with_rows(
        self, path: IdSearchPath, hits: list[tuple[str, float]], kept: KeptChunks, timeout: float | None, started: float
    ) -> L1Search:
        """The candidates of an ids-only search's ``hits``: rows from ``kept``, the others read by key (and kept)."""
        read: dict[str, Candidate] = {}
        if missing := [chunk_id for chunk_id, _ in hits if kept.row(chunk_id) is None]:
            left = None if timeout is None else max(timeout - (time.monotonic() - started), MIN_CALL_S)
            read = {c.chunk_id: c for c in path.read(in_expr(self.settings.schema_fields.id_field, missing), left)}
            kept.keep(list(read.values()))
        # A hit deleted between the search and the read has no row: it is no longer a chunk, and left out.
        rows = [(row, score) for chunk_id, score in hits if (row := kept.row(chunk_id) or read.get(chunk_id))]
        candidates = [rescored(row, score) for row, score in rows]
        name = cast(PathName, path.name)
        return L1Search(candidates=one_version_per_source(candidates), path=name, reads=int(bool(missing)))

    def scored(
        self,
        embedding: list[float],
        ids: list[str],
        category: str | None = None,
        timeout: float | None = None,
        scope: Scope | None = None,
        kept: KeptChunks | None = None,
    ) -> L1Search:
        """The chunks ``ids`` (under the category and the caller's scope) with their dense score, best first. Read by
        key with their vectors and scored here where the path can (``fetch``), the vectors then ``kept``; else a
        dense search restricted to them. Scores equal a restricted search's to float32 precision."""
        if (memory := self.mirror_for(scope)) is not None:
            return memory.search(embedding, len(ids), category, ids, _tests(scope))
        fetching = self.features.fetch
        if not ids or fetching is None:
            return self.search(embedding, category, ids=ids, timeout=timeout, scope=scope)
        found, vectors = fetching.fetch(embedding, self.filter_expr(category, ids, scope) or "", timeout)
        if kept is not None:
            kept.keep(found.candidates, vectors)
        found.candidates = one_version_per_source(found.candidates)
        return found

    def hybrid_search(
        self,
        embedding: list[float],
        terms: str,
        category: str | None = None,
        timeout: float | None = None,
        ids: list[str] | None = None,
        scope: Scope | None = None,
    ) -> L1Search:
        """Dense (``top_k``) and BM25 (``lexical_top_k``) in one Milvus call, both under the category filter, and
        ``ids`` (the exact-identifier candidates) by a dense request restricted to them in the same call; the path must
        support it (:func:`~kb_retrieval.retrieval.l1.base.supports_hybrid`)."""
        top_k, lexical_top_k = self.settings.retrieval.top_k, self.settings.retrieval.lexical_top_k
        if (memory := self.mirror_for(scope)) is not None:  # this retriever's sizes, not the mirror's loader's
            return memory.hybrid_search(
                embedding, terms, category, ids, top_k=top_k, lexical_top_k=lexical_top_k, scope=_tests(scope)
            )
        request = HybridRequest(
            embedding,
            terms,
            top_k,
            lexical_top_k,
            self.filter_expr(category, scope=scope),
            ids_filter=self.filter_expr(category, ids, scope) if ids else None,
            ids_count=len(ids or []),
        )
        if self.features.hybrid is None:
            raise TypeError(f"the vector-store path ({type(self.path).__name__}) has no hybrid search")
        return self.features.hybrid.hybrid_search(request, timeout)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        embedding = query_bundle.embedding or embed_query(self.embed_model, query_bundle.query_str)
        result = self.search(embedding, self.category_filter)
        return [candidate_node(c) for c in result.candidates]


def _tests(scope: Scope | None) -> tuple[FieldTest, ...] | None:
    """The field tests the mirror applies for ``scope`` (one :meth:`L1Retriever.mirror_for` let it serve)."""
    return scope.tests if scope is not None else None
