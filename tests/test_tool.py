"""The lookup_knowledge FunctionTool, the query engine, and a real LlamaIndex agent calling the tool."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from llama_index.core.agent.workflow import ReActAgent, ToolCallResult
from llama_index.core.llms import CompletionResponse, CompletionResponseGen, CustomLLM, LLMMetadata
from llama_index.core.llms.callbacks import llm_completion_callback
from pydantic import PrivateAttr

from kb_retrieval.query_engine import KnowledgeQueryEngine
from kb_retrieval.tool import TOOL_NAME, make_lookup_tool

ALERT = "RedisMemoryHigh: Redis memory usage above 90% of maxmemory on redis-cache-01:6379"


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
