"""The project's modules import forward: no import cycles, and the core never imports the sidecar.

Every ``import`` and ``from ... import`` of ``kb_retrieval`` and ``sidecar`` is read with ``ast``: at module level,
inside functions and under ``TYPE_CHECKING`` alike (a lazy import is still a dependency). ``from package import
name`` depends on ``package.name`` when that is a module, else on ``package`` itself. Importing a module does not
count as depending on its parent packages' ``__init__`` (Python runs them, but every module would then depend on
its package and every package on its modules). The core may name the sidecar in a string
(``KBSettings.sidecar.factory = "sidecar.runner:SidecarRunner"``, loaded by
``kb_retrieval.sidecar_protocol.load_runner``): that is not an import.

Known offenders of issue 11 are listed in ``ALLOWED`` below, edge by edge: delete an entry when its import is gone
(the test fails on an entry that no longer matches an import, so the list cannot go stale). Any other cycle fails.

The public names import from the package (the postprocessors, the retriever, ``KBSettings``), the old ``Settings``
alias warns, and no module of the project goes through it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("kb_retrieval", "sidecar")

# (importer, imported): edges that close a known cycle or break the core/sidecar rule, to be removed.
ALLOWED: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The project modules that module ``name`` (file ``path``) imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _known(alias.name, modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, node.module] if node.module else anchor)
            else:
                base = node.module or ""
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield from _known(submodule if submodule in modules else base, modules)


def _known(dotted: str, modules: dict[str, Path]) -> Iterator[str]:
    """The longest prefix of ``dotted`` that is a project module (``import a.b.c`` depends on ``a.b.c``)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            yield candidate
            return


def import_graph() -> dict[str, set[str]]:
    """``{module: {modules it imports}}`` over the project's modules (no self-edges)."""
    modules = _modules()
    return {name: {t for t in _imports(name, path, modules) if t != name} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None when the graph is acyclic (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path = [root]
        state[root] = 1
        stack = [iter(sorted(graph[root]))]
        while stack:
            target = next(stack[-1], None)
            if target is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(target) == 1:
                return [*path[path.index(target) :], target]
            elif target not in state:
                state[target] = 1
                path.append(target)
                stack.append(iter(sorted(graph.get(target, ()))))
    return None


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert "kb_retrieval.reporting" in graph["kb_retrieval.evaluation.report"]  # module level
    assert "sidecar.comparison" in graph["sidecar.compare"]  # inside a function
    assert "kb_retrieval.engine" in graph["sidecar.comparison"]  # under TYPE_CHECKING
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_every_allowed_edge_still_exists():
    graph = import_graph()
    stale = [f"{a} -> {b}" for a, b in ALLOWED if b not in graph.get(a, set())]
    assert stale == [], f"these imports are gone: delete their entries from ALLOWED in {Path(__file__).name}"


def test_no_import_cycles():
    graph = import_graph()
    for importer, imported in ALLOWED:
        graph[importer].discard(imported)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_core_never_imports_the_sidecar():
    offending = sorted(
        f"{importer} -> {imported}"
        for importer, targets in import_graph().items()
        if importer.split(".")[0] == "kb_retrieval"
        for imported in targets
        if imported.split(".")[0] == "sidecar" and (importer, imported) not in ALLOWED
    )
    assert offending == [], "the core knows the sidecar only through kb_retrieval.sidecar_protocol: " + "; ".join(
        offending
    )


def test_postprocessors_and_the_retriever_are_public_and_settings_is_deprecated():
    import kb_retrieval
    from kb_retrieval import (  # noqa: F401
        DocumentExpander,
        DocumentRanker,
        KBSettings,
        KnowledgeRetriever,
        RuleReranker,
        SourceDeduplicator,
    )

    with pytest.warns(DeprecationWarning, match="use kb_retrieval.KBSettings"):
        assert kb_retrieval.Settings is KBSettings
    import kb_retrieval.config

    with pytest.warns(DeprecationWarning, match="use KBSettings"):
        assert kb_retrieval.config.Settings is KBSettings
    # The project itself never goes through the deprecated name.
    code = """
import importlib, pkgutil, warnings
warnings.filterwarnings("error", message=r"kb_retrieval(\\.config)?\\.Settings is deprecated")
import kb_retrieval, sidecar
for pkg in (kb_retrieval, sidecar):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if not m.name.endswith(".__main__"):  # running a package's __main__ is running its command
            importlib.import_module(m.name)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
