"""The ``lookup_knowledge`` pipeline: the stages in order, and its LlamaIndex faces.

One request flows forward, each stage its own module and span:

    query transform (L0 hints, filter) -> embed -> L1 attempts (hybrid retriever -> rerank -> dedupe -> evidence)
    -> context pack -> result assembly -> trace record

``lookup`` is the contract call (a :class:`~kb_retrieval.models.LookupResult`); ``as_retriever``,
``as_query_engine`` and ``as_tool`` are the same pipeline as LlamaIndex parts.

Example:
    >>> lookup = KnowledgeLookup(KBSettings(state_dir=".kb-state/demo"))  # doctest: +SKIP
    >>> result = lookup.lookup("RedisMemoryHigh on cache-01")  # doctest: +SKIP
    >>> result.evidence_blocks[0].source  # doctest: +SKIP
    'redis/memory-usage-high.md'
    >>> RetrieverQueryEngine.from_args(lookup.as_retriever(), llm=llm)  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import gc
import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.instrumentation import get_dispatcher
from pymilvus import MilvusClient

from kb_retrieval.beside import BesideRun, BesideRunner, disabled_entry, load_runner
from kb_retrieval.config import KBSettings
from kb_retrieval.freshness import FreshnessCheck
from kb_retrieval.indexing.doc_vectors import DocumentVectors
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.indexing.index_version import index_version
from kb_retrieval.indexing.ingest_record import read_ingest_record
from kb_retrieval.indexing.l0_index import L0Index
from kb_retrieval.indexing.milvus import connect, ensure_collection, features_off, iter_rows, without_missing_fields
from kb_retrieval.indexing.model_check import check_query_model
from kb_retrieval.indexing.onnx_query import query_encoder
from kb_retrieval.indexing.snapshot import SnapshotParts, load_snapshot, snapshot_key, write_snapshot
from kb_retrieval.models import Candidate, LookupResult, QueryTransform
from kb_retrieval.overrides import check_overrides
from kb_retrieval.query_engine import KnowledgeQueryEngine
from kb_retrieval.result import agent_text, assemble_result, evidence_nodes
from kb_retrieval.retrieval.attempts import AttemptRunner, L1Outcome
from kb_retrieval.retrieval.context_pack import pack_context
from kb_retrieval.retrieval.deadline import Deadline
from kb_retrieval.retrieval.dedupe import SourceDeduplicator
from kb_retrieval.retrieval.doc_rank import DocumentRanker
from kb_retrieval.retrieval.exact import ExactIdentifierIndex, named_terms
from kb_retrieval.retrieval.expand import DocumentExpander, SectionStore
from kb_retrieval.retrieval.hybrid import HybridRetriever, LookupQuery, choose_lexical_mode
from kb_retrieval.retrieval.l0_hints import L0HintProvider
from kb_retrieval.retrieval.l1 import L1Retriever, VectorPath, make_path
from kb_retrieval.retrieval.l1.memory import MemoryMirror, MirrorTooLargeError, choose_plan
from kb_retrieval.retrieval.lexical import LexicalIndex, lexical_document
from kb_retrieval.retrieval.query_transform import transform_query
from kb_retrieval.retrieval.rerank import RuleReranker
from kb_retrieval.retrieval.scope import scope_expr
from kb_retrieval.retrieval.stage import stage_of
from kb_retrieval.retrieval.templates import without_placeholders
from kb_retrieval.retrieval.timing import StageClock
from kb_retrieval.traces import TraceStore

if TYPE_CHECKING:
    from llama_index.core.base.base_query_engine import BaseQueryEngine
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.tools import FunctionTool
    from llama_index.core.vector_stores.types import MetadataFilters

    from kb_retrieval.retriever import KnowledgeRetriever

log = logging.getLogger(__name__)
dispatcher = get_dispatcher(__name__)

__all__ = ["KnowledgeLookup", "KnowledgeQueryEngine", "LookupDetails", "agent_text", "evidence_nodes"]


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was before, after it); reference counting still
    frees what the block drops."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class LookupDetails:
    """A lookup's result, the document-level ranking it came from, and the comparison run beside it (if any)."""

    result: LookupResult
    ranking: list[Candidate] = field(default_factory=list)
    beside: BesideRun | None = None


