"""``lookup_knowledge`` over MCP (streamable HTTP at ``/mcp``): the official SDK's client lists and calls it, and a
LlamaIndex ``FunctionAgent`` in this process calls it through ``llama-index-tools-mcp``."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.service.conftest import REDIS_ALERT, without_timings

pytestmark = pytest.mark.timeout(600)


async def _session_calls(url: str) -> tuple[Any, Any, Any]:
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = await session.list_tools()
        found = await session.call_tool("lookup_knowledge", {"query": REDIS_ALERT})
        empty = await session.call_tool("lookup_knowledge", {"query": "  "})
        return tools, found, empty


def test_an_mcp_client_lists_and_calls_lookup_knowledge(served):
    tools, found, empty = asyncio.run(_session_calls(served.url + "/mcp"))
    assert [tool.name for tool in tools.tools] == ["lookup_knowledge"]
    tool = tools.tools[0]
    assert tool.input_schema["required"] == ["query"]
    assert "alert" in tool.input_schema["properties"]["query"]["description"]
    assert tool.output_schema is not None and "evidenceBlocks" in tool.output_schema["properties"]
    assert not found.is_error
    over_http = httpx.post(served.url + "/v1/lookup", json={"query": REDIS_ALERT}, timeout=60)
    assert (
        found.content[0].text
        == httpx.post(
            served.url + "/v1/lookup", json={"query": REDIS_ALERT}, headers={"accept": "text/plain"}, timeout=60
        ).text
    )  # the agent text
    assert without_timings(found.structured_content) == without_timings(over_http.json())  # the result JSON
    assert (
        empty.is_error
        and empty.content[0].text == "lookup_knowledge error: query is empty: pass a question or an alert text"
    )


def test_a_llamaindex_agent_calls_the_tool_through_llama_index_tools_mcp(served):
    from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
    from llama_index.core.llms import ChatMessage
    from llama_index.core.llms.llm import ToolSelection
    from llama_index.core.llms.mock import MockFunctionCallingLLM
    from llama_index.tools.mcp import BasicMCPClient, McpToolSpec

    calls = {"n": 0}

    def respond(messages: Any, **kwargs: Any) -> ChatMessage:
        calls["n"] += 1
        if calls["n"] == 1:  # first turn: call the tool with the alert; then answer from what it returned
            selection = ToolSelection(tool_id="1", tool_name="lookup_knowledge", tool_kwargs={"query": REDIS_ALERT})
            return ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [selection]})
        return ChatMessage(role="assistant", content="See [1] redis/memory-usage-high.md")

    async def run() -> tuple[list[Any], list[ToolCallResult], str]:
        tools = await McpToolSpec(client=BasicMCPClient(served.url + "/mcp")).to_tool_list_async()
        agent = FunctionAgent(tools=tools, llm=MockFunctionCallingLLM(response_generator=respond))
        handler = agent.run(user_msg="Redis is alerting on cache-01")
        results = [event async for event in handler.stream_events() if isinstance(event, ToolCallResult)]
        answer = await handler
        return tools, results, str(answer)

    tools, results, answer = asyncio.run(run())
    assert [tool.metadata.name for tool in tools] == ["lookup_knowledge"]
    assert "query" in tools[0].metadata.get_parameters_dict()["properties"]
    assert len(results) == 1 and results[0].tool_kwargs == {"query": REDIS_ALERT}
    raw = results[0].tool_output.raw_output  # the MCP CallToolResult the server sent
    assert not raw.is_error
    assert raw.structured_content["evidenceBlocks"][0]["source"] == "redis/memory-usage-high.md"
    assert "[1] source: redis/memory-usage-high.md" in raw.content[0].text
    assert "redis/memory-usage-high.md" in answer
