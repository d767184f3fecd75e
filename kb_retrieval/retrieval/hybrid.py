"""Stage 2: the hybrid L1 step, a LlamaIndex ``BaseRetriever``: dense, BM25 and exact-identifier candidates, every
one with its dense similarity from Milvus, so every candidate carries one comparable similarity.

Two modes (``lexical_mode``, chosen when connecting, named in ``stats`` and in each attempt's trace):

- ``milvus_bm25``: one Milvus call per attempt, ``hybrid_search`` with a dense and a BM25 request under the same
  filter, plus a dense request restricted to the exact-identifier candidates when the query has any
  (:mod:`kb_retrieval.retrieval.l1.full_text`). The dense candidates are the ``top_k`` hits with the best dense
  similarity (each computed from the hit's vector: the dense search's own score); the lexical ones are Milvus' BM25
  hits. No BM25 index is built at start-up, and another process's ingest is searched as soon as Milvus has it.
- ``in_process_bm25`` (engines or collections without full-text search, e.g. the Milvus 2.3 server): BM25 in memory
  (:class:`~kb_retrieval.retrieval.bm25.LexicalIndex`), then the dense search and a read by key of the lexical and
  exact-identifier hits with their vectors, for their dense similarity, sent together (one round trip, two
  requests); of the chunks read those the dense search missed are added. Their rows and vectors are kept
  (:class:`~kb_retrieval.retrieval.l1.retriever.KeptChunks`, per index version): a chunk read once is scored here
  afterwards, and a lookup whose hits are all kept sends the dense search alone. The chunks read are scored here as
  the dense search scores them (float32), so every similarity is the one a dense search gives. On the sdk path the
  dense search itself returns ids and scores only; the rows come from the kept chunks (read by key the first time).

Each signal keeps its own score: the dense similarity (raw value, label, normalised similarity); ``lexical_score``,
a candidate's BM25 score relative to the query's best BM25 hit under the same filter (1.0 for the best), which the
reranker turns into a boost, never a similarity; and the exact identifiers a chunk holds with their document
frequency (:mod:`kb_retrieval.retrieval.exact`, in memory in both modes).

How a search runs is chosen once, when the pipeline is built: one plan per way (:mod:`kb_retrieval.retrieval.l1.plans`:
the memory plan's mirror, BM25 in Milvus' own call, the dense search in Milvus with BM25 in process); ``search``
computes the query's exact identifiers and hands the query to the plan, the memory plan's unless the caller's scope
is one only Milvus evaluates.

``search`` is the pipeline's call (embedding, filter and deadline given; what happened is returned for the trace).
``retrieve`` is the ordinary face: a :class:`LookupQuery` carries the lookup's context (its transform, hence the
category filter); a plain ``QueryBundle`` searches unfiltered. Nodes carry their stage data (candidate, BM25 score).

Example:
    >>> nodes = lookup.hybrid.retrieve("redis memory high")  # doctest: +SKIP
    >>> stage_of(nodes[0]).lexical_score  # doctest: +SKIP
    1.0
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle
from pymilvus import MilvusClient

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.indexing.milvus import full_text_off
from kb_retrieval.models import LexicalMode, QueryTransform
from kb_retrieval.retrieval.bm25 import LexicalIndex
from kb_retrieval.retrieval.deadline import Deadline
from kb_retrieval.retrieval.exact import ExactIdentifierIndex, IdentifierScan
from kb_retrieval.retrieval.l1.base import supports_hybrid
from kb_retrieval.retrieval.l1.plans import HybridSearch, L1Plan, PlanQuery, build_plans
from kb_retrieval.retrieval.l1.retriever import KeptChunks, L1Retriever
from kb_retrieval.retrieval.scope import Scope
from kb_retrieval.retrieval.timing import StageClock

log = logging.getLogger(__name__)

__all__ = ["HybridRetriever", "HybridSearch", "LookupQuery", "choose_lexical_mode"]


def choose_lexical_mode(
    client: MilvusClient, settings: KBSettings, path: object | None
) -> tuple[LexicalMode, str | None]:
    """Where BM25 runs for this collection and path, and why not in Milvus when it cannot.

    A capability check, not a version guess: the collection has a BM25 function into a sparse field (which only an
    engine with full-text search creates: :func:`~kb_retrieval.indexing.milvus.full_text_off`) and the path can send
    a hybrid search (``path=None``: the built-in paths, which can).
    """
    if not settings.retrieval.lexical_enabled:
        return "off", None
    reason = full_text_off(client, settings)
    if reason is None and path is not None and not supports_hybrid(path):
        reason = f"the vector-store path ({type(path).__name__}) has no hybrid search: BM25 runs in process"
    return ("in_process_bm25", reason) if reason else ("milvus_bm25", None)


@dataclass
class LookupQuery(QueryBundle):
    """A ``QueryBundle`` with the lookup's context: postprocessors read the L0 hints and filter from it."""

    transform: QueryTransform | None = None
    category_filter: str | None = None
    deadline: Deadline | None = None
    #: The caller's scope (:mod:`kb_retrieval.retrieval.scope`): on every request.
    scope: Scope | None = None
    #: The query's identifiers (:meth:`HybridRetriever.identifiers`) when the lookup has them (it looks them up once
    #: for all its attempts, and for the names no document holds); None: the search looks them up.
    identifiers: IdentifierScan | None = None


