"""The ``lookup_knowledge`` pipeline: the stages in order, and its LlamaIndex faces.

Size: over 400 lines since the per-request deadline and the ranking hooks landed; state loading is already in
``state.py``, and the LlamaIndex faces are the next to move out.

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
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.instrumentation import get_dispatcher
from pymilvus import MilvusClient

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.indexing.ingest_record import read_ingest_record
from kb_retrieval.indexing.lite_files import private_at_exit, private_tree, private_umask
from kb_retrieval.indexing.milvus import connect, ensure_collection, features_off, without_missing_fields
from kb_retrieval.indexing.model_check import check_query_model
from kb_retrieval.indexing.onnx_query import query_encoder
from kb_retrieval.indexing.rank_teach import teach_ranking
from kb_retrieval.models import Candidate, LookupResult, QueryTransform
from kb_retrieval.on_thread import OnThread
from kb_retrieval.overrides import check_overrides
from kb_retrieval.pipeline import Pipeline, Resources
from kb_retrieval.result import agent_text, assemble_result, evidence_nodes
from kb_retrieval.retrieval.attempts import L1Outcome
from kb_retrieval.retrieval.context_pack import pack_context
from kb_retrieval.retrieval.deadline import Deadline
from kb_retrieval.retrieval.events import span
from kb_retrieval.retrieval.expand import SectionStore
from kb_retrieval.retrieval.hybrid import LookupQuery, choose_lexical_mode
from kb_retrieval.retrieval.l1 import VectorPath, make_path
from kb_retrieval.retrieval.l1.memory import choose_plan
from kb_retrieval.retrieval.query_transform import transform_query
from kb_retrieval.retrieval.scope import Scope, scope_of
from kb_retrieval.retrieval.stage import stage_of
from kb_retrieval.retrieval.templates import without_placeholders
from kb_retrieval.retrieval.timing import StageClock
from kb_retrieval.sidecar_protocol import SidecarRunnerProtocol, SidecarRunProtocol, disabled_entry, load_runner
from kb_retrieval.state import RetrievalState, StateHolder, StateLoader
from kb_retrieval.traces import TraceStore

if TYPE_CHECKING:
    from llama_index.core.base.base_query_engine import BaseQueryEngine
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.tools import FunctionTool
    from llama_index.core.vector_stores.types import MetadataFilters

    from kb_retrieval.retriever import KnowledgeRetriever

log = logging.getLogger(__name__)
dispatcher = get_dispatcher(__name__)

__all__ = ["KnowledgeLookup", "LookupDetails", "agent_text", "evidence_nodes"]


def __getattr__(name: str) -> Any:
    # KnowledgeQueryEngine lives in kb_retrieval.query_engine, loaded on first use: llama_index.core.query_engine's
    # package pulls in its evaluators and indices (~1.3 s of imports a lookup never uses).
    if name == "KnowledgeQueryEngine":
        from kb_retrieval.query_engine import KnowledgeQueryEngine

        return KnowledgeQueryEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class LookupDetails:
    """A lookup's result, the document-level ranking it came from, and the sidecar's run beside it (if any)."""

    result: LookupResult
    ranking: list[Candidate] = field(default_factory=list)
    sidecar: SidecarRunProtocol | None = None


class KnowledgeLookup:
    """The ``lookup_knowledge`` pipeline. Build once (loads the model, connects Milvus); call ``lookup`` often.

    Thread-safe: ``lookup`` keeps no per-call state on the object. It reads the current
    :class:`~kb_retrieval.pipeline.Pipeline` once (built from the settings and the current
    :class:`~kb_retrieval.state.RetrievalState`) and uses it to its end, whatever a reload meanwhile publishes.
    """

    def __init__(
        self,
        settings: KBSettings | None = None,
        *,
        embed_model: BaseEmbedding | None = None,
        client: MilvusClient | None = None,
        path: VectorPath | None = None,
        trace_store: TraceStore | None = None,
        sidecar: SidecarRunnerProtocol | None = None,
    ) -> None:
        settings = settings or KBSettings()
        # What this opens and writes in the state dir (Milvus Lite's files, written as late as the first load; the
        # trace database; the snapshot) is the owner's only, for a library or notebook caller as for the CLI.
        with private_umask():
            self._open(settings, embed_model, client, path, trace_store, sidecar)
        if not settings.is_milvus_server():
            private_tree(Path(settings.resolved_milvus_uri()))
            private_at_exit()  # Lite writes again when it closes the dir

    def _open(
        self,
        settings: KBSettings,
        embed_model: BaseEmbedding | None,
        client: MilvusClient | None,
        path: VectorPath | None,
        trace_store: TraceStore | None,
        sidecar: SidecarRunnerProtocol | None,
    ) -> None:
        # Queries go through the ONNX export of the bundled model when configured (a few ms instead of ~20 ms of
        # torch); a user's own model is used as it is. Nothing here loads torch unless it is the encoder. It loads
        # on a thread of its own while Milvus opens: onnxruntime builds its session mostly without the GIL (a cold
        # CLI lookup's start, issue 39); it reads only the embedding settings, which the collection never changes.
        # A failure opening Milvus is told at once, not after the load (which ends on its own thread).
        loading = OnThread(query_encoder, settings, embed_model, name="kb-query-encoder")
        self.client = client or connect(settings)
        ensure_collection(self.client, settings, create=False)
        # Features the collection cannot serve (one written by stock MilvusVectorStore) are off, not errors.
        self.features_off = features_off(self.client, settings)
        self.settings = without_missing_fields(self.client, settings)
        self.query_embed_model = loading.result()
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
        plan, plan_reason = choose_plan(self.client, self.settings, custom_path=custom_path)
        # BM25 in Milvus (one hybrid call per attempt) where the collection and the path can, else in process.
        self.lexical_mode, lexical_reason = choose_lexical_mode(self.client, self.settings, self.path)
        if lexical_reason:
            self.features_off["milvus_bm25"] = lexical_reason
        self.sections = SectionStore(self.client, self.settings)
        self._resources = Resources(
            path=self.path,
            query_embed_model=self.query_embed_model,
            sections=self.sections,
            ingest_record=self.ingest_record,
            lexical_mode=self.lexical_mode,
        )
        # One holder of the retrieval state for this object and every settings variant of it (``with_settings``).
        loader = StateLoader(
            self.client, self.settings, plan, plan_reason, self.lexical_mode, encoder=self.query_embed_model
        )
        self._holder = StateHolder(loader, self.settings.retrieval.freshness_check_s)
        self._callback_manager: CallbackManager | None = None
        self._pipeline_lock = threading.Lock()
        self._pipeline = self._build_pipeline(self._holder.current)
        self.traces = trace_store or TraceStore.from_settings(self.settings)
        # The comparison runner (the sidecar) is known only through the protocol in kb_retrieval.sidecar_protocol.
        self.sidecar = sidecar
        if path is None:  # a search path of the caller's own (a fake, a proxy) is not the knowledge base to learn
            self._teaching = threading.Lock()
            self._stop_teaching = threading.Event()  # set by close: a version being taught beside stops there
            self._teacher: threading.Thread | None = None
            self._teach_ranking(self._holder.current)
            self._holder.on_reload = self._teach_beside
        if self.sidecar is None and self.settings.sidecar.enabled:
            self.sidecar = load_runner(self.settings.sidecar.factory, self.settings, self.embed_model)

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

    # --- state and pipeline ---------------------------------------------------------------------------

    def _teach_ranking(self, state: RetrievalState) -> None:
        """An index version opened for the first time teaches the document ranking its mixture (stored by version;
        kb_retrieval.indexing.rank_teach), and ``state`` is published again with it, unless a reload replaced it
        meanwhile (that version is taught in turn)."""
        with self._teaching:
            if state.rank_fit is not None or self._holder.current is not state:
                return
            if (fit := teach_ranking(self, self._stop_teaching)) is not None and self._holder.current is state:
                self._holder.publish(dataclasses.replace(state, rank_fit=fit))

    def _teach_beside(self, state: RetrievalState) -> None:
        """A version a reload published without a stored fit is taught on a thread of its own: lookups go on (with
        the configured weights) meanwhile and rank with the fit once it is published."""
        if state.rank_fit is None and not self._stop_teaching.is_set():
            self._teacher = threading.Thread(
                target=self._teach_ranking, args=(state,), name="kb-rank-teach", daemon=True
            )
            self._teacher.start()

    def _build_pipeline(self, state: RetrievalState) -> Pipeline:
        return Pipeline.build(self.settings, state, self._resources, callback_manager=self._callback_manager)

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline of these settings over the current retrieval state (built anew once per index version)."""
        pipeline, state = self._pipeline, self._holder.current
        if pipeline.state is state:
            return pipeline
        with self._pipeline_lock:
            if self._pipeline.state is not state:
                self._pipeline = self._build_pipeline(state)
            return self._pipeline

    @property
    def state(self) -> RetrievalState:
        """The current retrieval state (one index version)."""
        return self._holder.current

    @property
    def state_holder(self) -> StateHolder:
        """Where the current state is kept and replaced: shared by every settings variant of this object."""
        return self._holder

    # The current state's and pipeline's parts, read-only (``stats``, the bench, tests).
    index_version = property(lambda self: self.state.index_version)
    l0 = property(lambda self: self.state.l0)
    l0_off_reason = property(lambda self: self.state.l0_off_reason)
    lexical = property(lambda self: self.state.lexical)
    exact = property(lambda self: self.state.exact)
    named_terms = property(lambda self: self.state.named_terms)
    doc_vectors = property(lambda self: self.state.doc_vectors)
    rank_fit = property(lambda self: self.state.rank_fit)
    memory = property(lambda self: self.state.memory)
    plan = property(lambda self: self.state.plan)
    plan_reason = property(lambda self: self.state.plan_reason)
    state_source = property(lambda self: self.state.source)
    state_read_s = property(lambda self: self.state.read_s)
    dense = property(lambda self: self.pipeline.dense)
    hybrid = property(lambda self: self.pipeline.hybrid)
    postprocessors = property(lambda self: list(self.pipeline.postprocessors))
    attempts = property(lambda self: self.pipeline.attempts)

    def refresh(self, *, force: bool = False, deadline: Deadline | None = None) -> bool:
        """Reload the L0 index and BM25 when another process's ingest changed the index version (checked at most
        every ``freshness_check_s``, off the request path: a lookup waits for the check at most half of what is left
        of its ``deadline``, see :mod:`kb_retrieval.freshness`); True when reloaded. Never raises: when Milvus cannot
        be read, the lookup goes on with the state it has (its search then reports the outage) and the next check
        tries again. ``force``: check now and wait for it. One check serves every settings variant of this object."""
        return self._holder.refresh(force=force, deadline=deadline)

    def with_settings(self, **overrides: Any) -> KnowledgeLookup:
        """The same pipeline (model, client, retrieval state, trace store shared) with some settings changed.

        Example:
            >>> wide = lookup.with_settings(top_k=50, max_evidence_blocks=10)  # doctest: +SKIP
        """
        check_overrides(overrides, self.settings)  # what needs another client, collection or model is refused
        settings = self.settings.updated(**overrides)  # flat or grouped names, validated like any setting
        return self._variant(settings, self._callback_manager)

    def _variant(self, settings: KBSettings, callback_manager: CallbackManager | None) -> KnowledgeLookup:
        """A copy with other settings (and postprocessors reporting to ``callback_manager``), sharing the state
        holder: its pipeline is its own, built over whatever state the holder has."""
        clone = copy.copy(self)
        clone.settings, clone._callback_manager = settings, callback_manager
        clone._pipeline_lock = threading.Lock()
        clone._pipeline = clone._build_pipeline(self._holder.current)
        return clone

    # --- the pipeline ---------------------------------------------------------------------------------

    def scope_expr(self, filters: MetadataFilters | None) -> str | None:
        """``filters`` as the Milvus expression every request of a lookup carries (:mod:`.retrieval.scope`); raises
        ``ScopeFilterError`` for an operator it cannot translate or a key the collection does not have."""
        scope = self.scope_of(filters)
        return scope.expr if scope is not None else None

    def scope_of(self, filters: MetadataFilters | None) -> Scope | None:
        """``filters`` as a lookup's :class:`~kb_retrieval.retrieval.scope.Scope` (its expression, and the field
        tests the memory plan's mirror evaluates when it can); raises as :meth:`scope_expr`."""
        s = self.settings
        scalar = {
            name: f
            for name, f in (("category", s.schema_fields.category_field), ("source", s.schema_fields.source_field))
            if f
        }
        scalar |= {
            f: f for f in (s.schema_fields.id_field, s.schema_fields.category_field, s.schema_fields.source_field) if f
        }
        return scope_of(
            filters,
            scalar=scalar,
            json_field=s.schema_fields.metadata_field,
            json_keys=set(self.ingest_record.metadata_keys),
        )

    @span(dispatcher)
    def lookup(
        self, query: str, *, filters: MetadataFilters | None = None, deadline: Deadline | None = None
    ) -> LookupResult:
        """Run one lookup and record it. Raises ``EmptyQueryError`` for an empty query; never for retrieval.

        ``filters``: a LlamaIndex ``MetadataFilters`` scope (e.g. a team or tenant key) on every Milvus request.
        ``deadline``: when the lookup must be done (default ``lookup_timeout_s`` from now); a server passes the
        request's, so the time it waited for a worker counts in it."""
        return self._lookup(query, filters, deadline).result

    @span(dispatcher)
    def lookup_detailed(self, query: str, *, filters: MetadataFilters | None = None) -> LookupDetails:
        """The result, the document-level ranking it came from (one candidate per source, best first: the selected
        attempt's, or the last attempt's when none was usable) and the comparison run beside it."""
        return self._lookup(query, filters)

    def _lookup(self, query: str, filters: MetadataFilters | None, deadline: Deadline | None = None) -> LookupDetails:
        """The pipeline, under the span of the face that called it (``lookup`` or ``lookup_detailed``: one each)."""
        scope = self.scope_of(filters)
        started = time.perf_counter()
        deadline = deadline or Deadline.after(self.settings.retrieval.lookup_timeout_s)
        clock = StageClock()  # every part of the lookup is under one of its stages: they add up to elapsed_ms
        with clock("refresh"):
            self.refresh(deadline=deadline)
        with clock("sidecar"):
            job = self.sidecar.start(query) if self.sidecar else None  # runs beside from here; never changes the result

        pipeline = self.pipeline  # this lookup's stages and state to its end, whatever a refresh publishes
        state = pipeline.state
        with clock("query_transform"):
            transform = transform_query(
                query,
                state.l0,
                self.settings.retrieval.max_query_chars,
                read_short_names=self.settings.retrieval.read_short_names,
            )
            if state.l0_off_reason:
                transform.notes.append(f"L0 off: {state.l0_off_reason}")
            if state.doc_vectors is not None and state.doc_vectors.off_reason:
                transform.notes.append(f"document ranking off: {state.doc_vectors.off_reason}")
            for feature, reason in self.features_off.items():
                transform.notes.append(f"{feature} off: {reason}")
            if "category_filter" in self.features_off and transform.category_filter:
                transform.category_filter = None
                transform.filter_reason += " (not applied: the collection has no category field)"
        l1 = L1Outcome()
        if self.settings.retrieval.l1_enabled:
            with clock("embed"):
                embedding = embed_query(self.query_embed_model, self._encoder_text(transform))
            bundle = LookupQuery(
                query_str=transform.normalized_query,
                embedding=embedding,
                transform=transform,
                category_filter=transform.category_filter,
                scope=scope,
            )
            l1 = pipeline.attempts.run(bundle, embedding, deadline, clock, known_documents=state.known_documents)
        selected = l1.selected
        with clock("pack"):
            pack = pack_context(
                selected.blocks if selected else [],
                self.settings.evidence.context_budget_tokens,
                self.settings.scoring.min_content_tokens,
            )
        with clock("assemble"):
            result = assemble_result(
                transform,
                l1,
                pack,
                scoring=self.settings.scoring,
                l1_enabled=self.settings.retrieval.l1_enabled,
                stage_ms=clock.stage_ms,
            )
        with clock("sidecar"):
            sidecar_run = job.collect() if job else None
        # The result took a copy of the clocks while it was assembled: the stages timed since (assemble, the
        # sidecar's collect) are added, so they add up to elapsed_ms.
        result.stage_ms.update(clock.stage_ms)
        result.elapsed_ms = round((time.perf_counter() - started) * 1000, 3)
        with clock("trace_write"):
            result.trace_recorded = self._record(query, result, sidecar_run)
        # The row cannot hold its own write time; the result can.
        result.stage_ms["trace_write"] = clock.stage_ms["trace_write"]
        ranked_from = selected or (l1.attempts[-1] if l1.attempts else None)
        ranking = [stage_of(n).candidate for n in ranked_from.nodes] if ranked_from else []
        return LookupDetails(result=result, ranking=ranking, sidecar=sidecar_run)

    def _encoder_text(self, transform: QueryTransform) -> str:
        """What the query encoder reads: the query without its alert-template placeholders
        (``drop_template_placeholders``; noted in the transform; see :mod:`kb_retrieval.retrieval.templates`)."""
        if not self.settings.retrieval.drop_template_placeholders:
            return transform.normalized_query
        text, count = without_placeholders(transform.normalized_query)
        if count:
            transform.notes.append(
                f"query encoder: read without its {count} alert-template placeholder{'s' if count > 1 else ''}"
            )
        return text

    @span(dispatcher)
    def _record(self, query: str, result: LookupResult, sidecar_run: SidecarRunProtocol | None) -> bool:
        entry = sidecar_run.trace_entry() if sidecar_run is not None else disabled_entry()
        return self.traces.record(query, result, sidecar=entry, scoring_profile=self.settings.scoring.version)

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
        lookup = self.with_settings(**overrides) if overrides else self
        if callback_manager is not None:  # the pipeline's rerankers report to it too (CBEventType.RERANKING)
            lookup = lookup._variant(lookup.settings, callback_manager)
        return KnowledgeRetriever(lookup, filters=filters, callback_manager=callback_manager)

    def as_query_engine(self, llm: Any = None, response_mode: Any = None, **kwargs: Any) -> BaseQueryEngine:
        """A query engine as ``BaseIndex.as_query_engine`` makes one.

        With ``llm``: ``RetrieverQueryEngine.from_args(self.as_retriever(...), llm=llm, response_mode=...)``, an
        answer synthesised over the evidence nodes; without, ``llama_index.core.Settings.llm`` when one is set.
        Without either: the agent's evidence text as the response
        (:class:`~kb_retrieval.query_engine.KnowledgeQueryEngine`). ``kwargs`` are the retriever's
        (``similarity_top_k``, ``filters``, settings) or ``RetrieverQueryEngine.from_args``'s; anything else raises.
        """
        from kb_retrieval.query_engine import KnowledgeQueryEngine, configured_llm, split_engine_kwargs

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
        if (teacher := getattr(self, "_teacher", None)) is not None:  # no teaching outlives the lookup object
            self._stop_teaching.set()
            teacher.join(timeout=self.settings.retrieval.lookup_timeout_s)
        self.traces.close()
