"""Stage 2: the hybrid L1 step, a LlamaIndex ``BaseRetriever``: dense, BM25 and exact-identifier candidates, every
one with its dense similarity from Milvus, so every candidate carries one comparable similarity.

Two modes (``lexical_mode``, chosen when connecting, named in ``stats`` and in each attempt's trace):

- ``milvus_bm25``: one Milvus call per attempt, ``hybrid_search`` with a dense and a BM25 request under the same
  filter, plus a dense request restricted to the exact-identifier candidates when the query has any
  (:mod:`kb_retrieval.retrieval.l1.full_text`). The dense candidates are the ``top_k`` hits with the best dense
  similarity (each computed from the hit's vector: the dense search's own score); the lexical ones are Milvus' BM25
  hits. No BM25 index is built at start-up, and another process's ingest is searched as soon as Milvus has it.
- ``in_process_bm25`` (engines or collections without full-text search, e.g. the Milvus 2.3 server): BM25 in memory
  (:class:`~kb_retrieval.retrieval.lexical.LexicalIndex`), then the dense search and a read by key of the lexical and
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

``search`` is the pipeline's call (embedding, filter and deadline given; what happened is returned for the trace).
``retrieve`` is the ordinary face: a :class:`LookupQuery` carries the lookup's context (its transform, hence the
category filter); a plain ``QueryBundle`` searches unfiltered. Nodes carry their stage data (candidate, BM25 score).

Example:
    >>> nodes = lookup.hybrid.retrieve("redis memory high")  # doctest: +SKIP
    >>> stage_of(nodes[0]).lexical_score  # doctest: +SKIP
    1.0
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import logging
import time
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
from kb_retrieval.retrieval.deadline import Deadline, wait_until
from kb_retrieval.retrieval.exact import ExactIdentifierIndex
from kb_retrieval.retrieval.l1.base import one_version_per_source, supports_hybrid
from kb_retrieval.retrieval.l1.retriever import KeptChunks, L1Retriever
from kb_retrieval.retrieval.lexical import LexicalIndex, analysed_text, relative_to_best
from kb_retrieval.retrieval.stage import candidate_node
from kb_retrieval.retrieval.timing import StageClock

log = logging.getLogger(__name__)
dispatcher = get_dispatcher(__name__)

#: The dense search of an in-process BM25 search in Milvus, sent before BM25 runs (see ``HybridRetriever.search``).
#: Its own pool: the caller already runs on a worker of the attempts' pool, which must not wait on itself.
_SIDE_CALLS = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="kb-milvus-dense")


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
    #: Requests sent to Milvus: the search; on the sdk path a read by key of the rows of hits not kept yet; in process
    #: the read by key of the chunks BM25 or an identifier brings, when any is not kept.
    milvus_calls: int = 0

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
        if self.dense.mirror_for(scope) is not None:
            return self._search_in_memory(embedding, query_text, category, deadline, clock, exact_terms, exact_df)
        if not exact_terms and not self._runs_bm25():  # nothing to score beside the dense search
            with clock("search"):
                dense = self.dense.search(
                    embedding,
                    category,
                    timeout=deadline.timeout(settings.milvus_search_timeout_s),
                    scope=scope,
                    kept=self.kept,
                )
            return self._merged(dense, [], [], exact_terms, exact_df)
        # In Milvus: BM25 runs here first (a fraction of a millisecond at 1k chunks), then the dense search and the
        # read by key of the chunks BM25 or an exact identifier brings (for their dense similarity) go out together.
        # Two requests, one round trip: the lookup waits for the slower of the two, never for one after the other.
        # BM25 first, not while the dense search is out: on this 2-core machine the client thread handling the dense
        # call and BM25 contend for the interpreter, and the second request then left later (on the Milvus 2.3
        # server, 1k chunks, alternating blocks of 60 alert texts, twice: lookup p50 0.7 and 1.3 ms less). The
        # ``search`` stage is the wait for both requests.
        lexical_hits = self._lexical_hits(query_text, category, clock)
        wanted = self._wanted(exact_terms, lexical_hits)
        # Chunks read by key in an earlier lookup are scored here from their kept vectors (none under a caller's
        # scope: a Milvus expression only Milvus evaluates); only the others are read, beside the dense search.
        held = self.kept.scored(embedding, wanted, category) if scope is None else []
        to_read = [c for c in wanted if not self.kept.has_vector(c)] if scope is None else wanted
        started = time.perf_counter()
        dense_call = _SIDE_CALLS.submit(
            contextvars.copy_context().run,
            self.dense.search,
            embedding,
            category,
            timeout=deadline.timeout(settings.milvus_search_timeout_s),
            scope=scope,
            kept=self.kept,
        )
        try:
            extra = _best_first(held, settings.metric)
            failed: Exception | None = None
            sent = bool(to_read) and not deadline.expired
            if sent:
                try:
                    timeout = deadline.timeout(settings.milvus_search_timeout_s)
                    read = self.dense.scored(embedding, to_read, category, timeout, scope, kept=self.kept)
                    extra = _best_first(held + read.candidates, settings.metric) if held else read.candidates
                except Exception as exc:  # the dense candidates (and the kept ones) still stand
                    failed = exc
            dense = wait_until(dense_call, deadline)
        finally:
            dense_call.cancel()  # a no-op once it runs; an exception above must not leave it queued
            waited = (time.perf_counter() - started) * 1000
            clock.stage_ms["search"] = round(clock.stage_ms.get("search", 0.0) + waited, 3)
        result = self._merged(dense, lexical_hits, wanted, exact_terms, exact_df)
        result.milvus_calls += 1 if sent else 0
        if result.lexical_added:
            if failed is not None:
                log.warning("scoring lexical candidates failed: %s", failed)
            # What the dense search also returned is dropped from the chunks read: the candidates are the ones a
            # second search restricted to the chunks the dense search missed would return.
            outside = {c for c in wanted if c not in {d.chunk_id for d in dense.candidates}}
            added = [c for c in extra if c.chunk_id in outside]
            result.candidates = one_version_per_source(result.candidates + added)
        if scope and result.lexical_scores:
            result.lexical_scores = _within(result.lexical_scores, {c.chunk_id for c in result.candidates})
            result.lexical_count = len(result.lexical_scores)
        return result

    def _search_in_memory(
        self,
        embedding: list[float],
        query_text: str,
        category: str | None,
        deadline: Deadline,
        clock: StageClock,
        exact_terms: dict[str, list[str]],
        exact_df: dict[str, int],
    ) -> HybridSearch:
        """The memory plan's in-process mode: the dense search, BM25 and the missed chunks' scores, all in memory."""
        with clock("search"):
            dense = self.dense.search(embedding, category)
        lexical_hits = self._lexical_hits(query_text, category, clock)
        wanted = self._wanted(exact_terms, lexical_hits)
        result = self._merged(dense, lexical_hits, wanted, exact_terms, exact_df)
        missing = [c for c in wanted if c not in {d.chunk_id for d in dense.candidates}]
        if missing and not deadline.expired:
            with clock("search"):
                extra = self.dense.search(embedding, category, ids=missing)
            result.candidates = one_version_per_source(result.candidates + extra.candidates)
        return result

    def _runs_bm25(self) -> bool:
        return self.lexical_mode == "in_process_bm25" and self.lexical is not None and self.settings.lexical_top_k > 0

    def _lexical_hits(self, query_text: str, category: str | None, clock: StageClock) -> list[Any]:
        """The in-process BM25 hits (none in the other modes)."""
        if not self._runs_bm25():
            return []
        with clock("lexical"):
            return self._lexical(query_text, category)

    def _wanted(self, exact_terms: dict[str, list[str]], lexical_hits: list[Any]) -> list[str]:
        """The chunks an exact identifier or BM25 (from ``lexical_rescore_min`` up) brings, whether or not the dense
        search returns them too."""
        floor = self.settings.lexical_rescore_min
        return list(dict.fromkeys([*exact_terms, *(h.chunk_id for h in lexical_hits if h.score >= floor)]))

    def _merged(
        self,
        dense: Any,
        lexical_hits: list[Any],
        wanted: list[str],
        exact_terms: dict[str, list[str]],
        exact_df: dict[str, int],
    ) -> HybridSearch:
        """The dense search's answer with the lexical signal's figures (the missed chunks not yet added)."""
        known = {c.chunk_id for c in dense.candidates}
        return HybridSearch(
            candidates=dense.candidates,
            lexical_scores={h.chunk_id: h.score for h in lexical_hits},
            exact_terms=exact_terms,
            exact_df=exact_df,
            path=dense.path,
            path_fallback_reason=dense.path_fallback_reason,
            lexical_mode=self.lexical_mode,
            lexical_count=len(lexical_hits),
            lexical_added=sum(1 for c in wanted if c not in known),
            milvus_calls=_calls(dense.path) + dense.reads,
        )

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
        relative = relative_to_best(found.bm25)
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


def _best_first(candidates: list[Candidate], metric: str) -> list[Candidate]:
    """``candidates`` in the order a dense search returns them: best score first (lowest for L2), ties kept."""
    lower_is_better = metric.upper() == "L2"
    return sorted(candidates, key=lambda c: c.score if lower_is_better else -c.score)


def _within(scores: dict[str, float], kept: set[str]) -> dict[str, float]:
    """In-process BM25 scores of the chunks a scoped search kept, relative to the best of them again (the relative
    score is to the query's best hit under the same filter)."""
    return relative_to_best({chunk_id: score for chunk_id, score in scores.items() if chunk_id in kept})
