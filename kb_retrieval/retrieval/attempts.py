"""L1 attempts: the filtered attempt, and the unfiltered retry when it is empty, without evidence or weak.

One attempt is: the hybrid search (dense + lexical, scored by Milvus) -> the node postprocessors (rerank, dedupe,
...) -> evidence blocks. A failed search is a failed attempt (``outcome = "error"``), never an exception; so is an
unfiltered search answering nothing from a collection known to hold documents (a server still loading after a
restart); an attempt that would start after the lookup's deadline is ``skipped``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore

from kb_retrieval.config import KBSettings
from kb_retrieval.models import EvidenceBlock, FallbackReason, RetrievalAttempt
from kb_retrieval.retrieval.calibration import Calibration, calibrate
from kb_retrieval.retrieval.deadline import SEARCHES, Deadline
from kb_retrieval.retrieval.events import lookup_retrieval, postprocess, span
from kb_retrieval.retrieval.evidence import build_evidence_blocks
from kb_retrieval.retrieval.hybrid import HybridRetriever, HybridSearch, LookupQuery
from kb_retrieval.retrieval.stage import deferred_stage_writes, publish_stage
from kb_retrieval.retrieval.timing import StageClock

log = logging.getLogger(__name__)
dispatcher = get_dispatcher(__name__)


@dataclass
class AttemptResult:
    """One attempt's trace, its ranked nodes and the evidence blocks built from them."""

    trace: RetrievalAttempt
    nodes: list[NodeWithScore] = field(default_factory=list)
    blocks: list[EvidenceBlock] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return bool(self.blocks)


@dataclass
class L1Outcome:
    """Every attempt of a lookup's L1 search, why it fell back, its calibration, and the identifier names of the
    query that no document holds (``ExactIdentifierIndex.unheld``: they keep relevance below ``high``)."""

    attempts: list[AttemptResult] = field(default_factory=list)
    fallback_reason: FallbackReason | None = None
    calibration: Calibration | None = None
    unheld_identifiers: list[str] = field(default_factory=list)

    @property
    def selected(self) -> AttemptResult | None:
        """The last usable attempt (the retry when it produced evidence)."""
        return next((a for a in reversed(self.attempts) if a.usable), None)

    @property
    def unavailable(self) -> bool:
        """The knowledge base as a whole was never searched: no attempt returned a candidate and no unfiltered
        attempt completed (each failed or was skipped). An outage, not an empty answer."""
        return (
            bool(self.attempts)
            and not any(a.trace.candidate_count for a in self.attempts)
            and all(a.trace.filtered or a.trace.outcome in ("error", "skipped") for a in self.attempts)
        )


