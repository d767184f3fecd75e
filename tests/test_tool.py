"""The lookup_knowledge FunctionTool, the query engine, and real LlamaIndex agents calling the tool: its structured
output, its described parameter, and two knowledge bases as two named tools in one agent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest
from llama_index.core import Document
from llama_index.core.agent.workflow import ReActAgent, ToolCallResult
from llama_index.core.llms import CompletionResponse, CompletionResponseGen, CustomLLM, LLMMetadata
from llama_index.core.llms.callbacks import llm_completion_callback
from pydantic import PrivateAttr

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.models import LookupResult
from kb_retrieval.query_engine import KnowledgeQueryEngine
from kb_retrieval.tool import TOOL_NAME, make_lookup_tool
from tests.support.kb import ALERT


class ScriptedLLM(CustomLLM):
    """Answers with scripted ReAct steps and remembers every prompt it was given."""

    _script: list[str] = PrivateAttr(default_factory=list)
    _prompts: list[str] = PrivateAttr(default_factory=list)

    def __init__(self, script: Sequence[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._script = list(script)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_chat_model=False, is_function_calling_model=False)

    @property
    def prompts(self) -> list[str]:
        return self._prompts

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self._prompts.append(prompt)
        return CompletionResponse(text=self._script.pop(0))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        text = self.complete(prompt).text

        def gen() -> CompletionResponseGen:
            yield CompletionResponse(text=text, delta=text)

        return gen()


def test_tool_has_one_query_argument(sample_lookup):
    tool = make_lookup_tool(sample_lookup)
    assert tool.metadata.name == TOOL_NAME
    schema = tool.metadata.get_parameters_dict()
    assert list(schema["properties"]) == ["query"] and schema["required"] == ["query"]


def test_tool_output_is_the_evidence(sample_lookup):
    output = make_lookup_tool(sample_lookup).call(query=ALERT)
    assert "source: redis/memory-usage-high.md" in output.content
    assert "hit reasons:" in output.content


def test_tool_turns_errors_into_text(sample_lookup):
    output = make_lookup_tool(sample_lookup).call(query="   ")
    assert output.content.startswith("lookup_knowledge error:") and "empty" in output.content


def test_query_engine_sources_are_the_evidence(sample_lookup):
    response = KnowledgeQueryEngine(lookup=sample_lookup).query(ALERT)
    result = response.metadata["lookup_result"]
    assert [n.node.metadata["source"] for n in response.source_nodes] == [b["source"] for b in result["evidenceBlocks"]]
    assert response.source_nodes[0].node.get_content() == result["evidenceBlocks"][0]["content"]


def test_agent_calls_the_tool_explicitly(sample_lookup):
    script = [
        f"Thought: I need the runbook.\nAction: lookup_knowledge\nAction Input: {json.dumps({'query': ALERT})}",
        "Thought: I can answer without using any more tools.\n"
        "Answer: Check INFO memory; see redis/memory-usage-high.md",
    ]
    llm = ScriptedLLM(script)
    agent = ReActAgent(tools=[make_lookup_tool(sample_lookup)], llm=llm, streaming=False)
    rows_before = sample_lookup.traces.count()

    async def run() -> tuple[str, list[ToolCallResult]]:
        handler = agent.run(user_msg="Redis on cache-01 is alerting, what do I do?")
        calls = [event async for event in handler.stream_events() if isinstance(event, ToolCallResult)]
        return str(await handler), calls

    answer, calls = asyncio.run(run())
    assert [c.tool_name for c in calls] == [TOOL_NAME]
    assert calls[0].tool_kwargs == {"query": ALERT}
    assert "source: redis/memory-usage-high.md" in calls[0].tool_output.content
    assert sample_lookup.traces.count() == rows_before + 1  # exactly the one explicit call
    # Nothing was injected before the agent chose to call the tool; the evidence arrives as the tool's observation.
    assert "Redis memory usage high" not in llm.prompts[0]
    assert "source: redis/memory-usage-high.md" in llm.prompts[1]
    assert "redis/memory-usage-high.md" in answer


# --- the tool's structured output, in a FunctionAgent ---------------------------------------------------------

TOOL = "lookup_knowledge"


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


# --- two knowledge bases, two tools ---------------------------------------------------------------------------

CERT = "TLS certificate of api.example.com expires in 3 days"


@pytest.mark.timeout(900)
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
