"""``lookup_knowledge`` as a LlamaIndex query engine without an LLM: the response is the agent's evidence text,
the source nodes are the evidence blocks, the metadata holds the whole ``LookupResult`` (and, with the sidecar on,
the comparison under ``sidecar``).

``KnowledgeLookup.as_query_engine(llm=...)`` gives the engine that writes an answer with an LLM:
``RetrieverQueryEngine.from_args(lookup.as_retriever(), llm=llm)``; :func:`split_engine_kwargs` routes its other
arguments, as ``BaseIndex.as_query_engine`` does, and without ``llm=`` it uses ``Settings.llm`` when one is set
(:func:`configured_llm`); with none set it stays LLM-free.
"""

from __future__ import annotations

import inspect
from typing import Any

from llama_index.core.base.response.schema import Response
from llama_index.core.query_engine import CustomQueryEngine, RetrieverQueryEngine
from pydantic import Field

from kb_retrieval.config import KBSettings
from kb_retrieval.models import LookupResult
from kb_retrieval.overrides import INSTEAD
from kb_retrieval.result import agent_text, evidence_nodes, sidecar_comparison
from kb_retrieval.retriever import run_in_pool

#: What ``as_retriever`` takes besides the settings' names.
RETRIEVER_KWARGS = frozenset({"similarity_top_k", "filters", "callback_manager"})


def configured_llm() -> Any:
    """``llama_index.core.Settings.llm`` when a program set one, else None (``Settings.llm`` itself would resolve the
    OpenAI default, which needs a key and a network): what ``as_query_engine()`` falls back to, as
    ``BaseIndex.as_query_engine`` does."""
    from llama_index.core import Settings

    return Settings._llm


def split_engine_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``as_query_engine``'s keyword arguments as (the retriever's, ``RetrieverQueryEngine.from_args``'s); an
    argument neither takes raises ``TypeError`` naming it."""
    synth_names = set(inspect.signature(RetrieverQueryEngine.from_args).parameters) - {"retriever", "llm", "kwargs"}
    # VectorIndexRetriever's knobs go to the retriever too, which says what to use instead (kb_retrieval.overrides).
    retriever_names = RETRIEVER_KWARGS | set(KBSettings.model_fields) | set(KBSettings.setting_names()) | set(INSTEAD)
    retriever = {k: v for k, v in kwargs.items() if k in retriever_names}
    synth = {k: v for k, v in kwargs.items() if k in synth_names and k not in retriever}
    if unknown := sorted(set(kwargs) - set(retriever) - set(synth)):
        raise TypeError(
            f"as_query_engine() got unexpected argument(s) {', '.join(unknown)}; it takes the retriever's "
            f"({', '.join(sorted(RETRIEVER_KWARGS))} or a setting name) and RetrieverQueryEngine.from_args' "
            f"({', '.join(sorted(synth_names))})"
        )
    if "callback_manager" in retriever:
        synth["callback_manager"] = retriever["callback_manager"]
    return retriever, synth


class KnowledgeQueryEngine(CustomQueryEngine):
    """A query engine over the pipeline: the response's source nodes are the evidence blocks."""

    lookup: Any = Field(exclude=True, description="The KnowledgeLookup (runtime, not configuration).")
    filters: Any = Field(default=None, description="A MetadataFilters scope on every lookup.")

    def custom_query(self, query_str: str) -> Response:
        details = self.lookup.lookup_detailed(query_str, filters=self.filters)
        result: LookupResult = details.result
        metadata: dict[str, Any] = {"lookup_result": result.to_json_dict()}
        sidecar = sidecar_comparison(result, details.sidecar.trace_entry()) if details.sidecar is not None else None
        if sidecar is not None:
            metadata["sidecar"] = sidecar
        return Response(response=agent_text(result), source_nodes=evidence_nodes(result, sidecar), metadata=metadata)

    async def acustom_query(self, query_str: str) -> Response:
        response: Response = await run_in_pool(
            self.lookup.settings.retrieval.retriever_workers, self.custom_query, query_str
        )
        return response
