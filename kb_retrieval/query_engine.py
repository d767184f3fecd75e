"""``lookup_knowledge`` as a LlamaIndex query engine without an LLM: the response is the agent's evidence text,
the source nodes are the evidence blocks, the metadata holds the whole ``LookupResult``.

For an engine that writes an answer with an LLM, use the retriever:
``RetrieverQueryEngine.from_args(lookup.as_retriever(), llm=llm)``.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.response.schema import Response
from llama_index.core.query_engine import CustomQueryEngine

from kb_retrieval.models import LookupResult
from kb_retrieval.result import agent_text, evidence_nodes
from kb_retrieval.retriever import run_in_pool


class KnowledgeQueryEngine(CustomQueryEngine):
    """A query engine over the pipeline: the response's source nodes are the evidence blocks."""

    lookup: Any

    def custom_query(self, query_str: str) -> Response:
        result: LookupResult = self.lookup.lookup(query_str)
        return Response(
            response=agent_text(result),
            source_nodes=evidence_nodes(result),
            metadata={"lookup_result": result.to_json_dict()},
        )

    async def acustom_query(self, query_str: str) -> Response:
        response: Response = await run_in_pool(self.lookup.settings.retriever_workers, self.custom_query, query_str)
        return response
