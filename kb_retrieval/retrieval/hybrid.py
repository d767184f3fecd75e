"""Stage 2: the hybrid L1 step, a LlamaIndex ``BaseRetriever``: dense, BM25 and exact-identifier candidates, every
one with its dense similarity from Milvus, so every candidate carries one comparable similarity.

Two modes (``lexical_mode``, chosen when connecting, named in ``stats`` and in each attempt's trace):

- ``milvus_bm25``: one Milvus call per attempt, ``hybrid_search`` with a dense and a BM25 request under the same
  filter, plus a dense request restricted to the exact-identifier candidates when the query has any
  (:mod:`kb_retrieval.retrieval.l1.full_text`). The dense candidates are the ``top_k`` hits with the best dense
  similarity (each computed from the hit's vector: the dense search's own score); the lexical ones are Milvus' BM25
  hits. No BM25 index is built at start-up, and another process's ingest is searched as soon as Milvus has it.
- ``in_process_bm25`` (engines or collections without full-text search): a dense search, BM25 in memory
  (:class:`~kb_retrieval.retrieval.lexical.LexicalIndex`), and a second search restricted to the lexical and
  exact-identifier hits the dense search missed, for their dense similarity.

Each signal keeps its own score: the dense similarity (raw value, label, normalised similarity); ``lexical_score``,
a candidate's BM25 score relative to the query's best BM25 hit under the same filter (1.0 for the best), which the
reranker turns into a boost, never a similarity; and the exact identifiers a chunk holds with their document
frequency (:mod:`kb_retrieval.retrieval.exact`, in memory in both modes).

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
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.schema import NodeWithScore, QueryBundle
from pymilvus import MilvusClient

from kb_retrieval.config import Settings
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.indexing.milvus import full_text_off
from kb_retrieval.models import Candidate, LexicalMode, QueryTransform
from kb_retrieval.retrieval.deadline import Deadline
from kb_retrieval.retrieval.exact import ExactIdentifierIndex
from kb_retrieval.retrieval.l1.base import one_version_per_source, supports_hybrid
from kb_retrieval.retrieval.l1.retriever import L1Retriever
from kb_retrieval.retrieval.lexical import LexicalIndex, analysed_text
from kb_retrieval.retrieval.stage import candidate_node
from kb_retrieval.retrieval.timing import StageClock

log = logging.getLogger(__name__)
dispatcher = get_dispatcher(__name__)


def _calls(path: str | None) -> int:
    """Milvus calls one search made: none when the memory plan's mirror served it."""
    return 0 if path == "memory" else 1


def choose_lexical_mode(
    client: MilvusClient, settings: Settings, path: object | None
) -> tuple[LexicalMode, str | None]:
    """Where BM25 runs for this collection and path, and why not in Milvus when it cannot.

    A capability check, not a version guess: the collection has a BM25 function into a sparse field (which only an
    engine with full-text search creates: :func:`~kb_retrieval.indexing.milvus.full_text_off`) and the path can send
    a hybrid search (``path=None``: the built-in paths, which can).
    """
    if not settings.lexical_enabled:
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
    #: The caller's scope as a Milvus expression (:mod:`kb_retrieval.retrieval.scope`): on every request.
    scope: str | None = None


@dataclass
class HybridSearch:
    """One hybrid search: candidates in dense order then lexical additions, and what each signal did."""

    candidates: list[Candidate] = field(default_factory=list)
    lexical_scores: dict[str, float] = field(default_factory=dict)
    exact_terms: dict[str, list[str]] = field(default_factory=dict)  # chunk id -> rare query identifiers it holds
    exact_df: dict[str, int] = field(default_factory=dict)  # chunk id -> documents holding its rarest identifier
    path: str | None = None
    path_fallback_reason: str | None = None
    lexical_mode: LexicalMode = "off"
    lexical_count: int = 0
    lexical_added: int = 0
    milvus_calls: int = 0  # searches sent to Milvus (1 in milvus_bm25 mode; 2 in process when it adds candidates)

    def nodes(self) -> list[NodeWithScore]:
        return [
            candidate_node(
                c,
                lexical_score=self.lexical_scores.get(c.chunk_id),
                exact_terms=self.exact_terms.get(c.chunk_id, []),
                exact_df=self.exact_df.get(c.chunk_id),
            )
            for c in self.candidates
        ]


