"""The ``lookup_knowledge`` FunctionTool: the explicit tool boundary an agent calls with one ``query`` argument.

Nothing is injected into responses implicitly: the agent decides to call the tool, and what it reads back is
derived from the evidence blocks and the context pack. Errors never escape to the agent as exceptions: an empty
query or an unexpected failure comes back as a short text saying what was wrong.

Example:
    >>> tool = make_lookup_tool(KnowledgeLookup(settings))  # doctest: +SKIP
    >>> agent = FunctionAgent(tools=[tool], llm=llm)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from llama_index.core.tools import FunctionTool

from kb_retrieval.engine import agent_text
from kb_retrieval.retrieval.query_transform import EmptyQueryError

if TYPE_CHECKING:
    from kb_retrieval.engine import KnowledgeLookup

log = logging.getLogger(__name__)

TOOL_NAME = "lookup_knowledge"
TOOL_DESCRIPTION = (
    "Look up the ops/SRE knowledge base (runbooks, FAQs) for a question or an alert text. "
    "Returns evidence blocks with source, title, breadcrumb and hit reasons, or says that no evidence was found. "
    "Argument: query (the question or the alert's name, summary and description)."
)


def make_lookup_tool(lookup: KnowledgeLookup) -> FunctionTool:
    def lookup_knowledge(query: str) -> str:
        """Look up the knowledge base for a question or an alert text."""
        try:
            return agent_text(lookup.lookup(query))
        except EmptyQueryError as exc:
            return f"lookup_knowledge error: {exc}"
        except Exception as exc:  # the agent gets a message, never a stack trace
            log.exception("lookup_knowledge failed")
            return f"lookup_knowledge error: the lookup failed ({type(exc).__name__}); no evidence returned."

    return FunctionTool.from_defaults(fn=lookup_knowledge, name=TOOL_NAME, description=TOOL_DESCRIPTION)