class AttemptRunner:
    """Runs the L1 attempts of one lookup through the hybrid retriever and the postprocessors."""

    def __init__(
        self,
        hybrid: HybridRetriever,
        postprocessors: Sequence[BaseNodePostprocessor],
        settings: KBSettings,
        calibration: Calibration | None = None,
    ) -> None:
        self.hybrid = hybrid
        self.postprocessors = list(postprocessors)
        self.settings = settings
        #: The thresholds found and relevance use on this knowledge base (retrieval/calibration.py).
        self.calibration = calibration or calibrate(None, settings, "no calibration given")

    def run(
        self,
        query: LookupQuery,
        embedding: list[float],
        deadline: Deadline,
        clock: StageClock,
        *,
        known_documents: int = 0,
    ) -> L1Outcome:
        """The attempts of one lookup. ``known_documents``: how many documents the lookup's state says the
        collection holds (0: unknown); an unfiltered search that answers no candidates then is a failed search
        (a server still loading after a restart, a released collection), not an empty knowledge base."""
        # The attempts' own bookkeeping and the lookup's identifiers count as the stage ``attempt`` (as each attempt's
        # beyond its stages does, see _timed_attempt): the stages add up to the lookup.
        stages_before = sum(clock.stage_ms.values())
        t0 = time.perf_counter()
        category = query.category_filter
        # The query's identifiers, looked up once: every attempt's search reads them from the query.
        query = replace(query, identifiers=self.hybrid.identifiers(query.query_str))
        unheld = query.identifiers.unheld if query.identifiers is not None else []
        outcome = L1Outcome(calibration=self.calibration, unheld_identifiers=unheld)
        # One RetrievalStart/End pair for the lookup's retrieval, whatever the attempts (none inside a retriever,
        # whose BaseRetriever.retrieve sends its own).
        # The nodes leave the lookup only through the end event: their stage data is written as JSON (once, for
        # the settled attempt's nodes) only when a handler can read it; the lookup itself reads the typed data.
        with lookup_retrieval(query, before_end=publish_stage) as retrieved:
            first = self._timed_attempt(clock, 1, query, embedding, category, deadline, known_documents=known_documents)
            outcome.attempts.append(first)
            if category and first.trace.outcome != "ok":
                outcome.fallback_reason = (
                    "filtered_vector_low_quality"
                    if first.trace.outcome == "low_quality"
                    else "filtered_vector_no_evidence"
                )
                second = self._timed_attempt(
                    clock, 2, query, embedding, None, deadline, known_documents=known_documents
                )
                outcome.attempts.append(second)
            settled = outcome.selected or outcome.attempts[-1]
            retrieved(settled.nodes)
        _add_own_time(clock, t0, stages_before)
        return outcome

    def _timed_attempt(
        self,
        clock: StageClock,
        number: int,
        query: LookupQuery,
        embedding: list[float],
        category: str | None,
        deadline: Deadline,
        *,
        known_documents: int = 0,
    ) -> AttemptResult:
        """One attempt, its own bookkeeping (trace, events, span) timed as the stage ``attempt``: the time the attempt
        took beyond its stages (search, candidates, rerank)."""
        stages_before = sum(clock.stage_ms.values())
        t0 = time.perf_counter()
        result = self.attempt(number, query, embedding, category, deadline, clock, known_documents=known_documents)
        _add_own_time(clock, t0, stages_before)
        return result

    def _search(
        self,
        embedding: list[float],
        query: LookupQuery,
        category: str | None,
        deadline: Deadline,
        clock: StageClock,
    ) -> HybridSearch:
        """The attempt's search. On the memory plan, in this thread; a search in Milvus runs on a worker and is waited
        for only until the lookup's deadline: pymilvus' reconnect after a server restart ignores the call's timeout
        (one call took 5.2 s on a 3 s deadline), and a lookup answers in time whatever the client does."""
        if self.hybrid.dense.mirror_for(query.scope) is not None:
            return self.hybrid.search(
                embedding,
                query.query_str,
                category,
                deadline,
                clock.stage_ms,
                scope=query.scope,
                identifiers=query.identifiers,
            )
        stages: dict[str, float] = {}  # the worker's own: a search given up on must not write into this lookup's
        future = SEARCHES.submit(
            self.hybrid.search,
            embedding,
            query.query_str,
            category,
            deadline,
            stages,
            scope=query.scope,
            identifiers=query.identifiers,
        )
        search = SEARCHES.wait(future, deadline)
        for stage, ms in stages.items():
            clock.stage_ms[stage] = round(clock.stage_ms.get(stage, 0.0) + ms, 3)
        return search

    @span(dispatcher)
    def attempt(
        self,
        number: int,
        query: LookupQuery,
        embedding: list[float],
        category: str | None,
        deadline: Deadline,
        clock: StageClock,
        *,
        known_documents: int = 0,
    ) -> AttemptResult:
        settings = self.settings
        trace = RetrievalAttempt(
            attempt=number,
            filtered=category is not None,
            category_filter=category,
            filter_expr=self.hybrid.dense.filter_expr(category, scope=query.scope),
            query=query.query_str,
            outcome="no_candidates",
        )
        if deadline.expired:
            trace.outcome = "skipped"
            trace.error = "the lookup's deadline (lookup_timeout_s) passed before this attempt"
            return AttemptResult(trace)
        t0 = time.perf_counter()
        bundle = LookupQuery(
            query_str=query.query_str,
            embedding=embedding,
            transform=query.transform,
            category_filter=category,
            deadline=deadline,
            scope=query.scope,
            identifiers=query.identifiers,
        )
        try:
            search = self._search(embedding, query, category, deadline, clock)
        except Exception as exc:  # a failed path is a failed attempt, never an exception to the agent
            log.warning("L1 attempt %d failed: %s", number, exc)
            trace.outcome = "error"
            trace.error = f"{type(exc).__name__}: {str(exc)[:500]}"
            trace.elapsed_ms = round((time.perf_counter() - t0) * 1000, 3)
            return AttemptResult(trace)
        if not search.candidates and category is None and query.scope is None and known_documents:
            # Milvus answered, but not from the rows it holds: not an empty answer. (A caller's scope may hold no
            # document at all: its empty search is an empty answer.)
            trace.outcome = "error"
            trace.error = (
                f"the unfiltered search answered no candidates although the collection holds {known_documents} "
                "documents (still loading after a restart, or released?)"
            )
            trace.path = search.path
            trace.milvus_calls = search.milvus_calls
            trace.elapsed_ms = round((time.perf_counter() - t0) * 1000, 3)
            log.warning("L1 attempt %d: %s", number, trace.error)
            return AttemptResult(trace)
        trace.lexical_mode = search.lexical_mode
        trace.lexical_count = search.lexical_count
        trace.lexical_added = search.lexical_added
        trace.milvus_calls = search.milvus_calls
        trace.path = search.path
        trace.path_fallback_reason = search.path_fallback_reason
        trace.candidate_count = len(search.candidates)
        trace.top_similarity = max((c.similarity for c in search.candidates), default=None)

        # The chain is the pipeline's own: stage data stays typed between its stages (see ``run`` for its JSON).
        with deferred_stage_writes():
            with clock("candidates"):
                nodes = search.nodes()
            with clock("rerank"):
                for postprocessor in self.postprocessors:
                    nodes = postprocess(postprocessor, nodes, bundle)
                blocks = build_evidence_blocks(
                    nodes,
                    evidence_threshold=self.calibration.evidence_threshold,
                    max_blocks=settings.evidence.max_evidence_blocks,
                    follow_ranking=settings.evidence.evidence_follows_ranking,
                    fill_by_ranking=settings.evidence.evidence_fills_by_ranking,
                )
        trace.evidence_count = len(blocks)
        trace.evidence_threshold = settings.evidence.evidence_threshold  # what a near miss is reported against
        if not search.candidates:
            trace.outcome = "no_candidates"
        elif not blocks:
            trace.outcome = "no_evidence"
        elif category is not None and (why := _low_quality(trace.top_similarity, category, query, settings)):
            trace.outcome, trace.outcome_reason = "low_quality", why
        else:
            trace.outcome = "ok"
        trace.elapsed_ms = round((time.perf_counter() - t0) * 1000, 3)
        return AttemptResult(trace, nodes, blocks)


