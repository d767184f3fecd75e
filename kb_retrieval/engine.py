"""The stages in order, and the faces over them: ``KnowledgeLookup.lookup`` and a ``CustomQueryEngine``.

One request flows forward: query transform (L0 hints, filter) -> L1 attempt(s) -> rule rerank -> dedupe by source
-> evidence blocks -> context pack -> result -> trace record.

Example:
    >>> lookup = KnowledgeLookup(Settings(state_dir=".kb-state/demo"))  # doctest: +SKIP
    >>> result = lookup.lookup("RedisMemoryHigh on cache-01")  # doctest: +SKIP
    >>> result.evidence_blocks[0].source  # doctest: +SKIP
    'redis/memory-usage-high.md'
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.base.response.schema import Response
from llama_index.core.query_engine import CustomQueryEngine
from llama_index.core.schema import NodeWithScore, TextNode
from pymilvus import MilvusClient

from kb_retrieval.config import Settings
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.indexing.l0_index import L0Index
from kb_retrieval.indexing.milvus import connect, ensure_collection, iter_rows
from kb_retrieval.indexing.onnx_query import query_encoder
from kb_retrieval.models import (
    Candidate,
    EvidenceBlock,
    EvidenceStatus,
    LookupResult,
    QueryTransform,
    RelevanceLevel,
    RerankEntry,
    RerankTrace,
    RetrievalAttempt,
    RetrievalTrace,
)
from kb_retrieval.retrieval.context_pack import pack_context
from kb_retrieval.retrieval.dedupe import SourceDeduplicator
from kb_retrieval.retrieval.evidence import build_evidence_blocks
from kb_retrieval.retrieval.l0_hints import L0HintProvider
from kb_retrieval.retrieval.l1 import L1Retriever, VectorPath, make_path
from kb_retrieval.retrieval.l1.base import one_version_per_source
from kb_retrieval.retrieval.l1.retriever import candidate_node, node_candidate
from kb_retrieval.retrieval.lexical import LexicalIndex
from kb_retrieval.retrieval.query_transform import transform_query
from kb_retrieval.retrieval.rerank import RuleReranker
from kb_retrieval.traces import TraceStore

if TYPE_CHECKING:  # the sidecar is imported at run time only when enabled
    from sidecar.models import SidecarRun
    from sidecar.runner import SidecarRunner

log = logging.getLogger(__name__)

NO_EVIDENCE_MESSAGE = "No knowledge evidence was found in the knowledge base for this query."


@dataclass
class _AttemptResult:
    trace: RetrievalAttempt
    nodes: list[NodeWithScore] = field(default_factory=list)
    blocks: list[EvidenceBlock] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return bool(self.blocks)


class KnowledgeLookup:
    """The ``lookup_knowledge`` pipeline. Build once (loads the model, connects Milvus); call ``lookup`` often.

    Thread-safe: ``lookup`` keeps no per-call state on the object.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        embed_model: BaseEmbedding | None = None,
        client: MilvusClient | None = None,
        path: VectorPath | None = None,
        trace_store: TraceStore | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.client = client or connect(self.settings)
        ensure_collection(self.client, self.settings, create=False)
        # Queries go through the ONNX export of the bundled model when configured (a few ms instead of ~20 ms of
        # torch); a user's own model is used as it is. Nothing here loads torch unless it is the encoder.
        self.query_embed_model = query_encoder(self.settings, embed_model)
        self.embed_model = embed_model or self.query_embed_model
        self.l0 = L0HintProvider(L0Index.load(self.settings.l0_index_path()))
        self.path = path or make_path(self.settings, self.client)
        self.retriever = L1Retriever(self.path, self.settings, self.query_embed_model)
        self.lexical = self._build_lexical() if self.settings.lexical_enabled else None
        self.traces = trace_store or TraceStore(
            self.settings.resolved_trace_db_url(),
            content_chars=self.settings.trace_content_chars,
            query_chars=self.settings.max_query_chars,
        )
        # --- sidecar (issue 5): comparison only, off by default; not even imported unless enabled ---------
        self.sidecar: SidecarRunner | None = None
        self._sidecar_last = threading.local()  # this thread's last sidecar run, for lookup_with_sidecar
        if self.settings.sidecar_enabled:
            from sidecar.runner import SidecarRunner

            self.sidecar = SidecarRunner(self.settings, self.embed_model)
        # --- end sidecar ------------------------------------------------------------------------------------

    def _build_lexical(self) -> LexicalIndex:
        """BM25 over the chunks the collection holds now (text with its breadcrumb)."""
        s = self.settings
        rows = (
            (
                row[s.id_field],
                f"{(row.get(s.metadata_field) or {}).get('breadcrumb', '')}\n{row.get(s.content_field, '')}",
                row.get(s.category_field) or "",
            )
            for row in iter_rows(self.client, s, [s.id_field, s.content_field, s.category_field, s.metadata_field])
        )
        return LexicalIndex.build(rows)

    # --- the pipeline ---------------------------------------------------------------------------------

    def lookup(self, query: str) -> LookupResult:
        """Run one lookup and record it. Raises ``EmptyQueryError`` for an empty query; never for retrieval."""
        return self.lookup_ranked(query)[0]

    def lookup_ranked(self, query: str) -> tuple[LookupResult, list[Candidate]]:
        """The result, plus the document-level ranking it came from (one candidate per source, best first).

        The ranking is what fixtures record for offline evaluation: the selected attempt's reranked,
        deduplicated candidates (the last attempt's when none was usable).
        """
        started = time.perf_counter()
        sidecar_job = self.sidecar.start(query) if self.sidecar else None  # sidecar (issue 5): runs beside from here
        stage_ms: dict[str, float] = {}
        clock = _Clock(stage_ms)

        with clock("query_transform"):
            transform = transform_query(query, self.l0, self.settings.max_query_chars)
        attempts: list[_AttemptResult] = []
        fallback_reason = None
        if self.settings.l1_enabled:
            with clock("embed"):
                embedding = embed_query(self.query_embed_model, transform.normalized_query)
            first = self._attempt(1, embedding, transform, transform.category_filter, clock)
            attempts.append(first)
            if transform.category_filter and first.trace.outcome != "ok":
                fallback_reason = (
                    "filtered_vector_low_quality"
                    if first.trace.outcome == "low_quality"
                    else "filtered_vector_no_evidence"
                )
                attempts.append(self._attempt(2, embedding, transform, None, clock))
        selected = next((a for a in reversed(attempts) if a.usable), None)

        with clock("pack"):
            blocks = selected.blocks if selected else []
            pack = pack_context(blocks, self.settings.context_budget_tokens)
        result = LookupResult(
            found=bool(blocks),
            evidence_status=EvidenceStatus.OK if blocks else EvidenceStatus.NO_EVIDENCE,
            message=_message(blocks, attempts, self.settings.l1_enabled),
            evidence_blocks=blocks,
            context_pack=pack,
            query_transform=transform,
            retrieval_trace=RetrievalTrace(
                attempts=[a.trace for a in attempts],
                selected_attempt=selected.trace.attempt if selected else None,
                fallback_reason=fallback_reason,  # type: ignore[arg-type]
                path_served=next((a.trace.path for a in reversed(attempts) if a.trace.path), None),
                candidate_count=selected.trace.candidate_count
                if selected
                else sum(a.trace.candidate_count for a in attempts),
                final_count=len(blocks),
            ),
            rerank_trace=_rerank_trace(selected),
            relevance_level=_relevance(blocks),
            completeness_hint=_completeness(blocks, pack.summary.truncated_sources, pack.summary.omitted_sources),
            retrieval_layer=_layer(transform, attempts, blocks),
            stage_ms=stage_ms,
        )
        # sidecar (issue 5): wait out what is left of its deadline; its run goes to the trace row, never to `result`
        sidecar_run = sidecar_job.collect() if sidecar_job else None
        self._sidecar_last.run = sidecar_run
        result.elapsed_ms = round((time.perf_counter() - started) * 1000, 3)
        with clock("trace_write"):
            sidecar_entry = sidecar_run.trace_entry() if sidecar_run else None
            result.trace_recorded = self.traces.record(query, result, sidecar=sidecar_entry)
        # The row cannot hold its own write time; the result can.
        result.stage_ms["trace_write"] = stage_ms["trace_write"]
        ranked_from = selected or (attempts[-1] if attempts else None)
        ranking = [node_candidate(n) for n in ranked_from.nodes] if ranked_from else []
        return result, ranking

    def lookup_with_sidecar(self, query: str) -> tuple[LookupResult, list[Candidate], SidecarRun]:
        """``lookup_ranked`` plus the sidecar's run beside it (status ``disabled`` when it is off), for comparisons.

        The result and ranking are exactly ``lookup_ranked``'s: the sidecar never changes them.
        """
        result, ranking = self.lookup_ranked(query)
        run: SidecarRun | None = getattr(self._sidecar_last, "run", None)
        if run is None:
            from sidecar.models import disabled_run

            run = disabled_run()
        return result, ranking, run

    def _attempt(
        self,
        number: int,
        embedding: list[float],
        transform: QueryTransform,
        category: str | None,
        clock: _Clock,
    ) -> _AttemptResult:
        settings = self.settings
        trace = RetrievalAttempt(
            attempt=number,
            filtered=category is not None,
            category_filter=category,
            filter_expr=self.retriever.filter_expr(category),
            query=transform.normalized_query,
            outcome="no_candidates",
        )
        t0 = time.perf_counter()
        try:
            with clock("search"):
                search = self.retriever.search(embedding, category)
        except Exception as exc:  # a failed path is a failed attempt, never an exception to the agent
            log.warning("L1 attempt %d failed: %s", number, exc)
            trace.outcome = "error"
            trace.error = f"{type(exc).__name__}: {str(exc)[:500]}"
            trace.elapsed_ms = round((time.perf_counter() - t0) * 1000, 3)
            return _AttemptResult(trace)
        lexical_scores: dict[str, float] = {}
        if self.lexical is not None and settings.lexical_top_k > 0:
            with clock("lexical"):
                hits = self.lexical.search(transform.normalized_query, settings.lexical_top_k, category)
                lexical_scores = {h.chunk_id: h.score for h in hits}
                known = {c.chunk_id for c in search.candidates}
                floor = settings.lexical_rescore_min
                missing = [h.chunk_id for h in hits if h.chunk_id not in known and h.score >= floor]
            if missing:  # Milvus scores the lexical candidates the dense search did not return
                try:
                    with clock("search"):
                        extra = self.retriever.search(embedding, category, ids=missing)
                    search.candidates = one_version_per_source(search.candidates + extra.candidates)
                except Exception as exc:  # the dense candidates still stand
                    log.warning("scoring lexical candidates failed: %s", exc)
            trace.lexical_count = len(hits)
            trace.lexical_added = len(missing)
        trace.path = search.path
        trace.path_fallback_reason = search.path_fallback_reason
        trace.candidate_count = len(search.candidates)
        trace.top_similarity = max((c.similarity for c in search.candidates), default=None)

        with clock("rerank"):
            nodes = [candidate_node(c) for c in search.candidates]
            nodes = RuleReranker(
                hints=transform.hints, lexical_scores=lexical_scores, lexical_weight=settings.lexical_weight
            ).postprocess_nodes(nodes)
            nodes = SourceDeduplicator(focus_weight=settings.doc_focus_weight).postprocess_nodes(nodes)
            blocks = build_evidence_blocks(
                nodes, evidence_threshold=settings.evidence_threshold, max_blocks=settings.max_evidence_blocks
            )
        trace.evidence_count = len(blocks)
        if not search.candidates:
            trace.outcome = "no_candidates"
        elif not blocks:
            trace.outcome = "no_evidence"
        elif category is not None and (trace.top_similarity or 0.0) < settings.reference_threshold:
            trace.outcome = "low_quality"
        else:
            trace.outcome = "ok"
        trace.elapsed_ms = round((time.perf_counter() - t0) * 1000, 3)
        return _AttemptResult(trace, nodes, blocks)

    def close(self) -> None:
        self.traces.close()


