"""The ``lookup_knowledge`` tool over MCP (the official ``mcp`` SDK, streamable HTTP).

The same tool as ``KnowledgeLookup.as_tool()``: one described ``query`` argument (any other argument is refused,
as a Python call with it is); the text content is what the agent reads (``agent_text``: the evidence and the
context pack), the same text as in process. An empty query, an unknown argument, a busy server or a failure comes
back as an error result (``isError``) with one line of text, never a traceback. A query over ``max_query_chars`` is
truncated as in process (the result notes it): an agent's tool call should not fail for the length of the alert it
pastes.

The whole result (traces, rerank, stage times: ~10x the text) is structured content only when the request asks for
it in its ``_meta`` (``{"kb-retrieval/result": true}``; ``session.call_tool(..., meta=...)``), and the tool
declares no output schema. Why: ``llama-index-tools-mcp``'s ``McpToolSpec`` hands the LLM ``str()`` of the whole
``CallToolResult``, structured content included, whatever the server does; with the text alone that string is the
evidence text in one ``TextContent(... text='...')`` wrapper (newlines escaped), about the in-process size. Programs
that want the full result ask for it per call, or use ``POST /v1/lookup``.

Example (a client):
    >>> async with streamable_http_client("http://127.0.0.1:8765/mcp") as (read, write):  # doctest: +SKIP
    ...     async with ClientSession(read, write) as session:
    ...         await session.initialize()
    ...         result = await session.call_tool("lookup_knowledge", {"query": "etcd has no leader"})
    ...         full = await session.call_tool("lookup_knowledge", {"query": "..."}, meta={RESULT_META: True})
"""

# No ``from __future__ import annotations``: the SDK builds the tool's schemas from the live annotations.
import logging
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ContentBlock, TextContent
from pydantic import Field

from kb_retrieval import __version__
from kb_retrieval.result import agent_text
from kb_retrieval.retrieval.query_check import EmptyQueryError
from kb_retrieval.service.runner import BusyError, LookupRunner, WorkerWaitError
from kb_retrieval.tool import QUERY_DESCRIPTION, TOOL_DESCRIPTION, TOOL_NAME

log = logging.getLogger(__name__)

#: The request ``_meta`` key asking for the whole result as structured content.
RESULT_META = "kb-retrieval/result"
#: The tool's arguments: what the in-process tool takes.
ARGUMENTS = ("query",)


def _error(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=f"{TOOL_NAME} error: {text}")], is_error=True)


def make_mcp_server(runner: LookupRunner) -> MCPServer:
    """An MCP server with one tool, ``lookup_knowledge``, whose lookups run on ``runner``'s pool."""
    server: MCPServer = MCPServer(
        name="kb-retrieval",
        version=__version__,
        instructions="Call lookup_knowledge with a question or an alert text; cite evidence by its [n] index.",
        log_level="WARNING",
    )

    async def lookup_knowledge(
        query: Annotated[str, Field(description=QUERY_DESCRIPTION)], ctx: Context
    ) -> CallToolResult:
        """Look up the knowledge base for a question or an alert text."""
        request = ctx.request_context
        given = dict((request.params or {}).get("arguments") or {})
        if unknown := sorted(set(given) - set(ARGUMENTS)):
            return _error(f"unknown argument(s) {', '.join(unknown)}; {TOOL_NAME} takes {', '.join(ARGUMENTS)} only")
        try:
            result = await runner.lookup(query)
        except (EmptyQueryError, BusyError, WorkerWaitError) as exc:
            return _error(str(exc))
        except Exception as exc:  # the agent gets a message, never a stack trace (the log has it)
            log.exception("lookup_knowledge over MCP failed")
            return _error(f"the lookup failed ({type(exc).__name__}); no evidence returned.")
        content: list[ContentBlock] = [TextContent(type="text", text=agent_text(result))]
        if (request.meta or {}).get(RESULT_META):
            return CallToolResult(content=content, structured_content=result.to_json_dict())
        return CallToolResult(content=content)

    server.add_tool(lookup_knowledge, name=TOOL_NAME, description=TOOL_DESCRIPTION, structured_output=False)
    return server
