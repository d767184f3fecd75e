"""The edges a LlamaIndex user touches first (issue 24): as_query_engine like BaseIndex's, postprocessors that never
go quiet (stock sync and async pipelines, SimpleDirectoryReader nodes, config-only serialisation), one retrieval event
pair per retrieve with callback-manager events, and the public names."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest
from llama_index.core import SimpleDirectoryReader, VectorStoreIndex
from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.llms.mock import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.response_synthesizers import TreeSummarize
from llama_index.core.schema import QueryBundle
from pydantic import Field

from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.query_engine import KnowledgeQueryEngine
from kb_retrieval.result import agent_text
from kb_retrieval.retrieval.doc_rank import DocumentRanker
from kb_retrieval.retrieval.rerank import RuleReranker
from kb_retrieval.retrieval.stage import HitKind, stage_of
from tests.conftest import REPO, SAMPLE_KB

ALERT = "RedisMemoryHigh: Redis memory usage above 90% of maxmemory on redis-cache-01:6379"


# --- as_query_engine ----------------------------------------------------------------------------------------


def test_query_engine_with_an_llm_answers_through_it(sample_lookup):
    engine = sample_lookup.as_query_engine(
        llm=MockLLM(max_tokens=8), response_mode="tree_summarize", similarity_top_k=2
    )
    assert isinstance(engine, RetrieverQueryEngine)
    assert isinstance(engine._response_synthesizer, TreeSummarize)  # response_mode kept
    response = engine.query(ALERT)
    assert str(response).split() == ["text"] * 8  # MockLLM's answer, not the evidence text
    assert [n.node.node_id for n in response.source_nodes][:1] == ["redis/memory-usage-high.md"]
    assert len(response.source_nodes) == 2  # similarity_top_k kept


def test_query_engine_without_an_llm_is_the_evidence_and_refuses_what_it_cannot_honour(sample_lookup):
    engine = sample_lookup.as_query_engine(similarity_top_k=1)
    assert isinstance(engine, KnowledgeQueryEngine)
    response = engine.query(ALERT)
    assert str(response) == agent_text(engine.lookup.lookup(ALERT))  # the evidence text, as lookup_knowledge's
    assert [n.node.node_id for n in response.source_nodes] == ["redis/memory-usage-high.md"]
    assert json.loads(engine.model_dump_json())  # configuration only: the lookup is not serialised
    with pytest.raises(TypeError, match="unexpected argument\\(s\\) top_kk"):
        sample_lookup.as_query_engine(llm=MockLLM(), top_kk=2)
    with pytest.raises(ValueError, match="response_mode: answer synthesis needs llm"):
        sample_lookup.as_query_engine(response_mode="compact")


# --- postprocessors in stock pipelines ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_lookup(sample_settings, embed_model):
    """A lookup querying with the same model as the stock index below (a model given is used as given)."""
    lookup = KnowledgeLookup(sample_settings, embed_model=embed_model)
    assert lookup.query_embed_model is embed_model
    yield lookup
    lookup.close()


@pytest.fixture(scope="module")
def directory_index(embed_model):
    """A stock index over SimpleDirectoryReader's documents: absolute file_path metadata, stock node ids."""
    documents = SimpleDirectoryReader(str(SAMPLE_KB), recursive=True, required_exts=[".md"]).load_data()
    assert all(d.metadata["file_path"].startswith("/") for d in documents)
    return VectorStoreIndex.from_documents(documents, embed_model=embed_model)


def _ranked(nodes: list[Any]) -> list[tuple[str, float]]:
    return [(stage_of(n).candidate.source, round(float(n.score or 0.0), 4)) for n in nodes]


