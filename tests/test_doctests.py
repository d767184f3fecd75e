"""The examples in the package's docstrings run and give what they show: every module of ``kb_retrieval``, one test
each, found by walking the package (a new module is covered without being listed here).

An example that needs what a unit test has not (a Milvus server, a built lookup, a network) says so with
``# doctest: +SKIP``; everything else runs. The runner cannot pass with nothing run: the examples attempted over the
package must be many, and the modules whose examples document their rule must each keep some.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from functools import cache

import pytest

import kb_retrieval

pytestmark = pytest.mark.unit

#: Modules not imported here: running them is their work (``python -m``).
SKIPPED = ("__main__",)
#: Modules whose examples are how their rule is documented (each had its own doctest runner before this file): an
#: example removed from one of them fails here, not silently.
DOCUMENTED_BY_EXAMPLES = (
    "kb_retrieval.display",
    "kb_retrieval.evaluation.errors",
    "kb_retrieval.evaluation.fixtures",
    "kb_retrieval.evaluation.golden",
    "kb_retrieval.evaluation.hit_levels",
    "kb_retrieval.evaluation.metrics",
    "kb_retrieval.evaluation.traffic",
    "kb_retrieval.evaluation.traffic_command",
    "kb_retrieval.knowledge.chunker",
    "kb_retrieval.overrides",
    "kb_retrieval.retrieval.filters",
    "kb_retrieval.retrieval.scores",
    "kb_retrieval.retrieval.short_names",
    "kb_retrieval.terminal",
)
#: Fewer examples than this over the whole package means the walk or the finder lost most of them (147 when written).
MIN_ATTEMPTED = 100


def _not_importable(name: str) -> None:
    raise ImportError(f"{name} cannot be imported: its docstring examples cannot be found")


def package_modules() -> list[str]:
    """Every module of ``kb_retrieval`` (the package itself first), ``__main__`` modules left out."""
    walked = pkgutil.walk_packages(kb_retrieval.__path__, "kb_retrieval.", onerror=_not_importable)
    return ["kb_retrieval", *sorted(m.name for m in walked if m.name.rsplit(".", 1)[-1] not in SKIPPED)]


MODULES = package_modules()


@cache
def run_examples(name: str) -> tuple[int, tuple[str, ...]]:
    """Run the module's docstring examples: (examples attempted, the report of each failed one)."""
    module = importlib.import_module(name)
    try:
        tests = doctest.DocTestFinder(exclude_empty=True).find(module, name)
    except ValueError as exc:  # a docstring doctest cannot parse (e.g. inconsistent indentation)
        return 0, (f"{name}: {exc}",)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS, verbose=False)
    attempted, failures = 0, []
    for test in sorted(tests, key=lambda t: t.name):
        report: list[str] = []
        result = runner.run(test, out=report.append)
        attempted += result.attempted
        if result.failed:
            failures.append(f"{test.name} ({result.failed} of {result.attempted} failed):\n{''.join(report)}")
    return attempted, tuple(failures)


@pytest.mark.parametrize("name", MODULES)
def test_the_docstring_examples_give_what_they_show(name: str) -> None:
    _, failures = run_examples(name)
    assert not failures, f"{name}: {len(failures)} docstring example(s) failed\n" + "\n".join(failures)


def test_the_examples_were_found_and_run() -> None:
    attempted = {name: run_examples(name)[0] for name in MODULES}
    assert set(DOCUMENTED_BY_EXAMPLES) <= set(MODULES), set(DOCUMENTED_BY_EXAMPLES) - set(MODULES)
    bare = [name for name in DOCUMENTED_BY_EXAMPLES if attempted[name] == 0]
    assert not bare, f"no docstring example ran in {bare}"
    total = sum(attempted.values())
    assert total >= MIN_ATTEMPTED, f"{total} examples attempted over {len(MODULES)} modules"
