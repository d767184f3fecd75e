"""The boundary a LlamaIndex engineer hits (issue 38, item 5) on the sample KB: overrides that cannot be honoured
are refused, two knowledge bases as two tools in one agent, ``Settings.llm`` as the query engine's fallback, node
scores a similarity postprocessor can threshold."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core import Document, Settings
from llama_index.core.llms.mock import MockLLM
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.overrides import UnsupportedOverrideError
from kb_retrieval.query_engine import KnowledgeQueryEngine

pytestmark = pytest.mark.timeout(900)

ALERT = "RedisMemoryHigh: Redis memory usage above 90% of maxmemory on redis-cache-01:6379"
CERT = "TLS certificate of api.example.com expires in 3 days"


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ({"collection": "nope"}, "collection cannot be overridden: the pipeline holds one Milvus client"),
        ({"dim": 10}, "dim cannot be overridden: read from the collection's schema"),
        ({"milvus_uri": "http://127.0.0.1:9"}, "milvus_uri cannot be overridden"),
        ({"state_dir": "/elsewhere"}, "state_dir cannot be overridden"),
        ({"embed_model": "/nonexistent"}, "embed_model cannot be overridden: the query model is loaded once"),
        ({"vector_store_query_mode": "hybrid"}, "lexical_enabled=False for dense only"),
        ({"alpha": 0.5}, "the dense/BM25 balance is lexical_weight"),
        ({"node_ids": ["x"]}, "key='id' for chunk ids"),
        ({"doc_ids": ["redis/memory-usage-high.md"]}, "a document is its source id"),
    ],
)
def test_an_override_that_cannot_be_honoured_is_refused(sample_lookup, override: dict[str, Any], says: str) -> None:
    with pytest.raises(UnsupportedOverrideError, match=says.replace("(", r"\(").replace(")", r"\)")):
        sample_lookup.as_retriever(**override)
    with pytest.raises(UnsupportedOverrideError, match=says.replace("(", r"\(").replace(")", r"\)")):
        sample_lookup.as_query_engine(**override)


def test_an_override_the_pipeline_reads_is_honoured(sample_lookup) -> None:
    assert len(sample_lookup.as_retriever(max_evidence_blocks=1).retrieve(ALERT)) == 1
    same = sample_lookup.as_retriever(collection=sample_lookup.settings.storage.collection)  # its own value: accepted
    assert same.retrieve(ALERT)[0].node.node_id == "redis/memory-usage-high.md"


@pytest.fixture
def configured_llm() -> Iterator[MockLLM]:
    llm = MockLLM(max_tokens=5)
    Settings.llm = llm
    try:
        yield llm
    finally:
        Settings._llm = None  # unset (assigning None to Settings.llm sets a MockLLM)


def test_as_query_engine_uses_settings_llm_when_one_is_set(sample_lookup, configured_llm) -> None:
    engine = sample_lookup.as_query_engine(similarity_top_k=1)
    assert isinstance(engine, RetrieverQueryEngine) and engine._response_synthesizer._llm is configured_llm
    response = engine.query(ALERT)
    assert str(response).split() == ["text"] * 5  # the LLM's answer
    assert [n.node.node_id for n in response.source_nodes] == ["redis/memory-usage-high.md"]


def test_as_query_engine_stays_llm_free_when_none_is_set(sample_lookup) -> None:
    assert Settings._llm is None
    assert isinstance(sample_lookup.as_query_engine(), KnowledgeQueryEngine)


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


def test_two_knowledge_bases_are_two_named_tools_in_one_agent(sample_lookup, tmp_path, embed_model) -> None:
    from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
    from llama_index.core.llms import ChatMessage
    from llama_index.core.llms.llm import ToolSelection
    from llama_index.core.llms.mock import MockFunctionCallingLLM
    from llama_index.core.vector_stores import MetadataFilter, MetadataFilters

    certs = KnowledgeLookup.from_documents(
        [Document(text="Renew it with certbot renew, then reload nginx.", doc_id="tls/cert-expiry",
                  metadata={"title": "TLS certificate expiry", "category": "tls"})],
        KBSettings(state_dir=tmp_path / "state", vector_store_mode="sdk"),
        embed_model=embed_model,
        name="tls",
    )  # fmt: skip
    redis_only = MetadataFilters(filters=[MetadataFilter(key="category", value="redis")])
    tools = [
        sample_lookup.as_tool(
            name="lookup_ops_runbooks", description="Ops runbooks (Redis scope).", filters=redis_only
        ),
        certs.as_tool(name="lookup_tls_runbooks", description="TLS certificate runbooks."),
    ]
    assert [t.metadata.name for t in tools] == ["lookup_ops_runbooks", "lookup_tls_runbooks"]
    calls = iter(
        [
            ToolSelection(tool_id="1", tool_name="lookup_ops_runbooks", tool_kwargs={"query": ALERT}),
            ToolSelection(tool_id="2", tool_name="lookup_tls_runbooks", tool_kwargs={"query": CERT}),
        ]
    )

    def respond(messages: Any, **kwargs: Any) -> ChatMessage:
        selection = next(calls, None)
        if selection is None:
            return ChatMessage(role="assistant", content="done")
        return ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [selection]})

    async def run() -> list[ToolCallResult]:
        agent = FunctionAgent(tools=tools, llm=MockFunctionCallingLLM(response_generator=respond))
        handler = agent.run(user_msg="Redis memory and a certificate are alerting")
        results = [event async for event in handler.stream_events() if isinstance(event, ToolCallResult)]
        await handler
        return results

    try:
        results = asyncio.run(run())
    finally:
        certs.close()
    by_tool = {r.tool_name: r.tool_output for r in results}
    ops, tls = by_tool["lookup_ops_runbooks"].raw_output, by_tool["lookup_tls_runbooks"].raw_output
    assert {b.category for b in ops.evidence_blocks} == {"redis"}
    assert [b.source for b in tls.evidence_blocks] == ["tls/cert-expiry"]
    assert "certbot renew" in by_tool["lookup_tls_runbooks"].content
    with pytest.raises(ValueError, match="tool name 'lookup knowledge'"):
        sample_lookup.as_tool(name="lookup knowledge")