def test_document_ranker_ranks_alike_sync_and_async_on_simple_directory_reader_nodes(torch_lookup, directory_index):
    query = "which garbage collector keeps pauses short for a latency sensitive service"
    ranker = DocumentRanker.from_lookup(torch_lookup)
    engine = directory_index.as_query_engine(
        similarity_top_k=8, node_postprocessors=[ranker], llm=MockLLM(max_tokens=4)
    )
    weighted = {k for k, w in ranker.weights.items() if w}  # the signals the knowledge base's fit left weight on
    sync_nodes = engine.query(query).source_nodes
    async_nodes = asyncio.run(engine.aquery(query)).source_nodes
    assert _ranked(sync_nodes) == _ranked(async_nodes)
    for node in sync_nodes + async_nodes:
        stage = stage_of(node)
        assert not stage.notes, stage.notes
        assert not stage.candidate.source.startswith("/")  # the absolute file_path became the source id
        assert stage.rerank is not None and stage.rerank.ranking and set(stage.rerank.ranking) <= weighted
        assert node.score == pytest.approx(sum(stage.rerank.ranking.values()), abs=1e-5)
        document = [r.detail for r in stage.rerank.hit_reasons if r.kind == HitKind.L1_DOCUMENT]
        assert document and all(word in document[0] for word in ("title", "summary", "text"))
    assert stage_of(sync_nodes[0]).candidate.source.startswith("jvm/")


def test_what_a_postprocessor_cannot_do_is_recorded_on_the_node(sample_lookup, directory_index, caplog):
    nodes = directory_index.as_retriever(similarity_top_k=4).retrieve("disk full on /var")
    bare = DocumentRanker(vectors=sample_lookup.doc_vectors)  # no query model: a bundle without embedding
    with caplog.at_level("INFO", logger="kb_retrieval.retrieval.doc_rank"):
        kept = bare.postprocess_nodes([n.model_copy(deep=True) for n in nodes], query_bundle=QueryBundle("disk full"))
        bare.postprocess_nodes([n.model_copy(deep=True) for n in nodes], query_bundle=QueryBundle("disk full"))
    assert all("no query embedding" in " ".join(stage_of(n).notes) for n in kept)
    assert caplog.text.count("no query embedding") <= 1  # logged once, recorded on every node
    unattached = RuleReranker().postprocess_nodes([n.model_copy(deep=True) for n in nodes], query_str="disk full")
    assert all("no L0 hints" in " ".join(stage_of(n).notes) for n in unattached)


def test_postprocessor_configuration_round_trips_and_from_lookup_reattaches(torch_lookup, directory_index):
    query = "mysql replication lag"
    nodes = directory_index.as_retriever(similarity_top_k=6).retrieve(query)
    bundle = QueryBundle(query)
    original = DocumentRanker.from_lookup(torch_lookup)
    config = original.to_dict()
    assert json.dumps(config) and set(config) >= {"weights", "class_name"}
    assert not {"vectors", "l0", "_vectors"} & set(config)
    reloaded = DocumentRanker.from_dict(config)
    assert reloaded.weights == original.weights and reloaded.vectors is None
    again = DocumentRanker.from_lookup(torch_lookup, config=config)
    assert _ranked(again.postprocess_nodes([n.model_copy(deep=True) for n in nodes], query_bundle=bundle)) == _ranked(
        original.postprocess_nodes([n.model_copy(deep=True) for n in nodes], query_bundle=bundle)
    )
    reranker = RuleReranker.from_lookup(torch_lookup)
    assert "l0" not in reranker.to_dict() and RuleReranker.from_dict(reranker.to_dict()).l0 is None
    assert RuleReranker.from_lookup(torch_lookup, config=reranker.to_dict()).l0 is torch_lookup.l0


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


# --- public names -------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_postprocessors_and_the_retriever_are_public_and_settings_is_deprecated():
    import kb_retrieval
    from kb_retrieval import (  # noqa: F401
        DocumentExpander,
        DocumentRanker,
        KBSettings,
        KnowledgeRetriever,
        RuleReranker,
        SourceDeduplicator,
    )

    with pytest.warns(DeprecationWarning, match="use kb_retrieval.KBSettings"):
        assert kb_retrieval.Settings is KBSettings
    import kb_retrieval.config

    with pytest.warns(DeprecationWarning, match="use KBSettings"):
        assert kb_retrieval.config.Settings is KBSettings
    # The project itself never goes through the deprecated name.
    code = """
import importlib, pkgutil, warnings
warnings.filterwarnings("error", message=r"kb_retrieval(\\.config)?\\.Settings is deprecated")
import kb_retrieval, sidecar
for pkg in (kb_retrieval, sidecar):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if not m.name.endswith(".__main__"):  # running a package's __main__ is running its command
            importlib.import_module(m.name)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
