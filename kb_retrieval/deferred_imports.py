"""Package ``__init__`` files a CLI lookup never needs, run only when something asks for them.

Python runs a package's ``__init__`` before any of its submodules, and ``llama_index.core``'s imports every index,
chat engine, memory, SQL wrapper and prompt of LlamaIndex (``llama_index.core.indices`` alone 1.25 s of a 3-10 s
CLI lookup, issue 39), although a lookup uses a few submodules (``schema``, ``base.base_retriever``,
``postprocessor.types``, ``instrumentation``). :func:`defer_package_inits` puts each package in ``sys.modules``
without running its ``__init__``: submodules import as usual (the package's ``__path__`` is set), and the first
attribute asked of the package itself (``from llama_index.core import Settings``) runs the real ``__init__`` into
the same module object, so code that needs it gets it, only later.

Only the CLI's in-process lookup and its ingest call it, before anything imports LlamaIndex: a process of its own,
whose imports the CLI owns. Library users import LlamaIndex as usual.

Example:
    >>> import sys
    >>> defer_package_inits(("json",))  # already imported: left as it is
    >>> type(sys.modules["json"]).__name__
    'module'
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from collections.abc import Iterable, Mapping
from importlib.machinery import ModuleSpec
from typing import Any

#: The packages a lookup through the memory plan, or an ingest, imports submodules of but never needs the
#: ``__init__`` of: each ``__init__`` imports the whole of LlamaIndex (its indices, chat engines, LLM rerankers, the
#: simple vector store), or, for ``callbacks`` and ``prompts``, handlers and templates a lookup never builds (the
#: token counter and its LLM types, the rich prompt templates and their template engine).
LOOKUP_DEFERRED = (
    "llama_index.core",
    "llama_index.core.indices",
    "llama_index.core.postprocessor",
    "llama_index.core.vector_stores",
    "llama_index.core.callbacks",
    "llama_index.core.prompts",
)
#: Names that LlamaIndex's own modules import from a deferred package (``from llama_index.core.callbacks import
#: CallbackManager``), served from the submodule that defines them without running the package's ``__init__``.
LIGHT_NAMES: Mapping[str, Mapping[str, str]] = {
    "llama_index.core.callbacks": {
        "CallbackManager": "llama_index.core.callbacks.base",
        "CBEventType": "llama_index.core.callbacks.schema",
        "EventPayload": "llama_index.core.callbacks.schema",
    },
    "llama_index.core.prompts": {
        "BasePromptTemplate": "llama_index.core.prompts.base",
        "ChatPromptTemplate": "llama_index.core.prompts.base",
        "PromptTemplate": "llama_index.core.prompts.base",
        "SelectorPromptTemplate": "llama_index.core.prompts.base",
    },
}
#: Module globals of a deferred ``__init__`` that its submodules read with ``from package import name`` before
#: anything else would need the ``__init__`` (``CallbackManager()`` reads ``global_handler``): their initial values.
PRESET: Mapping[str, Mapping[str, Any]] = {"llama_index.core": {"global_handler": None, "global_tokenizer": None}}

_pending: dict[str, ModuleSpec] = {}
# Re-entrant: the real __init__, running in this thread, may ask the package for a name it has not set yet.
_lock = threading.RLock()


class _DeferredPackage(types.ModuleType):
    """A package whose ``__init__`` runs on the first attribute it does not have (``__all__`` included)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name != "__all__":
            raise AttributeError(name)
        if (home := LIGHT_NAMES.get(self.__name__, {}).get(name)) is not None and deferred(self.__name__):
            value = getattr(importlib.import_module(home), name)
            setattr(self, name, value)  # kept when the real __init__ runs later (the same object)
            return value
        with _lock:
            spec = _pending.pop(self.__name__, None)
            if spec is not None:
                _run_init(self, spec)
        return types.ModuleType.__getattribute__(self, name)


def _run_init(module: types.ModuleType, spec: ModuleSpec) -> None:
    # What was set on the package before its __init__ ran (its submodules, a set_global_handler()) is kept.
    kept = {k: v for k, v in vars(module).items() if not k.startswith("__")}
    try:
        assert spec.loader is not None  # a package found on disk has one
        spec.loader.exec_module(module)
    finally:
        module.__class__ = types.ModuleType
    vars(module).update(kept)


def defer_package_inits(names: Iterable[str] = LOOKUP_DEFERRED) -> None:
    """Put each package of ``names`` (parents first) in ``sys.modules`` with its ``__init__`` not yet run; one
    already imported, or not installed, is left alone."""
    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            continue
        module = importlib.util.module_from_spec(spec)
        for key, value in PRESET.get(name, {}).items():
            setattr(module, key, value)
        module.__class__ = _DeferredPackage
        with _lock:
            _pending[name] = spec
            sys.modules[name] = module
        if (parent := name.rpartition(".")[0]) and parent in sys.modules:
            setattr(sys.modules[parent], name.rpartition(".")[2], module)


def deferred(name: str) -> bool:
    """True while ``name``'s ``__init__`` has not run (checking it runs nothing)."""
    return name in _pending
