"""The pipeline as LlamaIndex parts: a retriever, postprocessors on stock nodes, fusion, evaluation, async,
instrumentation and the tool's structured output, each used the way a LlamaIndex user would."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.span.simple import SimpleSpan
from llama_index.core.instrumentation.span_handlers.simple import SimpleSpanHandler
from llama_index.core.llms.mock import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import MetadataMode, QueryBundle

from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.models import LookupResult
from kb_retrieval.retrieval.dedupe import SourceDeduplicator
from kb_retrieval.retrieval.doc_rank import DocumentRanker
from kb_retrieval.retrieval.rerank import RuleReranker
from kb_retrieval.retrieval.stage import STAGE_KEY, stage_of
from tests.conftest import SAMPLE_KB

TOOL = "lookup_knowledge"
ALERT = "RedisMemoryHigh: Redis memory usage above 90% of maxmemory on redis-cache-01:6379"


def test_retriever_nodes_are_the_evidence_with_source_ids(sample_lookup):
    nodes = sample_lookup.as_retriever().retrieve(ALERT)
    result = sample_lookup.lookup(ALERT)
    assert [n.node.node_id for n in nodes] == [b.source for b in result.evidence_blocks]
    assert nodes[0].node.node_id == "redis/memory-usage-high.md"
    llm_text = nodes[0].node.get_content(metadata_mode=MetadataMode.LLM)
    assert "hit_reasons" not in llm_text and "l1_semantic" not in llm_text and "source:" in llm_text
    assert "hit_reasons" not in nodes[0].node.get_content(metadata_mode=MetadataMode.EMBED)


def test_retriever_overrides_change_only_that_retriever(sample_lookup):
    one = sample_lookup.as_retriever(max_evidence_blocks=1).retrieve("how do I debug a slow postgres query")
    assert len(one) == 1
    assert sample_lookup.settings.evidence.max_evidence_blocks == 5
    with pytest.raises(ValueError):
        sample_lookup.as_retriever(max_evidence_blocks=0)


def test_retriever_query_engine_answers(sample_lookup):
    # max_tokens: a fixed-size answer (without it MockLLM echoes its prompt, which refine feeds back and grows)
    engine = RetrieverQueryEngine.from_args(retriever=sample_lookup.as_retriever(), llm=MockLLM(max_tokens=32))
    response = engine.query(ALERT)
    assert str(response).strip()
    assert response.source_nodes[0].node.node_id == "redis/memory-usage-high.md"


def _stock_nodes(embed_model: Any, query: str) -> list[Any]:
    """A stock VectorStoreIndex over the sample KB files (one Document per file, stock metadata only)."""
    documents = [
        Document(text=path.read_text(encoding="utf-8"), metadata={"file_path": str(path.relative_to(SAMPLE_KB))})
        for path in sorted(SAMPLE_KB.rglob("*.md"))
    ]
    index = VectorStoreIndex.from_documents(documents, embed_model=embed_model)
    return index.as_retriever(similarity_top_k=8).retrieve(query)


def test_postprocessors_run_on_stock_nodes_and_apply_hints(sample_lookup, embed_model):
    query = "SystemdUnitFailed too many open files"  # an alert name (an L0 keyword) beside another topic's words
    nodes = _stock_nodes(embed_model, query)
    assert nodes and all(STAGE_KEY not in n.node.metadata for n in nodes)
    sources = [n.node.metadata["file_path"] for n in nodes]
    reranker = RuleReranker(l0=sample_lookup.l0)  # configuration only: the query arrives with the call
    ranked = reranker.postprocess_nodes([n.model_copy(deep=True) for n in nodes], query_str=query)
    ranked_sources = [stage_of(n).candidate.source for n in ranked]
    hinted = "linux/systemd-service-failing.md"
    assert ranked_sources.index(hinted) < sources.index(hinted)  # the hint moved its document up
    stage = stage_of(ranked[ranked_sources.index(hinted)])
    assert stage.candidate.path == "external" and stage.candidate.title  # title known from the L0 index
    assert "l0_keyword:SystemdUnitFailed" in [str(r) for r in stage.rerank.hit_reasons]  # type: ignore[union-attr]
    deduped = SourceDeduplicator(focus_weight=0.45).postprocess_nodes(ranked, query_str=query)
    assert len({stage_of(n).candidate.source for n in deduped}) == len(deduped)
    # Documents ranked as wholes by the lookup's document vectors (sources are the same relative paths).
    bundle = QueryBundle(query, embedding=embed_query(embed_model, query))
    by_document = DocumentRanker(vectors=sample_lookup.doc_vectors).postprocess_nodes(deduped, query_bundle=bundle)
    assert sorted(stage_of(n).candidate.source for n in by_document) == sorted(
        stage_of(n).candidate.source for n in deduped
    )
    for node in by_document:
        record = stage_of(node).rerank
        assert record is not None and node.score == pytest.approx(sum(record.ranking.values()), abs=1e-5)
        assert {"doc_title", "doc_summary", "doc_text"} <= set(record.ranking)
    assert [n.score for n in by_document] == sorted((n.score for n in by_document), reverse=True)
    # Stage data never reaches the LLM's text, and a stock node's own metadata passes through unchanged.
    assert STAGE_KEY not in ranked[0].node.get_content(metadata_mode=MetadataMode.LLM)
    assert all(n.node.metadata["file_path"] for n in ranked)
    # Without an L0 provider and without lookup context there are no hints: the stock order stands.
    plain = RuleReranker().postprocess_nodes([n.model_copy(deep=True) for n in nodes], query_str=query)
    assert [n.node.metadata["file_path"] for n in plain] == sources


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
    from tests.conftest import REPO

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

    report = evaluate(REPO / "golden" / "sample-kb.jsonl", REPO / "golden" / "fixtures" / "sample-kb")
    k = sample_lookup.settings.evidence.max_evidence_blocks
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


def test_function_agent_receives_the_lookup_result(sample_lookup):
    from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
    from llama_index.core.llms import ChatMessage
    from llama_index.core.llms.llm import ToolSelection
    from llama_index.core.llms.mock import MockFunctionCallingLLM

    calls = {"n": 0}

    def respond(messages: Any, **kwargs: Any) -> ChatMessage:
        calls["n"] += 1
        if calls["n"] == 1:
            return ChatMessage(
                role="assistant",
                content="",
                additional_kwargs={
                    "tool_calls": [
                        ToolSelection(tool_id="1", tool_name="lookup_knowledge", tool_kwargs={"query": ALERT})
                    ]
                },
            )
        return ChatMessage(role="assistant", content="See redis/memory-usage-high.md")

    llm = MockFunctionCallingLLM(response_generator=respond)
    agent = FunctionAgent(tools=[sample_lookup.as_tool()], llm=llm)

    async def run() -> list[ToolCallResult]:
        handler = agent.run(user_msg="Redis is alerting")
        results = [e async for e in handler.stream_events() if isinstance(e, ToolCallResult)]
        await handler
        return results

    results = asyncio.run(run())
    assert len(results) == 1
    raw = results[0].tool_output.raw_output
    assert isinstance(raw, LookupResult) and raw.evidence_blocks[0].source == "redis/memory-usage-high.md"
    assert "source: redis/memory-usage-high.md" in results[0].tool_output.content


def test_tool_query_parameter_is_described(sample_lookup):
    schema = sample_lookup.as_tool().metadata.get_parameters_dict()
    assert "alert" in schema["properties"]["query"]["description"]