class HybridRetriever(BaseRetriever):
    """Dense (one vector-store path) plus lexical (BM25) and exact-identifier candidates, each with its dense
    similarity from Milvus.

    ``lexical_mode``: ``milvus_bm25`` (the path's one hybrid call), ``in_process_bm25`` (``lexical`` is the index)
    or ``off``. By default ``in_process_bm25`` when ``lexical`` is given, else ``off``. The plans are built here, once
    (:func:`~kb_retrieval.retrieval.l1.plans.build_plans`).
    """

    def __init__(
        self,
        dense: L1Retriever,
        lexical: LexicalIndex | None,
        settings: KBSettings,
        exact: ExactIdentifierIndex | None = None,
        *,
        named_terms: dict[str, frozenset[str]] | None = None,
        lexical_mode: LexicalMode | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dense = dense
        self.settings = settings
        self.lexical = lexical
        self.exact = exact
        #: Tokens -> the documents naming them in a title or heading (``exact.named_terms``): what makes a word a
        #: rare term; empty, no rare terms.
        self.named_terms: dict[str, frozenset[str]] = named_terms or {}
        #: The chunks read by key, kept for later lookups: this retriever's (a new index version gets a new one).
        self.kept = KeptChunks(settings)
        self.lexical_mode: LexicalMode = lexical_mode or ("in_process_bm25" if lexical is not None else "off")
        if self.lexical_mode == "in_process_bm25" and lexical is None:
            raise ValueError("lexical_mode 'in_process_bm25' needs a LexicalIndex")
        mirrored = dense.mirror_for(None) is not None
        plans = build_plans(dense, lexical, self.kept, self.lexical_mode, mirrored=mirrored)
        self.memory_plan, self.milvus_plan = plans

    def plan_for(self, scope: Scope | None) -> L1Plan:
        """The plan serving a search under ``scope``: the memory plan's when it has a mirror that serves it
        (:meth:`~kb_retrieval.retrieval.l1.retriever.L1Retriever.mirror_for`), else the one searching Milvus."""
        if self.memory_plan is not None and self.dense.mirror_for(scope) is not None:
            return self.memory_plan
        return self.milvus_plan

    def search(
        self,
        embedding: list[float],
        query_text: str,
        category: str | None = None,
        deadline: Deadline | None = None,
        stage_ms: dict[str, float] | None = None,
        scope: Scope | None = None,
        identifiers: IdentifierScan | None = None,
    ) -> HybridSearch:
        """Raises when the dense search fails (the attempt fails); a failed lexical scoring only loses those.

        ``scope`` (:mod:`kb_retrieval.retrieval.scope`) is on every Milvus request, or evaluated by the mirror; the
        exact-identifier and in-process BM25 hits join only through a request under it. ``identifiers``: this
        retriever's :meth:`identifiers` of ``query_text`` when the caller has them (:attr:`LookupQuery.identifiers`),
        else looked up here."""
        clock = StageClock(stage_ms)
        with clock("query_terms"):
            exact_terms, exact_df = self._exact(query_text, identifiers)
        query = PlanQuery(
            embedding=embedding,
            text=query_text,
            category=category,
            deadline=deadline or Deadline.after(self.settings.retrieval.lookup_timeout_s),
            clock=clock,
            scope=scope,
            exact_terms=exact_terms,
            exact_df=exact_df,
        )
        return self.plan_for(scope).search(query)

    def identifiers(self, query_text: str) -> IdentifierScan | None:
        """The query's identifiers against the exact-identifier index (None without one): those held by 1 to
        ``exact_match_max_df`` documents, and the names none holds (``ExactIdentifierIndex.identifiers``)."""
        if self.exact is None:
            return None
        return self.exact.identifiers(query_text, self.settings.scoring.exact_match_max_df)

    def _exact(
        self, query_text: str, identifiers: IdentifierScan | None = None
    ) -> tuple[dict[str, list[str]], dict[str, int]]:
        """Chunk id -> the rare query identifiers and rare terms it holds verbatim, and -> the document frequency of
        its rarest."""
        terms: dict[str, list[str]] = {}
        df: dict[str, int] = {}
        scoring = self.settings.scoring
        if self.exact is None:
            return terms, df
        scan = identifiers or self.identifiers(query_text)
        hits = list(scan.hits) if scan is not None and scoring.exact_match_max_df > 0 else []
        if self.named_terms and scoring.rare_term_max_df > 0:
            hits += self.exact.match_rare_terms(query_text, self.named_terms, scoring.rare_term_max_df)
        for hit in hits:
            for chunk_id in hit.chunk_ids:
                terms.setdefault(chunk_id, []).append(hit.token)
                df[chunk_id] = min(df.get(chunk_id, len(hit.sources)), len(hit.sources))
        return terms, df

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        embedding = query_bundle.embedding or embed_query(self.dense.embed_model, query_bundle.query_str)
        lookup = query_bundle if isinstance(query_bundle, LookupQuery) else None
        category, scope = (lookup.category_filter, lookup.scope) if lookup else (None, None)
        identifiers = lookup.identifiers if lookup else None
        return self.search(embedding, query_bundle.query_str, category, scope=scope, identifiers=identifiers).nodes()
