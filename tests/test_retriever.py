"""The whole pipeline as a LlamaIndex retriever (kb_retrieval/retriever.py), used the way a LlamaIndex user would:
its nodes are the evidence, fusion, evaluation, async, instrumentation and events (one retrieval event pair per
retrieve, callback-manager events); its knobs as VectorIndexRetriever names them (``similarity_top_k``, ``filters``: a
MetadataFilters scope on every Milvus request of every attempt, unknown names refused) on Milvus Lite and the Milvus
server; node scores a similarity postprocessor can threshold."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from llama_index.core import Document
from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.span.simple import SimpleSpan
from llama_index.core.instrumentation.span_handlers.simple import SimpleSpanHandler
from llama_index.core.llms.mock import MockLLM
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import MetadataMode
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters
from pydantic import Field

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.retrieval.scope import ScopeFilterError
from kb_retrieval.retrieval.stage import STAGE_KEY, stage_of
from tests.conftest import REPO, SAMPLE_KB
from tests.support.kb import ALERT


def test_retriever_nodes_are_the_evidence_with_source_ids(sample_lookup):
    nodes = sample_lookup.as_retriever().retrieve(ALERT)
    result = sample_lookup.lookup(ALERT)
    assert [n.node.node_id for n in nodes] == [b.source for b in result.evidence_blocks]
    assert nodes[0].node.node_id == "redis/memory-usage-high.md"
    llm_text = nodes[0].node.get_content(metadata_mode=MetadataMode.LLM)
    assert "hit_reasons" not in llm_text and "l1_semantic" not in llm_text and "source:" in llm_text
    assert "hit_reasons" not in nodes[0].node.get_content(metadata_mode=MetadataMode.EMBED)


def test_retriever_overrides_change_only_that_retriever(sample_lookup):
    before = sample_lookup.settings.evidence.max_evidence_blocks
    one = sample_lookup.as_retriever(max_evidence_blocks=1).retrieve("how do I debug a slow postgres query")
    assert len(one) == 1 < before
    assert sample_lookup.settings.evidence.max_evidence_blocks == before
    with pytest.raises(ValueError):
        sample_lookup.as_retriever(max_evidence_blocks=0)


def test_retriever_query_engine_answers(sample_lookup):
    # max_tokens: a fixed-size answer (without it MockLLM echoes its prompt, which refine feeds back and grows)
    engine = RetrieverQueryEngine.from_args(retriever=sample_lookup.as_retriever(), llm=MockLLM(max_tokens=32))
    response = engine.query(ALERT)
    assert str(response).strip()
    assert response.source_nodes[0].node.node_id == "redis/memory-usage-high.md"


def test_fusion_over_the_pipeline_and_stock_bm25(sample_lookup, embed_model):
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.core.retrievers import QueryFusionRetriever
    from llama_index.retrievers.bm25 import BM25Retriever

    documents = [
        Document(text=p.read_text(encoding="utf-8"), id_=str(p.relative_to(SAMPLE_KB)))
        for p in sorted(SAMPLE_KB.rglob("*.md"))
    ]
    bm25 = BM25Retriever.from_defaults(nodes=SentenceSplitter().get_nodes_from_documents(documents), similarity_top_k=5)
    fusion = QueryFusionRetriever(
        [sample_lookup.as_retriever(), bm25], llm=MockLLM(), num_queries=1, mode="reciprocal_rerank", use_async=False
    )
    nodes = fusion.retrieve(ALERT)
    assert nodes and "redis/memory-usage-high.md" in [n.node.node_id for n in nodes[:3]]


def test_retriever_evaluator_hit_rate_matches_the_offline_evaluation(sample_lookup):
    from llama_index.core.evaluation import RetrieverEvaluator

    from kb_retrieval.evaluation.golden import load_golden

    cases = [c for c in load_golden(REPO / "golden" / "sample-kb.jsonl") if c.expected_docs and c.query.strip()]
    evaluator = RetrieverEvaluator.from_metric_names(["hit_rate"], retriever=sample_lookup.as_retriever())
    hits = 0
    expected_hits = 0
    for case in cases:
        evaluation = evaluator.evaluate(case.query, expected_ids=list(case.expected_docs) + list(case.acceptable_docs))
        hits += int(evaluation.metric_vals_dict["hit_rate"])
        result, _ = sample_lookup.lookup_ranked(case.query)
        relevant = set(case.expected_docs) | set(case.acceptable_docs)
        expected_hits += int(any(b.source in relevant for b in result.evidence_blocks))
    assert hits == expected_hits
    # ... and the same hit rate as `make eval` (the offline evaluation of the committed fixtures) at K = the
    # evidence blocks a lookup returns.
    from kb_retrieval.evaluation.runner import evaluate

    k = sample_lookup.settings.evidence.max_evidence_blocks
    report = evaluate(REPO / "golden" / "sample-kb.jsonl", REPO / "golden" / "fixtures" / "sample-kb", ks=(k,))
    assert report.overall.answerable == len(cases)
    assert hits / len(cases) == pytest.approx(report.overall.scores[f"recall@{k}"], abs=1e-4)


def test_aretrieve_never_stalls_the_loop(sample_lookup, monkeypatch):
    """Each lookup of ``aretrieve`` runs on a worker thread, never on the loop's: proven by holding every lookup until
    the loop itself releases them (a lookup on the loop's thread would hold the loop, which could then release
    nothing), not by timing the loop."""
    retriever = sample_lookup.as_retriever()
    queries = [ALERT, "etcd has no leader", "postgres replication lag", "disk full on /var", "JVM GC pressure"] * 2
    released = threading.Event()
    held_on: list[int] = []
    waited: list[bool] = []
    lookup_detailed = retriever.lookup.lookup_detailed

    def held(query: str, **kwargs: Any) -> Any:
        held_on.append(threading.get_ident())
        waited.append(released.wait(timeout=30))  # False: nobody released it (the loop was held)
        return lookup_detailed(query, **kwargs)

    monkeypatch.setattr(retriever.lookup, "lookup_detailed", held)

    async def run() -> tuple[int, list[list[Any]]]:
        calls = asyncio.gather(*(retriever.aretrieve(q) for q in queries[:8]))
        for _ in range(3000):  # the loop runs this while lookups are held
            if held_on:
                break
            await asyncio.sleep(0.01)
        released.set()
        return threading.get_ident(), await calls

    loop_thread, results = asyncio.run(run())
    assert held_on and loop_thread not in held_on and all(waited)
    assert len(results) == 8 and results[0][0].node.node_id == "redis/memory-usage-high.md"


def test_span_handler_sees_every_stage_under_one_root(sample_lookup):
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler

    events: list[str] = []

    class Events(BaseEventHandler):
        def handle(self, event: Any, **kwargs: Any) -> None:
            events.append(event.class_name())

    handler = SimpleSpanHandler()
    event_handler = Events()
    root_dispatcher = get_dispatcher()
    root_dispatcher.add_span_handler(handler)
    root_dispatcher.add_event_handler(event_handler)
    try:
        sample_lookup.lookup(ALERT)
    finally:
        root_dispatcher.span_handlers.remove(handler)
        root_dispatcher.event_handlers.remove(event_handler)
    for name in ("RetrievalStartEvent", "RetrievalEndEvent", "ReRankStartEvent", "ReRankEndEvent"):
        assert name in events, f"no {name}: {events}"
    spans: list[SimpleSpan] = handler.completed_spans
    roots = [s for s in spans if s.parent_id is None]
    assert len(roots) == 1 and roots[0].id_.startswith("KnowledgeLookup.lookup-")
    by_id = {s.id_: s for s in spans}

    def under_root(span: SimpleSpan) -> bool:
        while span.parent_id is not None:
            span = by_id[span.parent_id]
        return span is roots[0]

    names = {s.id_.split("-")[0] for s in spans}
    # BM25 in Milvus (the sample collection has full-text search): dense and BM25 are one hybrid search span.
    assert sample_lookup.lexical_mode == "milvus_bm25"
    for stage in (
        "transform_query",
        "AttemptRunner.attempt",
        "SdkPath.hybrid_search",
        "RuleReranker._postprocess_nodes",
        "SourceDeduplicator._postprocess_nodes",
        "DocumentRanker._postprocess_nodes",
        "build_evidence_blocks",
        "pack_context",
        "KnowledgeLookup._record",
    ):
        assert stage in names, f"no span for {stage}: {sorted(names)}"
    assert all(under_root(s) for s in spans)


def test_retrieval_end_event_nodes_carry_their_stage_data_as_json_for_a_listener(sample_lookup):
    """A lookup's nodes leave it only through RetrievalEndEvent: a handler reads their stage data as JSON (written
    then, since a handler listens), the same as the typed data the lookup ranked them by."""
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent

    from kb_retrieval.retrieval.events import listening

    ended: list[Any] = []

    class Ends(BaseEventHandler):
        def handle(self, event: Any, **kwargs: Any) -> None:
            if isinstance(event, RetrievalEndEvent):
                ended.append(event)

    handler = Ends()
    root_dispatcher = get_dispatcher()
    root_dispatcher.add_event_handler(handler)
    try:
        assert listening()
        details = sample_lookup.lookup_detailed(ALERT)
    finally:
        root_dispatcher.event_handlers.remove(handler)
    (event,) = ended
    assert [stage_of(n).candidate.source for n in event.nodes] == [c.source for c in details.ranking]
    for node in event.nodes:
        raw = dict(node.node.metadata[STAGE_KEY])  # plain JSON, as any handler would read it
        assert raw["candidate"]["source"] == stage_of(node).candidate.source
        assert raw["rerank"]["evidence_score"] == stage_of(node).rerank.evidence_score


# --- events -------------------------------------------------------------------------------------------------


class _Counting(BaseEventHandler):
    counts: dict[str, int] = Field(default_factory=dict)

    def handle(self, event: Any, **kwargs: Any) -> None:
        self.counts[event.class_name()] = self.counts.get(event.class_name(), 0) + 1


def _count(run: Any) -> dict[str, int]:
    handler = _Counting()
    root = get_dispatcher()
    root.add_event_handler(handler)
    try:
        run()
    finally:
        root.event_handlers.remove(handler)
    return handler.counts


def test_one_retrieval_event_pair_per_retrieve(sample_lookup):
    retriever = sample_lookup.as_retriever()
    for run in (
        lambda: retriever.retrieve(ALERT),
        lambda: asyncio.run(retriever.aretrieve(ALERT)),
        lambda: sample_lookup.lookup(ALERT),
        lambda: sample_lookup.lookup("a question the L0 index maps to mysql: replication lag on the replica"),
    ):
        counts = _count(run)
        assert (counts.get("RetrievalStartEvent"), counts.get("RetrievalEndEvent")) == (1, 1), counts


def test_callback_manager_sees_retrieve_and_reranking(sample_lookup):
    debug = LlamaDebugHandler()
    retriever = sample_lookup.as_retriever(callback_manager=CallbackManager([debug]))
    nodes = retriever.retrieve(ALERT)
    assert len(debug.get_event_pairs(CBEventType.RETRIEVE)) == 1
    reranking = debug.get_event_pairs(CBEventType.RERANKING)
    assert len(reranking) in (2, 4)  # RuleReranker and DocumentRanker, per attempt
    assert reranking[-1][1].payload and reranking[-1][1].payload["nodes"]
    assert nodes and nodes[0].node.node_id == "redis/memory-usage-high.md"
    assert sample_lookup.postprocessors[0].callback_manager.handlers == []  # only that retriever's parts report


# --- knobs as VectorIndexRetriever names them ---------------------------------------------------------------

MYSQL = MetadataFilters(filters=[MetadataFilter(key="category", value="mysql")])


def test_similarity_top_k_is_the_evidence_documents_returned(sample_lookup):
    before = sample_lookup.settings.evidence.max_evidence_blocks
    assert len(sample_lookup.as_retriever().retrieve(ALERT)) > 2
    nodes = sample_lookup.as_retriever(similarity_top_k=2).retrieve(ALERT)
    assert len(nodes) == 2 and nodes[0].node.node_id == "redis/memory-usage-high.md"
    assert sample_lookup.settings.evidence.max_evidence_blocks == before  # only that retriever


def test_unknown_overrides_are_refused_with_the_valid_names(sample_lookup):
    with pytest.raises(ValueError, match=r"unknown setting\(s\) top_kk; valid: .*max_evidence_blocks") as raised:
        sample_lookup.as_retriever(top_kk=3)
    assert "\n" not in str(raised.value)
    with pytest.raises(ValueError, match="unknown setting"):
        sample_lookup.with_settings(top_kk=3)


def test_a_filter_to_one_category_returns_only_it_on_every_attempt(sample_lookup):
    nodes = sample_lookup.as_retriever(filters=MYSQL).retrieve(ALERT)  # a Redis alert scoped to mysql
    assert nodes and {n.node.metadata["category"] for n in nodes} == {"mysql"}
    result = sample_lookup.lookup(ALERT, filters=MYSQL)
    assert {b.category for b in result.evidence_blocks} <= {"mysql"}
    attempts = result.retrieval_trace.attempts
    # The L0 hint (redis) is AND-ed with the scope in the filtered attempt; the unfiltered retry keeps the scope.
    assert len(attempts) == 2 and attempts[0].category_filter == "redis"
    assert attempts[0].filter_expr == '(category == "mysql") and category == "redis"'
    assert attempts[1].filter_expr == '(category == "mysql")'
    # Without the scope the same alert finds the redis runbook (the scope is what changed it).
    assert sample_lookup.lookup(ALERT).evidence_blocks[0].source == "redis/memory-usage-high.md"


def test_a_scope_that_holds_no_document_is_an_empty_answer_not_an_outage(sample_lookup):
    """The unfiltered search of a known collection that answers nothing is an outage (issue 23), unless a caller's
    scope narrowed it: a team with no documents gets no evidence, and the knowledge base is not called down."""
    nobody = MetadataFilters(filters=[MetadataFilter(key="category", value="no-such-team")])
    result = sample_lookup.lookup(ALERT, filters=nobody)
    assert not result.found
    assert result.evidence_status == "no_evidence"
    assert [a.outcome for a in result.retrieval_trace.attempts] == ["no_candidates", "no_candidates"]


def test_exact_identifier_and_bm25_hits_stay_inside_the_scope(sample_lookup):
    # 'RedisMemoryHigh' is a rare identifier (an exact-identifier candidate) and a strong BM25 term of redis pages.
    scope = MetadataFilters(filters=[MetadataFilter(key="category", value=["linux", "mysql"], operator="in")])
    details = sample_lookup.lookup_detailed("RedisMemoryHigh", filters=scope)
    assert details.ranking and {c.category for c in details.ranking} <= {"linux", "mysql"}


def test_or_and_metadata_keys(sample_lookup):
    either = MetadataFilters(
        filters=[MetadataFilter(key="category", value="mysql"), MetadataFilter(key="severity", value="critical")],
        condition=FilterCondition.OR,
    )
    sources = {c.source for c in sample_lookup.lookup_detailed("node not ready kubelet", filters=either).ranking}
    assert "kubernetes/node-not-ready.md" in sources  # the one page with severity: critical
    assert {s.split("/")[0] for s in sources} <= {"mysql", "kubernetes"}
    assert {s for s in sources if s.startswith("kubernetes/")} == {"kubernetes/node-not-ready.md"}
    not_mysql = MetadataFilters(filters=[MetadataFilter(key="category", value=["mysql"], operator=FilterOperator.NIN)])
    assert "mysql" not in {
        c.category for c in sample_lookup.lookup_detailed("mysql replication lag", filters=not_mysql).ranking
    }
    critical = MetadataFilters(
        filters=[MetadataFilter(key="severity", value=["critical"], operator=FilterOperator.IN)]
    )  # `in` on a JSON metadata key (Milvus Lite refuses the plain form)
    assert {c.source for c in sample_lookup.lookup_detailed("node not ready", filters=critical).ranking} == {
        "kubernetes/node-not-ready.md"
    }
    later = MetadataFilters(filters=[MetadataFilter(key="position", value=1, operator=FilterOperator.GTE)])
    assert sample_lookup.lookup_detailed(ALERT, filters=later).ranking  # a numeric comparison on a JSON key runs


def test_a_bad_operator_or_unknown_key_is_an_error_at_construction(sample_lookup):
    bad = MetadataFilters(filters=[MetadataFilter(key="category", value="redis", operator=FilterOperator.TEXT_MATCH)])
    with pytest.raises(ScopeFilterError, match="operator 'text_match' is not supported"):
        sample_lookup.as_retriever(filters=bad)
    with pytest.raises(ScopeFilterError, match="filter key 'tenant' is not a field of the collection"):
        sample_lookup.lookup(ALERT, filters=MetadataFilters(filters=[MetadataFilter(key="tenant", value="acme")]))


@pytest.mark.server
def test_a_filter_to_one_category_on_the_milvus_server(milvus_server, tmp_path, embed_model):
    settings = KBSettings(
        state_dir=tmp_path, milvus_uri=milvus_server.uri, collection="kb_scope_test", vector_store_mode="sdk"
    )
    ingest([SAMPLE_KB / "redis", SAMPLE_KB / "mysql"], settings, embed_model=embed_model)
    for mode in ("sdk", "vectorstore"):
        lookup = KnowledgeLookup(settings.model_copy(update={"vector_store_mode": mode}), embed_model=embed_model)
        try:
            assert lookup.lexical_mode == "in_process_bm25"  # Milvus 2.3: BM25 and exact hits in process
            nodes = lookup.as_retriever(filters=MYSQL).retrieve(ALERT)
            assert nodes and {n.node.metadata["category"] for n in nodes} == {"mysql"}, mode
            details = lookup.lookup_detailed("RedisMemoryHigh maxmemory", filters=MYSQL)
            assert details.ranking and {c.category for c in details.ranking} == {"mysql"}, mode
            assert lookup.lookup(ALERT).evidence_blocks[0].source == "memory-usage-high.md"
        finally:
            lookup.close()


# --- node scores --------------------------------------------------------------------------------------------


def test_node_scores_are_similarities_a_similarity_postprocessor_thresholds(sample_lookup) -> None:
    nodes = sample_lookup.as_retriever(similarity_top_k=5).retrieve("Too many connections, max clients reached")
    assert len(nodes) >= 2
    assert all(0.0 <= (n.score or 0.0) <= 1.0 for n in nodes)
    # The order is the pipeline's (its rerank score, in metadata); the score is the best chunk's similarity.
    reranked = [n.node.metadata["score"] for n in nodes]
    assert reranked == sorted(reranked, reverse=True) and any(r > 1.0 for r in reranked)
    assert [n.score for n in nodes] == [n.node.metadata["similarity"] for n in nodes]
    cutoff = sorted(n.score or 0.0 for n in nodes)[len(nodes) // 2]
    kept = SimilarityPostprocessor(similarity_cutoff=cutoff).postprocess_nodes(list(nodes))
    assert [n.node.node_id for n in kept] == [n.node.node_id for n in nodes if (n.score or 0.0) >= cutoff]
    assert 0 < len(kept) < len(nodes)