class _Clock:
    """Adds the wall time of named stages into ``stage_ms`` (a stage may run more than once)."""

    def __init__(self, stage_ms: dict[str, float]) -> None:
        self.stage_ms = stage_ms
        self._name = ""
        self._t0 = 0.0

    def __call__(self, name: str) -> _Clock:
        self._name = name
        return self

    def __enter__(self) -> None:
        self._t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        elapsed = (time.perf_counter() - self._t0) * 1000
        self.stage_ms[self._name] = round(self.stage_ms.get(self._name, 0.0) + elapsed, 3)


def _rerank_trace(selected: _AttemptResult | None) -> RerankTrace:
    if selected is None:
        return RerankTrace()
    entries = []
    for rank, node in enumerate(selected.nodes[: max(len(selected.blocks), 1)], start=1):
        record = node.node.metadata.get("rerank", {})
        candidate = node_candidate(node)
        entries.append(
            RerankEntry(
                rank=rank,
                source=candidate.source,
                breadcrumb=candidate.breadcrumb,
                base_score=record.get("base_score", candidate.similarity),
                boosts=record.get("boosts", {}),
                final_score=round(float(node.score or 0.0), 6),
            )
        )
    return RerankTrace(candidate_count=selected.trace.candidate_count, entries=entries)


def _relevance(blocks: list[EvidenceBlock]) -> RelevanceLevel:
    if not blocks:
        return "none"
    top = max(b.similarity for b in blocks)
    return "high" if top >= 0.6 else "medium" if top >= 0.45 else "low"


