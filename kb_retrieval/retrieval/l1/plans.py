"""The L1 search plans: one small class per way an attempt's search runs, chosen once when the pipeline is built.

Which one serves is fixed by the index version's state and the collection (where the chunks are searched, where
BM25 runs), never by the query; only a caller's scope the mirror cannot evaluate moves a memory-plan search to Milvus
(:meth:`~kb_retrieval.retrieval.l1.retriever.L1Retriever.mirror_for`).

- :class:`MirrorPlan`: the memory plan: the dense search in the mirror, in-process BM25 (when it runs) and the
  chunks it brings, all in memory, no Milvus call.
- :class:`FusedPlan`: BM25 in the same call as the dense search (``lexical_mode = milvus_bm25``): one Milvus
  ``hybrid_search`` per attempt, or the mirror's own on the memory plan; a query with no BM25 terms and no rare
  identifier is served by the plan it was built over.
- :class:`DenseBm25Plan`: the dense search in Milvus and BM25 in process (``in_process_bm25``, the Milvus 2.3
  server, or BM25 off): the chunks BM25 or an exact identifier brings are read by key beside the dense search.

How the path itself searches (fields returned, or ids with the rows kept) is the L1 retriever's, also chosen once
(:class:`~kb_retrieval.retrieval.l1.retriever.PathFeatures`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol, cast

from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.schema import NodeWithScore

from kb_retrieval.config import KBSettings
from kb_retrieval.models import Candidate, LexicalMode
from kb_retrieval.retrieval.bm25 import LexicalHit, LexicalIndex, analysed_text, relative_to_best
from kb_retrieval.retrieval.deadline import DENSE_BESIDE, Deadline
from kb_retrieval.retrieval.l1.base import L1Search, one_version_per_source
from kb_retrieval.retrieval.l1.retriever import KeptChunks, L1Retriever
from kb_retrieval.retrieval.scope import Scope
from kb_retrieval.retrieval.stage import candidate_node
from kb_retrieval.retrieval.timing import StageClock

log = logging.getLogger(__name__)
dispatcher = get_dispatcher(__name__)


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
        """The candidates as nodes carrying their stage data (BM25 score, exact identifiers)."""
        return [
            candidate_node(
                c,
                lexical_score=self.lexical_scores.get(c.chunk_id),
                exact_terms=self.exact_terms.get(c.chunk_id, []),
                exact_df=self.exact_df.get(c.chunk_id),
            )
            for c in self.candidates
        ]


@dataclass(frozen=True)
class PlanQuery:
    """What one attempt's search is given: the query (its embedding and text), the filter, the caller's scope, the
    deadline and clock, and the exact-identifier chunks already matched (chunk id -> tokens, -> document frequency)."""

    embedding: list[float]
    text: str
    category: str | None
    deadline: Deadline
    clock: StageClock
    scope: Scope | None
    exact_terms: dict[str, list[str]]
    exact_df: dict[str, int]


class L1Plan(Protocol):
    """One way an attempt's search runs (see the module)."""

    lexical_mode: LexicalMode

    def search(self, query: PlanQuery) -> HybridSearch:
        """The candidates and what each signal did; raises when the dense search fails."""
        ...


class InProcessBm25:
    """BM25 in this process (:class:`~kb_retrieval.retrieval.bm25.LexicalIndex`): its hits, under the category."""

    def __init__(self, index: LexicalIndex, settings: KBSettings) -> None:
        self.index = index
        self.settings = settings

    @classmethod
    def of(cls, index: LexicalIndex | None, settings: KBSettings, lexical_mode: LexicalMode) -> InProcessBm25 | None:
        """The in-process BM25 of a pipeline, or ``None`` when it does not run (another mode, no index, top k 0)."""
        runs = lexical_mode == "in_process_bm25" and index is not None and settings.retrieval.lexical_top_k > 0
        return cls(index, settings) if runs and index is not None else None

    def hits(self, query: PlanQuery) -> list[LexicalHit]:
        """The query's BM25 hits, timed as the stage ``lexical``."""
        with query.clock("lexical"):
            return self._search(query.text, query.category)

    @dispatcher.span
    def _search(self, query_text: str, category: str | None) -> list[LexicalHit]:
        return self.index.search(query_text, self.settings.retrieval.lexical_top_k, category)


