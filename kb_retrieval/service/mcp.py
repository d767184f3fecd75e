"""The ``lookup_knowledge`` tool over MCP (the official ``mcp`` SDK, streamable HTTP).

The same tool as ``KnowledgeLookup.as_tool()``: one described ``query`` argument; the text content is what the agent
reads (``agent_text``: the evidence and the context pack), the structured content the whole result JSON (its
output schema is ``LookupResult``'s). An empty query, a busy server or a failure comes back as an error result with
one line of text, never a traceback. A query over ``max_query_chars`` is truncated as in process (the result notes
it): an agent's tool call should not fail for the length of the alert it pastes.

Example (a client):
    >>> async with streamable_http_client("http://127.0.0.1:8765/mcp") as (read, write):  # doctest: +SKIP
    ...     async with ClientSession(read, write) as session:
    ...         await session.initialize()
    ...         result = await session.call_tool("lookup_knowledge", {"query": "etcd has no leader"})
"""

# No ``from __future__ import annotations``: the SDK builds the tool's schemas from the live annotations.
import logging
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent
from pydantic import Field

from kb_retrieval import __version__
from kb_retrieval.models import LookupResult
from kb_retrieval.result import agent_text
from kb_retrieval.retrieval.query_check import EmptyQueryError
from kb_retrieval.service.runner import BusyError, LookupRunner, WorkerWaitError
from kb_retrieval.tool import QUERY_DESCRIPTION, TOOL_DESCRIPTION, TOOL_NAME

log = logging.getLogger(__name__)


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
        query: Annotated[str, Field(description=QUERY_DESCRIPTION)],
    ) -> Annotated[CallToolResult, LookupResult]:
        """Look up the knowledge base for a question or an alert text."""
        try:
            result = await runner.lookup(query)
        except (EmptyQueryError, BusyError, WorkerWaitError) as exc:
            return _error(str(exc))
        except Exception as exc:  # the agent gets a message, never a stack trace (the log has it)
            log.exception("lookup_knowledge over MCP failed")
            return _error(f"the lookup failed ({type(exc).__name__}); no evidence returned.")
        return CallToolResult(
            content=[TextContent(type="text", text=agent_text(result))], structured_content=result.to_json_dict()
        )

    server.add_tool(lookup_knowledge, name=TOOL_NAME, description=TOOL_DESCRIPTION, structured_output=True)
    return server