def _completeness(blocks: list[EvidenceBlock], truncated: list[str], omitted: list[str]) -> str:
    if not blocks:
        return "no_evidence"
    if omitted or truncated:
        return "partial: context budget truncated or omitted evidence; ask a narrower question for more"
    if len(blocks) == 1:
        return "single_source: one document answers; it may not cover every aspect"
    return f"multiple_sources: {len(blocks)} documents, all packed whole"


def _layer(transform: QueryTransform, attempts: list[_AttemptResult], blocks: list[EvidenceBlock]) -> Any:
    if not any(a.trace.candidate_count for a in attempts):
        return "none"
    uses_l0 = not transform.hints.empty or any(b.retrieval_layer == "L0+L1" for b in blocks)
    return "L0+L1" if uses_l0 else "L1"


def _message(blocks: list[EvidenceBlock], attempts: list[_AttemptResult], l1_enabled: bool) -> str:
    if blocks:
        sources = len({b.source for b in blocks})
        return f"Found {len(blocks)} evidence block(s) from {sources} source(s)."
    if not l1_enabled:
        return NO_EVIDENCE_MESSAGE + " (L1 retrieval is disabled by configuration; L0 hints are not evidence.)"
    tried = "; ".join(f"attempt {a.trace.attempt}: {a.trace.outcome}" for a in attempts)
    return f"{NO_EVIDENCE_MESSAGE} ({tried})"