def wanted(settings: KBSettings, query: PlanQuery, lexical_hits: list[LexicalHit]) -> list[str]:
    """The chunks an exact identifier or BM25 (from ``lexical_rescore_min`` up) brings, whether or not the dense
    search returns them too."""
    floor = settings.lexical_rescore_min
    return list(dict.fromkeys([*query.exact_terms, *(h.chunk_id for h in lexical_hits if h.score >= floor)]))


def merged(
    dense: L1Search, lexical_hits: list[LexicalHit], wanted: list[str], query: PlanQuery, mode: LexicalMode
) -> HybridSearch:
    """The dense search's answer with the lexical signal's figures (the missed chunks not yet added)."""
    known = {c.chunk_id for c in dense.candidates}
    return HybridSearch(
        candidates=dense.candidates,
        lexical_scores={h.chunk_id: h.score for h in lexical_hits},
        exact_terms=query.exact_terms,
        exact_df=query.exact_df,
        path=dense.path,
        path_fallback_reason=dense.path_fallback_reason,
        lexical_mode=mode,
        lexical_count=len(lexical_hits),
        lexical_added=sum(1 for c in wanted if c not in known),
        milvus_calls=milvus_calls(dense.path) + dense.reads,
    )


def milvus_calls(path: str | None) -> int:
    """Milvus calls one search made: none when the memory plan's mirror served it."""
    return 0 if path == "memory" else 1


class MirrorPlan:
    """The memory plan: the dense search in the mirror, the in-process BM25 hits (when BM25 runs here) and the
    chunks they or an exact identifier bring that the dense search missed, scored from the mirror; under a caller's
    scope the mirror evaluates, as :class:`DenseBm25Plan` under it."""

    def __init__(self, dense: L1Retriever, bm25: InProcessBm25 | None, lexical_mode: LexicalMode) -> None:
        self.dense = dense
        self.bm25 = bm25
        self.lexical_mode = lexical_mode
        self.settings = dense.settings

    def search(self, query: PlanQuery) -> HybridSearch:
        """The candidates, all from memory."""
        embedding, category, clock, scope = query.embedding, query.category, query.clock, query.scope
        with clock("search"):
            dense = self.dense.search(embedding, category, scope=scope)
        lexical_hits = self.bm25.hits(query) if self.bm25 is not None else []
        chunks = wanted(self.settings, query, lexical_hits)
        result = merged(dense, lexical_hits, chunks, query, self.lexical_mode)
        missing = [c for c in chunks if c not in {d.chunk_id for d in dense.candidates}]
        if missing and not query.deadline.expired:
            with clock("search"):
                extra = self.dense.search(embedding, category, ids=missing, scope=scope)
            result.candidates = one_version_per_source(result.candidates + extra.candidates)
        return within_scope(result, scope)


class FusedPlan:
    """BM25 in the dense search's own call (``milvus_bm25``): dense, BM25 and exact-identifier chunks in one
    ``hybrid_search`` (Milvus', or the mirror's on the memory plan). A query with no BM25 terms (stopwords only) and
    no rare identifier goes to ``otherwise`` (the dense search alone)."""

    lexical_mode: LexicalMode = "milvus_bm25"

    def __init__(self, dense: L1Retriever, otherwise: L1Plan) -> None:
        self.dense = dense
        self.otherwise = otherwise
        self.settings = dense.settings

    def search(self, query: PlanQuery) -> HybridSearch:
        """The ``top_k`` chunks with the best dense similarity (best first), then the other exact-identifier chunks
        and the other BM25 hits from ``lexical_rescore_min`` up, best similarity first (the order a search restricted
        to them returns)."""
        settings = self.settings
        with query.clock("query_terms"):
            terms = analysed_text(query.text) if settings.retrieval.lexical_top_k > 0 else ""
        if not terms and not query.exact_terms:
            return self.otherwise.search(query)
        exact_ids = list(query.exact_terms)
        with query.clock("search"):
            found = self.dense.hybrid_search(
                query.embedding,
                terms,
                query.category,
                timeout=query.deadline.timeout(settings.storage.milvus_search_timeout_s),
                ids=exact_ids,
                scope=query.scope,
            )
        by_similarity = sorted(found.candidates, key=lambda c: -c.similarity)  # stable: ties keep Milvus' order
        dense = by_similarity[: settings.retrieval.top_k]
        relative = relative_to_best(found.bm25)
        known = {c.chunk_id for c in dense}
        brought = set(exact_ids) | {c for c, score in relative.items() if score >= settings.lexical_rescore_min}
        added = [
            c for c in by_similarity[settings.retrieval.top_k :] if c.chunk_id in brought and c.chunk_id not in known
        ]
        return HybridSearch(
            candidates=one_version_per_source(dense + added),
            lexical_scores=relative,
            exact_terms=query.exact_terms,
            exact_df=query.exact_df,
            path=found.path,
            path_fallback_reason=found.path_fallback_reason,
            lexical_mode="milvus_bm25",
            lexical_count=len(relative),
            lexical_added=len(added),
            milvus_calls=milvus_calls(found.path),
        )


