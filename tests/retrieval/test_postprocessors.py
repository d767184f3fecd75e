"""The postprocessors (rerank, dedupe, document ranking) as LlamaIndex parts, never going quiet (issue 24): on stock
nodes with the lookup's hints, in stock sync and async pipelines over SimpleDirectoryReader nodes, what they cannot do
recorded on the node, their configuration serialised alone and reattached by ``from_lookup``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from llama_index.core import Document, SimpleDirectoryReader, VectorStoreIndex
from llama_index.core.llms.mock import MockLLM
from llama_index.core.schema import MetadataMode, QueryBundle

from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.retrieval.dedupe import SourceDeduplicator
from kb_retrieval.retrieval.doc_rank import DocumentRanker
from kb_retrieval.retrieval.rerank import RuleReranker
from kb_retrieval.retrieval.stage import STAGE_KEY, HitKind, stage_of
from tests.conftest import SAMPLE_KB

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


# --- on stock nodes -----------------------------------------------------------------------------------------


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
    # The first three by score; after them the order alternates with content, and a node that moved says so.
    scores = [n.score for n in by_document]
    assert scores[:3] == sorted(scores, reverse=True)[:3]
    for place, node in enumerate(by_document, start=1):
        if node.score != sorted(scores, reverse=True)[place - 1]:
            assert any(f"placed {place}," in str(r) for r in stage_of(node).rerank.hit_reasons)  # type: ignore[union-attr]
    # Stage data never reaches the LLM's text, and a stock node's own metadata passes through unchanged.
    assert STAGE_KEY not in ranked[0].node.get_content(metadata_mode=MetadataMode.LLM)
    assert all(n.node.metadata["file_path"] for n in ranked)
    # Without an L0 provider and without lookup context there are no hints: the stock order stands.
    plain = RuleReranker().postprocess_nodes([n.model_copy(deep=True) for n in nodes], query_str=query)
    assert [n.node.metadata["file_path"] for n in plain] == sources
