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

:func:`keep_pandas_out` does the same for pandas, which pymilvus imports at its own import and pyarrow (Milvus Lite's
storage) on its first conversion, both only to recognise pandas objects: the CLI's lookup starts without it.

Example:
    >>> import sys
    >>> defer_package_inits(("json",))  # already imported: left as it is
    >>> type(sys.modules["json"]).__name__
    'module'
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import types
from collections.abc import Iterable, Mapping
from importlib.machinery import ModuleSpec
from typing import Any

log = logging.getLogger(__name__)

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


# --- pandas, which a lookup never uses ----------------------------------------------------------------------------

#: What pymilvus' modules read from pandas while they are imported: ``pd.DataFrame`` (annotations, ``isinstance``)
#: and five functions of ``pandas.api.types`` (type inference for inserted data, which a lookup never does).
PANDAS_TYPES = ("infer_dtype", "is_array_like", "is_float", "is_list_like", "is_scalar")


def keep_pandas_out() -> None:
    """Let pymilvus and pyarrow start without importing pandas (~0.5 s and ~60 MiB of a cold CLI lookup, issue 39).

    Both import it only to recognise pandas objects, and a process that has not imported pandas holds none:
    pymilvus imports with stand-ins for the names it reads (:func:`_import_pymilvus`), which turn into the real
    pandas when used; pyarrow (Milvus Lite reads its segments with it) looks for pandas once per process, on the
    Python side and in C++, and is asked both here with pandas refused (:func:`_pyarrow_without_pandas`), so it
    treats every object as it treats any non-pandas one. That answer stays for the process: pandas imported later
    works, and so do pyarrow's explicit conversions (``to_pandas``, ``from_pandas``), but a pandas object handed to
    pyarrow as a plain value is read as a sequence. Hence for the CLI's own process only, which never imports pandas
    for a lookup (``tests/test_start_up_imports.py``); nothing is done when pandas is already imported.
    """
    if "pandas" in sys.modules or importlib.util.find_spec("pandas") is None:
        return
    try:
        _pyarrow_without_pandas()
        _import_pymilvus()
    except Exception as exc:  # another pyarrow or pymilvus than these were written against: a start-up cost, no more
        _drop_stand_ins()
        log.debug("pandas not kept out of this process: %s", exc)


class _RefusePandas:
    """A meta path finder under which ``import pandas`` raises ImportError, as it would if pandas were absent."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError(f"{name} is not imported by this process (kb_retrieval.deferred_imports)")


def _pyarrow_without_pandas() -> None:
    if "pyarrow" in sys.modules or importlib.util.find_spec("pyarrow") is None:
        return
    refuse = _RefusePandas()
    sys.meta_path.insert(0, refuse)
    try:
        pyarrow = importlib.import_module("pyarrow")
        pyarrow.lib._pandas_api.have_pandas  # noqa: B018  # the Python side's one look (pyarrow's pandas shim)
        pyarrow.scalar(True)  # the C++ side's one look, on its first conversion of a Python value
    finally:
        sys.meta_path.remove(refuse)


class _PandasClass(type):
    """A pandas class by name: nothing is an instance of it until the real pandas is imported (no object of the real
    class exists before), and from then on the check is the real class's."""

    def __instancecheck__(cls, obj: Any) -> bool:
        real = sys.modules.get("pandas")
        if real is None or isinstance(real, _PandasStandIn):
            return False
        return isinstance(obj, getattr(real, cls.__name__))


class _PandasStandIn(types.ModuleType):
    """``pandas`` or ``pandas.api.types`` while pymilvus imports: any name not set on it imports the real module."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        _drop_stand_ins()
        return getattr(importlib.import_module(self.__name__), name)


def _drop_stand_ins() -> None:
    for name in ("pandas.api.types", "pandas"):
        if isinstance(sys.modules.get(name), _PandasStandIn):
            del sys.modules[name]


def _pandas_function(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        _drop_stand_ins()
        return getattr(importlib.import_module("pandas.api.types"), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def _import_pymilvus() -> None:
    """pymilvus imported with the pandas names it reads at import (:data:`PANDAS_TYPES`, ``DataFrame``) standing in;
    pymilvus keeps the stand-ins, nothing else sees them (an ``import pandas`` afterwards is the real one)."""
    if "pymilvus" in sys.modules:
        return
    pandas = _PandasStandIn("pandas")
    pandas.DataFrame = _PandasClass("DataFrame", (), {})  # type: ignore[attr-defined]
    api_types = _PandasStandIn("pandas.api.types")
    for name in PANDAS_TYPES:
        setattr(api_types, name, _pandas_function(name))
    sys.modules["pandas"], sys.modules["pandas.api.types"] = pandas, api_types
    try:
        importlib.import_module("pymilvus")
    finally:
        _drop_stand_ins()