def _add_own_time(clock: StageClock, t0: float, stages_before: float) -> None:
    """Add to the stage ``attempt`` the milliseconds since ``t0`` that no stage timed since (``stages_before``: the
    sum of the clock's stages at ``t0``)."""
    inside = sum(clock.stage_ms.values()) - stages_before
    own = (time.perf_counter() - t0) * 1000 - inside
    clock.stage_ms["attempt"] = round(clock.stage_ms.get("attempt", 0.0) + own, 3)


def _low_quality(top_similarity: float | None, category: str, query: LookupQuery, settings: KBSettings) -> str | None:
    """Why a filtered attempt that found evidence is still low quality, or None: its best similarity is below the
    reference threshold (spec 000), or L0's own title coverage favours a document outside the filter (the query
    covers the title of a document of another domain best: the filter came from a weaker match than that)."""
    if (top_similarity or 0.0) < settings.evidence.reference_threshold:
        return (
            f"top similarity {top_similarity or 0.0:.3f} below reference_threshold "
            f"{settings.evidence.reference_threshold}"
        )
    hints = query.transform.hints if query.transform is not None else None
    if hints is not None and hints.coverage_domain and hints.coverage_domain != category:
        source, share = next(iter(hints.title_coverage.items()))
        return f"L0 title coverage favours {source} ({share:.2f}, domain {hints.coverage_domain}) outside the filter"
    return None