class KnowledgeLookup:
    """The ``lookup_knowledge`` pipeline. Build once (loads the model, connects Milvus); call ``lookup`` often.

    Thread-safe: ``lookup`` keeps no per-call state on the object.
    """

    def __init__(
        self,
        settings: KBSettings | None = None,
        *,
        embed_model: BaseEmbedding | None = None,
        client: MilvusClient | None = None,
        path: VectorPath | None = None,
        trace_store: TraceStore | None = None,
        beside: BesideRunner | None = None,
    ) -> None:
        settings = settings or KBSettings()
        self.client = client or connect(settings)
        ensure_collection(self.client, settings, create=False)
        # Features the collection cannot serve (one written by stock MilvusVectorStore) are off, not errors.
        self.features_off = features_off(self.client, settings)
        self.settings = without_missing_fields(self.client, settings)
        # Queries go through the ONNX export of the bundled model when configured (a few ms instead of ~20 ms of
        # torch); a user's own model is used as it is. Nothing here loads torch unless it is the encoder.
        self.query_embed_model = query_encoder(self.settings, embed_model)
        self.embed_model = embed_model or self.query_embed_model
        custom_path = path is not None
        # What ingest recorded (model id, KB roots, metadata keys); a query model that does not fit is refused here.
        self.ingest_record = read_ingest_record(self.client, self.settings)
        for note in check_query_model(
            self.client, self.settings, self.query_embed_model, self.ingest_record.embed_model
        ):
            self.features_off.setdefault("embedding_check", note)
        self.path = path or make_path(self.settings, self.client)
        # Where searches run: a mirror of the collection in memory (Milvus Lite) or Milvus itself (a server).
        self.plan, self.plan_reason = choose_plan(self.client, self.settings, custom_path=custom_path)
        # BM25 in Milvus (one hybrid call per attempt) where the collection and the path can, else in process.
        self.lexical_mode, lexical_reason = choose_lexical_mode(self.client, self.settings, self.path)
        if lexical_reason:
            self.features_off["milvus_bm25"] = lexical_reason
        self.sections = SectionStore(self.client, self.settings)
        self._load_state()
        self._freshness = FreshnessCheck(self._reload_if_changed, self.settings.freshness_check_s)
        self.traces = trace_store or TraceStore.from_settings(self.settings)
        # The comparison runner (the sidecar) is known only through the protocol in kb_retrieval.beside.
        self.beside = beside
        if self.beside is None and self.settings.sidecar_enabled:
            self.beside = load_runner(self.settings.sidecar_factory, self.settings, self.embed_model)

    @classmethod
    def from_documents(
        cls, documents: Any, settings: KBSettings | None = None, *, embed_model: BaseEmbedding | None = None, **kw: Any
    ) -> KnowledgeLookup:
        """Ingest LlamaIndex ``Document`` s or nodes (:func:`~kb_retrieval.indexing.ingest.ingest`; ``kw``: its
        ``root``, ``name``), then the pipeline over the collection, as ``VectorStoreIndex.from_documents`` does."""
        from kb_retrieval.indexing.ingest import ingest

        settings = settings or KBSettings()
        ingest(list(documents), settings, embed_model=embed_model, **kw)
        return cls(settings, embed_model=embed_model)

    def _load_state(self) -> None:
        """Read the retrieval state kept in Milvus (the L0 index, the document vectors, the BM25 corpus) and assemble
        the parts.

        Everything is read before anything is replaced: a read that fails leaves the previous state whole. The
        cyclic garbage collector waits meanwhile: the build makes millions of short-lived containers and none of
        them a cycle, and at 100k chunks its repeated full passes over them took most of the build's time.
        """
        with _collector_paused():
            self._read_state()

    def _read_state(self) -> None:
        scoring = self.settings.scoring
        index = L0Index.load_from_milvus(self.client, self.settings)
        l0 = L0HintProvider(
            index,
            max_keyword_documents=scoring.l0_max_keyword_documents,
            title_coverage_min=scoring.l0_title_coverage_min,
            title_coverage_limit=scoring.l0_title_coverage_limit,
        )
        # What is built from every chunk comes from this host's snapshot of the index version when there is one.
        started, plan = time.perf_counter(), self.plan
        key = snapshot_key(self.settings, index.index_version, plan=plan, lexical_mode=self.lexical_mode)
        parts = load_snapshot(self.settings, key) if key else None
        if parts is not None:
            memory, lexical, exact = parts.memory, None, parts.exact
        else:
            memory = self._load_memory()
            # In milvus_bm25 mode Milvus keeps BM25 (always as fresh as the collection); the scan serves the exact
            # index. The memory plan has every row already: the same rows serve both, with no second scan.
            needs_scan = self.lexical_mode == "in_process_bm25" or scoring.exact_signals
            lexical, exact = self._build_lexical(memory.rows if memory else None) if needs_scan else (None, None)
        self.state_source = "snapshot" if parts is not None else "milvus"
        self.state_read_s = round(time.perf_counter() - started, 3)
        doc_vectors = (
            DocumentVectors.load_from_milvus(self.client, self.settings) if self.settings.document_ranking else None
        )
        # What makes a word a rare term: the documents' own titles and headings, as recorded at ingest.
        names = named_terms({s: [e.title, *e.headings] for s, e in index.documents.items()}) if exact else {}
        self.index_version, self.l0_off_reason = index.index_version, index.off_reason
        self.l0, self.lexical, self.exact, self.doc_vectors = l0, lexical, exact, doc_vectors
        self.named_terms = names
        self.memory = memory
        if parts is None and key and plan == self.plan:
            self._write_snapshot(key, index.index_version, SnapshotParts(memory=memory, exact=exact))
        if not hasattr(self, "attempts"):
            self._assemble()
            return
        # A reload swaps the state in the parts already assembled (a lookup in flight keeps what it read).
        self.dense.memory = memory
        self.hybrid.lexical = lexical
        self.hybrid.exact, self.hybrid.named_terms = exact, names
        for postprocessor in self.postprocessors:
            if isinstance(postprocessor, RuleReranker):
                postprocessor.l0 = l0
            elif isinstance(postprocessor, DocumentRanker):
                postprocessor.vectors = doc_vectors

    def _write_snapshot(self, key: str, version: str, parts: SnapshotParts) -> None:
        """Snapshot what was read, unless an ingest published a new version meanwhile (what was read may then hold
        part of it: it is kept in memory until the freshness check reloads, never under the older version's key)."""
        try:
            unchanged = index_version(self.client, self.settings, timeout=self.settings.milvus_timeout_s) == version
        except Exception as exc:
            log.warning("state snapshot not written (the index version could not be read again): %s", exc)
            return
        if unchanged:
            write_snapshot(self.settings, key, parts)

    def _load_memory(self) -> MemoryMirror | None:
        """The memory plan's mirror, read from Milvus now; ``None`` on the milvus plan. A collection past the bound
        turns this lookup object to the milvus plan, with the reason (``stats``, the trace notes)."""
        if self.plan != "memory":
            return None
        try:
            return MemoryMirror.load(
                self.client,
                self.settings,
                lexical=self.lexical_mode == "milvus_bm25",
                max_mb=self.settings.memory_plan_max_mb,
            )
        except MirrorTooLargeError as exc:
            log.warning("%s: searching in Milvus", exc)
            self.plan, self.plan_reason = "milvus", str(exc)
            return None

    def refresh(self, *, force: bool = False, deadline: Deadline | None = None) -> bool:
        """Reload the L0 index and BM25 when another process's ingest changed the index version (checked at most
        every ``freshness_check_s``, off the request path: a lookup waits for the check at most half of what is left
        of its ``deadline``, see :mod:`kb_retrieval.freshness`); True when reloaded. Never raises: when Milvus cannot
        be read, the lookup goes on with the state it has (its search then reports the outage) and the next check
        tries again. ``force``: check now and wait for it."""
        return self._freshness.run(deadline=deadline, force=force)

    def _reload_if_changed(self, force: bool = False) -> bool:
        """The freshness check: the index version (within ``milvus_timeout_s``), and a reload when it changed
        (``force``: whatever it is)."""
        try:
            current = index_version(self.client, self.settings, timeout=self.settings.milvus_timeout_s)
            # '' is also what an unreadable meta collection gives: not a reason to drop a state we have.
            if not force and (current == self.index_version or (not current and self.index_version)):
                return False
            log.info("index version changed (%s -> %s): reloading the retrieval state", self.index_version, current)
            self._load_state()
        except Exception as exc:
            log.warning("refreshing the retrieval state failed (kept the previous one): %s", exc)
            return False
        return True

    def _assemble(self) -> None:
        """The parts that read the settings: the L1 retrievers and the postprocessor chain."""
        s = self.settings
        self.dense = L1Retriever(self.path, s, self.query_embed_model, memory=self.memory)
        self.hybrid = HybridRetriever(
            self.dense,
            self.lexical,
            s,
            exact=self.exact,
            lexical_mode=self.lexical_mode if s.lexical_enabled else "off",
        )
        self.hybrid.named_terms = self.named_terms
        self.postprocessors: list[BaseNodePostprocessor] = [
            RuleReranker(boosts=s.scoring.boosts(), lexical_weight=s.lexical_weight, l0=self.l0),
            SourceDeduplicator(
                focus_weight=s.doc_focus_weight,
                focus_saturation=s.scoring.focus_saturation,
                focus_padding=s.scoring.focus_padding,
            ),
            *(
                [DocumentRanker(weights=s.scoring.ranking_weights(), vectors=self.doc_vectors)]
                if s.document_ranking
                else []
            ),
            DocumentExpander(sections=self.sections, max_documents=s.max_evidence_blocks if s.expand_documents else 0),
        ]
        self.attempts = AttemptRunner(self.hybrid, self.postprocessors, s)

    def _build_lexical(
        self, read: Iterable[dict[str, Any]] | None = None
    ) -> tuple[LexicalIndex | None, ExactIdentifierIndex | None]:
        """BM25 (in process only: text with its header) and the exact-identifier index over the chunks the collection
        holds now, from one scan (or from ``read``: rows already read, with the same fields)."""
        s = self.settings
        fields = [f for f in (s.id_field, s.content_field, s.category_field, s.metadata_field, s.source_field) if f]
        rows = []
        for row in read if read is not None else iter_rows(self.client, s, fields):
            meta = (row.get(s.metadata_field) if s.metadata_field else None) or {}
            text = lexical_document(meta.get("title"), meta.get("breadcrumb"), row.get(s.content_field, ""))
            category = (row.get(s.category_field) if s.category_field else None) or ""
            rows.append((str(row[s.id_field]), str(row.get(s.source_field) or ""), text, category))
        in_process = self.lexical_mode == "in_process_bm25"
        lexical = LexicalIndex.build((r[0], r[2], r[3]) for r in rows) if in_process else None
        exact = ExactIdentifierIndex.build((r[0], r[1], r[2]) for r in rows) if s.scoring.exact_signals else None
        return lexical, exact

    def with_settings(self, **overrides: Any) -> KnowledgeLookup:
        """The same pipeline (model, client, indexes, trace store shared) with some settings changed.

        Example:
            >>> wide = lookup.with_settings(top_k=50, max_evidence_blocks=10)  # doctest: +SKIP
        """
        check_overrides(overrides, self.settings)  # what needs another client, collection or model is refused
        clone = copy.copy(self)
        clone.settings = self.settings.model_copy(update=overrides)
        KBSettings.model_validate(clone.settings.model_dump())  # overrides are validated like any setting
        clone._assemble()
        clone._freshness = FreshnessCheck(clone._reload_if_changed, clone.settings.freshness_check_s)
        return clone

    # --- the pipeline ---------------------------------------------------------------------------------

    def scope_expr(self, filters: MetadataFilters | None) -> str | None:
        """``filters`` as the Milvus expression every request of a lookup carries (:mod:`.retrieval.scope`); raises
        ``ScopeFilterError`` for an operator it cannot translate or a key the collection does not have."""
        s = self.settings
        scalar = {name: f for name, f in (("category", s.category_field), ("source", s.source_field)) if f}
        scalar |= {f: f for f in (s.id_field, s.category_field, s.source_field) if f}
        return scope_expr(
            filters, scalar=scalar, json_field=s.metadata_field, json_keys=set(self.ingest_record.metadata_keys)
        )

    @dispatcher.span
    def lookup(self, query: str, *, filters: MetadataFilters | None = None) -> LookupResult:
        """Run one lookup and record it. Raises ``EmptyQueryError`` for an empty query; never for retrieval.

        ``filters``: a LlamaIndex ``MetadataFilters`` scope (e.g. a team or tenant key) on every Milvus request."""
        return self._lookup(query, filters).result

    @dispatcher.span
    def lookup_detailed(self, query: str, *, filters: MetadataFilters | None = None) -> LookupDetails:
        """The result, the document-level ranking it came from (one candidate per source, best first: the selected
        attempt's, or the last attempt's when none was usable) and the comparison run beside it."""
        return self._lookup(query, filters)

    def _lookup(self, query: str, filters: MetadataFilters | None) -> LookupDetails:
        """The pipeline, under the span of the face that called it (``lookup`` or ``lookup_detailed``: one each)."""
        scope = self.scope_expr(filters)
        started = time.perf_counter()
        deadline = Deadline.after(self.settings.lookup_timeout_s)
        clock = StageClock()  # every part of the lookup is under one of its stages: they add up to elapsed_ms
        with clock("refresh"):
            self.refresh(deadline=deadline)
        with clock("beside"):
            job = self.beside.start(query) if self.beside else None  # runs beside from here; never changes the result

        l0, attempts = self.l0, self.attempts  # the L0 provider this lookup's hints come from, whatever a refresh does
        with clock("query_transform"):
            transform = transform_query(
                query, l0, self.settings.max_query_chars, read_short_names=self.settings.read_short_names
            )
            if self.l0_off_reason:
                transform.notes.append(f"L0 off: {self.l0_off_reason}")
            if self.doc_vectors is not None and self.doc_vectors.off_reason:
                transform.notes.append(f"document ranking off: {self.doc_vectors.off_reason}")
            for feature, reason in self.features_off.items():
                transform.notes.append(f"{feature} off: {reason}")
            if "category_filter" in self.features_off and transform.category_filter:
                transform.category_filter = None
                transform.filter_reason += " (not applied: the collection has no category field)"
        l1 = L1Outcome()
        if self.settings.l1_enabled:
            with clock("embed"):
                embedding = embed_query(self.query_embed_model, self._encoder_text(transform))
            bundle = LookupQuery(
                query_str=transform.normalized_query,
                embedding=embedding,
                transform=transform,
                category_filter=transform.category_filter,
                scope=scope,
            )
            l1 = attempts.run(bundle, embedding, deadline, clock, known_documents=len(l0.index.documents))
        selected = l1.selected
        with clock("pack"):
            pack = pack_context(
                selected.blocks if selected else [],
                self.settings.context_budget_tokens,
                self.settings.scoring.min_content_tokens,
            )
        with clock("assemble"):
            result = assemble_result(
                transform,
                l1,
                pack,
                scoring=self.settings.scoring,
                l1_enabled=self.settings.l1_enabled,
                stage_ms=clock.stage_ms,
            )
        with clock("beside"):
            beside_run = job.collect() if job else None
        result.elapsed_ms = round((time.perf_counter() - started) * 1000, 3)
        with clock("trace_write"):
            result.trace_recorded = self._record(query, result, beside_run)
        # The row cannot hold its own write time; the result can.
        result.stage_ms["trace_write"] = clock.stage_ms["trace_write"]
        ranked_from = selected or (l1.attempts[-1] if l1.attempts else None)
        ranking = [stage_of(n).candidate for n in ranked_from.nodes] if ranked_from else []
        return LookupDetails(result=result, ranking=ranking, beside=beside_run)

    def _encoder_text(self, transform: QueryTransform) -> str:
        """What the query encoder reads: the query without its alert-template placeholders
        (``drop_template_placeholders``; noted in the transform; see :mod:`kb_retrieval.retrieval.templates`)."""
        if not self.settings.drop_template_placeholders:
            return transform.normalized_query
        text, count = without_placeholders(transform.normalized_query)
        if count:
            transform.notes.append(
                f"query encoder: read without its {count} alert-template placeholder{'s' if count > 1 else ''}"
            )
        return text

    @dispatcher.span
    def _record(self, query: str, result: LookupResult, beside_run: BesideRun | None) -> bool:
        entry = beside_run.trace_entry() if beside_run is not None else disabled_entry()
        return self.traces.record(query, result, sidecar=entry)

    def lookup_ranked(self, query: str) -> tuple[LookupResult, list[Candidate]]:
        """``lookup_detailed`` as a pair: the result and its document-level ranking (what fixtures record)."""
        details = self.lookup_detailed(query)
        return details.result, details.ranking

    # --- LlamaIndex faces -------------------------------------------------------------------------------

    def as_retriever(
        self,
        *,
        similarity_top_k: int | None = None,
        filters: MetadataFilters | None = None,
        callback_manager: CallbackManager | None = None,
        **overrides: Any,
    ) -> KnowledgeRetriever:
        """The whole pipeline as a ``BaseRetriever``: nodes are the evidence, one per document, node id = source.

        ``similarity_top_k``: evidence documents returned at most (``max_evidence_blocks``); ``filters``: a
        ``MetadataFilters`` scope on every Milvus request; ``overrides``: other settings for this retriever only
        (e.g. ``top_k=50``). An unknown name, filter key or operator raises.
        """
        from kb_retrieval.retriever import KnowledgeRetriever

        if similarity_top_k is not None:
            overrides["max_evidence_blocks"] = similarity_top_k
        lookup = self.with_settings(**overrides) if overrides or callback_manager is not None else self
        if callback_manager is not None:  # the pipeline's rerankers report to it too (CBEventType.RERANKING)
            for postprocessor in lookup.postprocessors:
                postprocessor.callback_manager = callback_manager
        return KnowledgeRetriever(lookup, filters=filters, callback_manager=callback_manager)

    def as_query_engine(self, llm: Any = None, response_mode: Any = None, **kwargs: Any) -> BaseQueryEngine:
        """A query engine as ``BaseIndex.as_query_engine`` makes one.

        With ``llm``: ``RetrieverQueryEngine.from_args(self.as_retriever(...), llm=llm, response_mode=...)``, an
        answer synthesised over the evidence nodes; without, ``llama_index.core.Settings.llm`` when one is set.
        Without either: the agent's evidence text as the response
        (:class:`~kb_retrieval.query_engine.KnowledgeQueryEngine`). ``kwargs`` are the retriever's
        (``similarity_top_k``, ``filters``, settings) or ``RetrieverQueryEngine.from_args``'s; anything else raises.
        """
        from kb_retrieval.query_engine import configured_llm, split_engine_kwargs

        retriever_kwargs, synth_kwargs = split_engine_kwargs(kwargs)
        retriever = self.as_retriever(**retriever_kwargs)
        llm = llm if llm is not None else configured_llm()  # llama_index.core.Settings.llm, when one is set
        if llm is None:
            if response_mode is not None or synth_kwargs:
                given = ", ".join(sorted([*synth_kwargs, *(["response_mode"] if response_mode is not None else [])]))
                raise ValueError(
                    f"{given}: answer synthesis needs llm=...; without an LLM the response is the evidence"
                )
            return KnowledgeQueryEngine(lookup=retriever.lookup, filters=retriever.filters)
        from llama_index.core.query_engine import RetrieverQueryEngine

        if response_mode is not None:
            synth_kwargs["response_mode"] = response_mode
        return RetrieverQueryEngine.from_args(retriever, llm=llm, **synth_kwargs)

    def as_tool(self, **kwargs: Any) -> FunctionTool:
        """The ``lookup_knowledge`` FunctionTool over this pipeline; ``name``, ``description``, ``filters``: see
        :func:`~kb_retrieval.tool.make_lookup_tool` (several knowledge bases in one agent)."""
        from kb_retrieval.tool import make_lookup_tool

        return make_lookup_tool(self, **kwargs)

    def close(self) -> None:
        self.traces.close()
