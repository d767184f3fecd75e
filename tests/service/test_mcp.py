"""``lookup_knowledge`` over MCP (streamable HTTP at ``/mcp``): the official SDK's client lists and calls it, and a
LlamaIndex ``FunctionAgent`` in this process calls it through ``llama-index-tools-mcp``, its LLM reading the evidence
text (about the in-process tool's size), not the whole result (issue 38, item 4)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from kb_retrieval.service.mcp import RESULT_META
from tests.service.conftest import REDIS_ALERT, without_timings

pytestmark = pytest.mark.timeout(600)


async def _session_calls(url: str) -> dict[str, Any]:
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return {
            "tools": await session.list_tools(),
            "found": await session.call_tool("lookup_knowledge", {"query": REDIS_ALERT}),
            "full": await session.call_tool("lookup_knowledge", {"query": REDIS_ALERT}, meta={RESULT_META: True}),
            "empty": await session.call_tool("lookup_knowledge", {"query": "  "}),
            "unknown": await session.call_tool("lookup_knowledge", {"query": REDIS_ALERT, "filters": {"x": 1}}),
        }


def test_an_mcp_client_lists_and_calls_lookup_knowledge(served):
    calls = asyncio.run(_session_calls(served.url + "/mcp"))
    tools, found, full, empty = calls["tools"], calls["found"], calls["full"], calls["empty"]
    assert [tool.name for tool in tools.tools] == ["lookup_knowledge"]
    tool = tools.tools[0]
    assert tool.input_schema["required"] == ["query"] and list(tool.input_schema["properties"]) == ["query"]
    assert "alert" in tool.input_schema["properties"]["query"]["description"]
    # No output schema: the whole result is structured content only when a request asks for it in its _meta.
    assert tool.output_schema is None
    assert not found.is_error and found.structured_content is None and len(found.content) == 1
    over_http = httpx.post(served.url + "/v1/lookup", json={"query": REDIS_ALERT}, timeout=60)
    assert (
        found.content[0].text
        == httpx.post(
            served.url + "/v1/lookup", json={"query": REDIS_ALERT}, headers={"accept": "text/plain"}, timeout=60
        ).text
    )  # the agent text
    assert full.content[0].text == found.content[0].text
    assert without_timings(full.structured_content) == without_timings(over_http.json())  # the result JSON
    assert (
        empty.is_error
        and empty.content[0].text == "lookup_knowledge error: query is empty: pass a question or an alert text"
    )
    # An argument the tool does not take is refused, as the in-process tool refuses it (a TypeError there).
    unknown = calls["unknown"]
    assert unknown.is_error and unknown.content[0].text == (
        "lookup_knowledge error: unknown argument(s) filters; lookup_knowledge takes query only"
    )


def test_a_llamaindex_agent_calls_the_tool_through_llama_index_tools_mcp(served, in_process):
    from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
    from llama_index.core.llms import ChatMessage
    from llama_index.core.llms.llm import ToolSelection
    from llama_index.core.llms.mock import MockFunctionCallingLLM
    from llama_index.tools.mcp import BasicMCPClient, McpToolSpec

    read_by_llm: list[str] = []

    def respond(messages: Any, **kwargs: Any) -> ChatMessage:
        tool_messages = [m for m in messages if m.role == "tool"]
        if not tool_messages:  # first turn: call the tool with the alert; then answer from what it returned
            selection = ToolSelection(tool_id="1", tool_name="lookup_knowledge", tool_kwargs={"query": REDIS_ALERT})
            return ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [selection]})
        read_by_llm.append(tool_messages[-1].content or "")
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
    assert not raw.is_error and raw.structured_content is None
    assert "[1] source: redis/memory-usage-high.md" in raw.content[0].text
    assert "redis/memory-usage-high.md" in answer
    # What the LLM read: McpToolSpec passes str() of the whole CallToolResult, so it is the evidence text in one
    # TextContent wrapper (newlines escaped by repr), about the size of what the in-process tool gives its LLM.
    (llm_text,) = read_by_llm
    in_process_text = in_process.as_tool().call(query=REDIS_ALERT).content
    assert raw.content[0].text == in_process_text
    assert repr(in_process_text) in llm_text
    assert abs(len(llm_text) - len(in_process_text)) <= 0.10 * len(in_process_text), (
        len(llm_text),
        len(in_process_text),
    )