# --- faces ------------------------------------------------------------------------------------------------


def agent_text(result: LookupResult) -> str:
    """What the agent reads: derived only from the evidence blocks and the context pack."""
    if not result.found:
        return result.message
    head = (
        f"{result.message} Relevance: {result.relevance_level}. Completeness: {result.completeness_hint}.\n"
        "Cite sources by their [n] index.\n\n"
    )
    return head + result.context_pack.text


def evidence_nodes(result: LookupResult) -> list[NodeWithScore]:
    return [
        NodeWithScore(
            node=TextNode(
                text=block.content,
                metadata={
                    "source": block.source,
                    "title": block.title,
                    "breadcrumb": block.breadcrumb,
                    "retrieval_layer": block.retrieval_layer,
                    "hit_reasons": block.hit_reasons,
                },
            ),
            score=block.score,
        )
        for block in result.evidence_blocks
    ]


class KnowledgeQueryEngine(CustomQueryEngine):
    """A LlamaIndex query engine over the pipeline: the response's source nodes are the evidence blocks."""

    lookup: Any

    def custom_query(self, query_str: str) -> Response:
        result: LookupResult = self.lookup.lookup(query_str)
        return Response(
            response=agent_text(result),
            source_nodes=evidence_nodes(result),
            metadata={"lookup_result": result.to_json_dict()},
        )
