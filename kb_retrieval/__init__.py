"""kb-retrieval: an explicit, traceable ``lookup_knowledge`` tool over an ops knowledge base in Milvus.

The package imports nothing heavy at import time, so ``kb_retrieval.evaluation`` runs without Milvus, torch or
LlamaIndex installed. The main names load on first use:

    >>> from kb_retrieval import KBSettings, KnowledgeLookup, make_lookup_tool  # doctest: +SKIP
    >>> from kb_retrieval import DocumentRanker, KnowledgeRetriever, RuleReranker  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "KBSettings": "kb_retrieval.config",
    "KnowledgeRetriever": "kb_retrieval.retriever",
    "RuleReranker": "kb_retrieval.retrieval.rerank",
    "SourceDeduplicator": "kb_retrieval.retrieval.dedupe",
    "DocumentRanker": "kb_retrieval.retrieval.doc_rank",
    "DocumentExpander": "kb_retrieval.retrieval.expand",
    "KnowledgeLookup": "kb_retrieval.engine",
    "KnowledgeQueryEngine": "kb_retrieval.query_engine",
    "LookupResult": "kb_retrieval.models",
    "make_lookup_tool": "kb_retrieval.tool",
    "ingest": "kb_retrieval.indexing.ingest",
}

__all__ = [*sorted(_EXPORTS), "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    if name == "Settings":
        # The old name clashes with llama_index.core.Settings in user code that imports both.
        warnings.warn(
            "kb_retrieval.Settings is deprecated: use kb_retrieval.KBSettings (the same class)",
            DeprecationWarning,
            stacklevel=2,
        )
        return import_module("kb_retrieval.config").KBSettings
    raise AttributeError(f"module 'kb_retrieval' has no attribute {name!r}")