class DenseBm25Plan:
    """The dense search in Milvus and BM25 in process (``in_process_bm25``; or BM25 off, exact identifiers only).

    Where the path can send its search ahead (the sdk path, :meth:`L1Retriever.send`: gRPC's own future), the dense
    search goes out first and BM25 runs while Milvus searches; then the chunks BM25 or an exact identifier brings
    are read by key (for their dense similarity), still while the dense search is out, and the lookup waits for its
    answer last: one round trip, no thread of ours between (on the Milvus 2.3 server, 1k chunks: the search stage
    0.5-0.9 ms shorter, docs/measurements.md). Elsewhere BM25 runs first and the dense search goes out on a worker
    beside the read, or here when there is nothing to read. Sending a search from a thread of ours while BM25 ran
    was slower (session 14: the two contended for the interpreter); a sent gRPC request needs no Python until its
    answer. The ``search`` stage is the time spent sending and waiting, BM25's own time is ``lexical``. Chunks read
    by key in an earlier lookup are scored here from their ``kept`` vectors (none under a caller's scope: a Milvus
    expression only Milvus evaluates); only the others are read.
    """

    def __init__(
        self, dense: L1Retriever, bm25: InProcessBm25 | None, kept: KeptChunks, lexical_mode: LexicalMode
    ) -> None:
        self.dense = dense
        self.bm25 = bm25
        self.kept = kept
        self.lexical_mode = lexical_mode
        self.settings = dense.settings

    def search(self, query: PlanQuery) -> HybridSearch:
        """The dense candidates, then the chunks they missed that BM25 or an exact identifier brings."""
        if not query.exact_terms and self.bm25 is None:  # nothing to score beside the dense search
            with query.clock("search"):
                dense = self._dense(query, query.deadline.timeout(self.settings.storage.milvus_search_timeout_s))
            return merged(dense, [], [], query, self.lexical_mode)
        with query.clock("search"):
            answer = self.dense.send(query.embedding, query.category, self._timeout(query), query.scope, self.kept)
        lexical_hits = self.bm25.hits(query) if self.bm25 is not None else []
        chunks = wanted(self.settings, query, lexical_hits)
        dense, extra, read, failed = self._dense_and_read(query, chunks, answer)
        result = merged(dense, lexical_hits, chunks, query, self.lexical_mode)
        result.milvus_calls += 1 if read else 0
        if result.lexical_added:
            if failed is not None:
                log.warning("scoring lexical candidates failed: %s", failed)
            # What the dense search also returned is dropped from the chunks read: the candidates are the ones a
            # second search restricted to the chunks the dense search missed would return.
            outside = {c for c in chunks if c not in {d.chunk_id for d in dense.candidates}}
            added = [c for c in extra if c.chunk_id in outside]
            result.candidates = one_version_per_source(result.candidates + added)
        return within_scope(result, query.scope)

    def _timeout(self, query: PlanQuery) -> float:
        return query.deadline.timeout(self.settings.storage.milvus_search_timeout_s)

    def _dense(self, query: PlanQuery, timeout: float) -> L1Search:
        return self.dense.search(query.embedding, query.category, timeout=timeout, scope=query.scope, kept=self.kept)

    def _dense_and_read(
        self, query: PlanQuery, chunks: list[str], answer: Callable[[], L1Search] | None
    ) -> tuple[L1Search, list[Candidate], bool, Exception | None]:
        """The dense search's answer (``answer``: the search already sent; else it goes out now, on a worker when a
        read goes beside it, here when none does) and the chunks not kept read by key meanwhile: the dense answer,
        the chunks with their scores best first, whether a read was sent, and why it failed if it did."""
        settings, embedding, category, scope = self.settings, query.embedding, query.category, query.scope
        held = self.kept.scored(embedding, chunks, category) if scope is None else []
        to_read = [c for c in chunks if not self.kept.has_vector(c)] if scope is None else chunks
        extra = _best_first(held, settings.schema_fields.metric)
        sent = bool(to_read) and not query.deadline.expired
        if answer is None and not sent:  # nothing to send beside it: the dense search alone, here
            with query.clock("search"):
                return self._dense(query, self._timeout(query)), extra, False, None
        started = time.perf_counter()
        dense_call = DENSE_BESIDE.submit(self._dense, query, self._timeout(query)) if answer is None else None
        try:
            failed: Exception | None = None
            if sent:
                try:
                    read = self.dense.scored(embedding, to_read, category, self._timeout(query), scope, kept=self.kept)
                    extra = (
                        _best_first(held + read.candidates, settings.schema_fields.metric) if held else read.candidates
                    )
                except Exception as exc:  # the dense candidates (and the kept ones) still stand
                    failed = exc
            dense = (
                answer()
                if answer is not None
                else DENSE_BESIDE.wait(cast(Future[L1Search], dense_call), query.deadline)
            )
        finally:
            if dense_call is not None:
                dense_call.cancel()  # a no-op once it runs; an exception above must not leave it queued
            waited = (time.perf_counter() - started) * 1000
            query.clock.stage_ms["search"] = round(query.clock.stage_ms.get("search", 0.0) + waited, 3)
        return dense, extra, sent, failed


