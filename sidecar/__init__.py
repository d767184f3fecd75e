"""The sidecar: a stock LlamaIndex retriever over the same collection, off by default, run beside the main path only
to feed comparison reports.

- :mod:`sidecar.retriever`: the stock ``VectorIndexRetriever`` over ``MilvusVectorStore`` (``sidecar:vectorstore``).
- :mod:`sidecar.runner`: runs it on its own thread beside a lookup, with a deadline; every outcome is a status.
- :mod:`sidecar.comparable`: both paths' rankings in one shape, one document per source.
- :mod:`sidecar.comparison`: both paths compared on golden cases; :mod:`sidecar.report` writes the report;
  :mod:`sidecar.compare` is the ``kb-retrieval compare`` command.

Enabling it is one setting, ``KB_SIDECAR_ENABLED=true`` (``KBSettings.sidecar.enabled``): the core then creates
``sidecar.runner:SidecarRunner`` (``KBSettings.sidecar.factory``) through its protocol,
:mod:`kb_retrieval.sidecar_protocol`, and never imports this package otherwise. While it is off, nothing here is
imported by the lookup path and lookups are exactly what they are without it. Its results never change the main
result: they reach the trace row (``retrieval_details.sidecar``) and ``KnowledgeLookup.lookup_detailed(query).sidecar``.

The names below load on first use, so ``import sidecar.compare`` (the CLI's parser) stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "SIDECAR_PATH": "sidecar.models",
    "ComparableResult": "sidecar.models",
    "SidecarRun": "sidecar.models",
    "SidecarStatus": "sidecar.models",
    "SidecarJob": "sidecar.runner",
    "SidecarRunner": "sidecar.runner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sidecar' has no attribute {name!r}")