class HybridRetriever(BaseRetriever):
    """Dense (one vector-store path) plus lexical (BM25) and exact-identifier candidates, each with its dense
    similarity from Milvus.

    ``lexical_mode``: ``milvus_bm25`` (the path's one hybrid call), ``in_process_bm25`` (``lexical`` is the index)
    or ``off``. By default ``in_process_bm25`` when ``lexical`` is given, else ``off``.
    """

    def __init__(
        self,
        dense: L1Retriever,
        lexical: LexicalIndex | None,
        settings: Settings,
        exact: ExactIdentifierIndex | None = None,
        *,
        lexical_mode: LexicalMode | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dense = dense
        self.lexical = lexical
        self.exact = exact
        #: Tokens -> the documents naming them in a title or heading (``exact.named_terms``): what makes a word a
        #: rare term; empty, no rare terms.
        self.named_terms: dict[str, frozenset[str]] = {}
        self.settings = settings
        self.lexical_mode: LexicalMode = lexical_mode or ("in_process_bm25" if lexical is not None else "off")
        if self.lexical_mode == "in_process_bm25" and lexical is None:
            raise ValueError("lexical_mode 'in_process_bm25' needs a LexicalIndex")

    def search(
        self,
        embedding: list[float],
        query_text: str,
        category: str | None = None,
        deadline: Deadline | None = None,
        stage_ms: dict[str, float] | None = None,
        scope: str | None = None,
    ) -> HybridSearch:
        """Raises when the dense search fails (the attempt fails); a failed lexical scoring only loses those.

        ``scope`` (a Milvus expression, :mod:`kb_retrieval.retrieval.scope`) is on every Milvus request; the
        exact-identifier and in-process BM25 hits join only through a request under it."""
        settings = self.settings
        deadline = deadline or Deadline.after(settings.lookup_timeout_s)
        clock = StageClock(stage_ms)
        with clock("query_terms"):
            exact_terms, exact_df = self._exact(query_text)
            milvus_bm25 = self.lexical_mode == "milvus_bm25"
            terms = analysed_text(query_text) if milvus_bm25 and settings.lexical_top_k > 0 else ""
        if milvus_bm25 and (terms or exact_terms):  # else (stopwords only, no identifier) the dense search alone
            result = self._search_in_milvus(embedding, terms, category, deadline, clock, list(exact_terms), scope)
            result.exact_terms, result.exact_df = exact_terms, exact_df
            return result
        with clock("search"):
            dense = self.dense.search(
                embedding, category, timeout=deadline.timeout(settings.milvus_search_timeout_s), scope=scope
            )
        result = HybridSearch(
            candidates=dense.candidates,
            path=dense.path,
            path_fallback_reason=dense.path_fallback_reason,
            lexical_mode=self.lexical_mode,
            exact_terms=exact_terms,
            exact_df=exact_df,
            milvus_calls=_calls(dense.path),
        )
        known = {c.chunk_id for c in result.candidates}
        missing = [c for c in exact_terms if c not in known]
        if self.lexical_mode == "in_process_bm25" and self.lexical is not None and settings.lexical_top_k > 0:
            with clock("lexical"):
                hits = self._lexical(query_text, category)
            result.lexical_scores = {h.chunk_id: h.score for h in hits}
            result.lexical_count = len(hits)
            missing += [
                h.chunk_id
                for h in hits
                if h.chunk_id not in known and h.score >= settings.lexical_rescore_min and h.chunk_id not in missing
            ]
        result.lexical_added = len(missing)
        if missing and not deadline.expired:  # Milvus scores the lexical candidates the dense search did not return
            try:
                result.milvus_calls += _calls(self.dense.path.name if self.dense.memory is None else "memory")
                with clock("search"):
                    extra = self.dense.search(
                        embedding,
                        category,
                        ids=missing,
                        timeout=deadline.timeout(settings.milvus_search_timeout_s),
                        scope=scope,
                    )
                result.candidates = one_version_per_source(result.candidates + extra.candidates)
            except Exception as exc:  # the dense candidates still stand
                log.warning("scoring lexical candidates failed: %s", exc)
        if scope and result.lexical_scores:
            result.lexical_scores = _within(result.lexical_scores, {c.chunk_id for c in result.candidates})
            result.lexical_count = len(result.lexical_scores)
        return result

    def _exact(self, query_text: str) -> tuple[dict[str, list[str]], dict[str, int]]:
        """Chunk id -> the rare query identifiers and rare terms it holds verbatim, and -> the document frequency of
        its rarest."""
        terms: dict[str, list[str]] = {}
        df: dict[str, int] = {}
        scoring = self.settings.scoring
        if self.exact is None:
            return terms, df
        hits = self.exact.match(query_text, scoring.exact_match_max_df) if scoring.exact_match_max_df > 0 else []
        if self.named_terms and scoring.rare_term_max_df > 0:
            hits += self.exact.match_rare_terms(query_text, self.named_terms, scoring.rare_term_max_df)
        for hit in hits:
            for chunk_id in hit.chunk_ids:
                terms.setdefault(chunk_id, []).append(hit.token)
                df[chunk_id] = min(df.get(chunk_id, len(hit.sources)), len(hit.sources))
        return terms, df

    def _search_in_milvus(
        self,
        embedding: list[float],
        terms: str,
        category: str | None,
        deadline: Deadline,
        clock: StageClock,
        exact_ids: list[str],
        scope: str | None = None,
    ) -> HybridSearch:
        """Dense, BM25 and exact-identifier chunks in one Milvus call: the ``top_k`` chunks with the best dense
        similarity (best first), then the other exact-identifier chunks and the other BM25 hits from
        ``lexical_rescore_min`` up, best similarity first (the order a search restricted to them returns)."""
        settings = self.settings
        with clock("search"):
            found = self.dense.hybrid_search(
                embedding,
                terms,
                category,
                timeout=deadline.timeout(settings.milvus_search_timeout_s),
                ids=exact_ids,
                scope=scope,
            )
        by_similarity = sorted(found.candidates, key=lambda c: -c.similarity)  # stable: ties keep Milvus' order
        dense = by_similarity[: settings.top_k]
        best = max(found.bm25.values(), default=0.0)
        relative = {chunk_id: round(score / best, 6) for chunk_id, score in found.bm25.items()} if best > 0 else {}
        known = {c.chunk_id for c in dense}
        wanted = set(exact_ids) | {c for c, score in relative.items() if score >= settings.lexical_rescore_min}
        added = [c for c in by_similarity[settings.top_k :] if c.chunk_id in wanted and c.chunk_id not in known]
        return HybridSearch(
            candidates=one_version_per_source(dense + added),
            lexical_scores=relative,
            path=found.path,
            path_fallback_reason=found.path_fallback_reason,
            lexical_mode="milvus_bm25",
            lexical_count=len(relative),
            lexical_added=len(added),
            milvus_calls=_calls(found.path),
        )

    @dispatcher.span
    def _lexical(self, query_text: str, category: str | None) -> list[Any]:
        assert self.lexical is not None
        return self.lexical.search(query_text, self.settings.lexical_top_k, category)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        embedding = query_bundle.embedding or embed_query(self.dense.embed_model, query_bundle.query_str)
        lookup = query_bundle if isinstance(query_bundle, LookupQuery) else None
        category, scope = (lookup.category_filter, lookup.scope) if lookup else (None, None)
        return self.search(embedding, query_bundle.query_str, category, scope=scope).nodes()


def _within(scores: dict[str, float], kept: set[str]) -> dict[str, float]:
    """In-process BM25 scores of the chunks a scoped search kept, relative to the best of them again (the relative
    score is to the query's best hit under the same filter)."""
    inside = {chunk_id: score for chunk_id, score in scores.items() if chunk_id in kept}
    best = max(inside.values(), default=0.0)
    return {chunk_id: round(score / best, 6) for chunk_id, score in inside.items()} if best > 0 else {}