def _best_first(candidates: list[Candidate], metric: str) -> list[Candidate]:
    """``candidates`` in the order a dense search returns them: best score first (lowest for L2), ties kept."""
    lower_is_better = metric.upper() == "L2"
    return sorted(candidates, key=lambda c: c.score if lower_is_better else -c.score)


def within_scope(result: HybridSearch, scope: Scope | None) -> HybridSearch:
    """``result`` with its in-process BM25 scores (taken without the caller's ``scope``) kept for the chunks the
    scoped search kept, relative to the best of them again (the relative score is to the query's best hit under the
    same filter)."""
    if scope and result.lexical_scores:
        kept = {c.chunk_id for c in result.candidates}
        result.lexical_scores = relative_to_best(
            {chunk_id: score for chunk_id, score in result.lexical_scores.items() if chunk_id in kept}
        )
        result.lexical_count = len(result.lexical_scores)
    return result


def build_plans(
    dense: L1Retriever,
    lexical: LexicalIndex | None,
    kept: KeptChunks,
    lexical_mode: LexicalMode,
    *,
    mirrored: bool,
) -> tuple[L1Plan | None, L1Plan]:
    """The plans of one pipeline: the memory plan's (``None`` without a mirror) and the one searching Milvus (every
    search on the milvus plan, and a scoped one on the memory plan)."""
    bm25 = InProcessBm25.of(lexical, dense.settings, lexical_mode)
    in_milvus: L1Plan = DenseBm25Plan(dense, bm25, kept, lexical_mode)
    in_memory: L1Plan | None = MirrorPlan(dense, bm25, lexical_mode) if mirrored else None
    if lexical_mode == "milvus_bm25":
        in_milvus = FusedPlan(dense, in_milvus)
        in_memory = FusedPlan(dense, in_memory) if in_memory is not None else None
    return in_memory, in_milvus


__all__ = [
    "DenseBm25Plan",
    "FusedPlan",
    "HybridSearch",
    "InProcessBm25",
    "L1Plan",
    "MirrorPlan",
    "PlanQuery",
    "build_plans",
]
