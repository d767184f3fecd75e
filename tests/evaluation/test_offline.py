"""The evaluator must run with the runtime stack absent: no Milvus client, no model, no database, no network; and
without the development extras: ranx (the metrics are ours) and matplotlib (the charts are skipped with a note)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import kb_retrieval.evaluation
from kb_retrieval.reporting import NO_MATPLOTLIB_NOTE

HEAVY = ("pymilvus", "milvus_lite", "llama_index", "torch", "transformers", "sentence_transformers", "sqlalchemy")
DEV_ONLY = ("ranx", "numba", "matplotlib")
BLOCKED = HEAVY + DEV_ONLY
PACKAGE = Path(kb_retrieval.evaluation.__file__).parent
ATOMIC = PACKAGE.parent / "atomic.py"

# Installed before anything else is imported: importing a heavy package raises, and so does any connection.
BLOCKER = textwrap.dedent(
    f"""
    import socket, sys

    HEAVY = {BLOCKED!r}
    assert not [name for name in sys.modules if name.split(".")[0] in HEAVY], "already imported"

    class BlockHeavyImports:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HEAVY:
                raise ImportError(f"blocked by test: {{name}}")
            return None

    sys.meta_path.insert(0, BlockHeavyImports())

    def no_network(*args, **kwargs):
        raise OSError("network blocked by test")

    socket.socket.connect = no_network
    socket.socket.connect_ex = no_network
    socket.create_connection = no_network

    for name in HEAVY:  # the blocker works
        try:
            __import__(name)
        except ImportError:
            pass
        else:
            raise SystemExit(f"{{name}} was importable")

    import runpy
    sys.argv = ["python -m kb_retrieval.evaluation", *sys.argv[1:]]
    try:
        runpy.run_module("kb_retrieval.evaluation", run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        code = exit.code
    else:
        code = 0
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in HEAVY)
    print("heavy modules loaded:", loaded)
    sys.exit(code)
    """
)


def test_evaluator_runs_with_heavy_packages_and_network_blocked(
    golden_path: Path, fixtures_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            BLOCKER,
            "--golden",
            str(golden_path),
            "--fixtures",
            str(fixtures_dir),
            "--out",
            str(out),
            "--fail-under",
            "recall@3=0.6",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr
    assert "heavy modules loaded: []" in completed.stdout
    assert (out / "golden.json").is_file()
    markdown = (out / "golden.md").read_text(encoding="utf-8")
    assert markdown.startswith("# Retrieval evaluation: golden\n")
    # Without matplotlib: one line in the report and on the terminal, no chart files, no links to missing files.
    assert f"_{NO_MATPLOTLIB_NOTE}._" in markdown.replace("\\_", "_")
    assert NO_MATPLOTLIB_NOTE in completed.stdout
    assert "![" not in markdown
    assert sorted(path.name for path in out.iterdir()) == ["golden.json", "golden.md"]


# The fixture recorder and the traffic replay are the bridges to the live pipeline: they may import the runtime, but
# only lazily (inside functions or under TYPE_CHECKING), so importing kb_retrieval.evaluation stays light.
RUNTIME_BRIDGES = {"recorder.py", "traffic.py", "traffic_command.py"}


def _imported_names(tree: ast.AST, module_level_only: bool) -> list[str]:
    nodes = ast.iter_child_nodes(tree) if module_level_only else ast.walk(tree)
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_package_imports_only_the_standard_library_pydantic_the_report_helpers_and_itself() -> None:
    allowed_roots = set(sys.stdlib_module_names) | {"pydantic"}
    offending = []
    # The atomic write is read too: the package may use it because it imports the standard library only.
    for path in [*sorted(PACKAGE.rglob("*.py")), ATOMIC]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name in _imported_names(tree, module_level_only=path.name in RUNTIME_BRIDGES):
            inside = name == "kb_retrieval.evaluation" or name.startswith("kb_retrieval.evaluation.")
            # the shared report helpers (matplotlib only to draw), CLI argument types (settings, no services) and
            # the atomic write of the recorded fixtures
            inside = inside or name in {"kb_retrieval.reporting", "kb_retrieval.cli_args", "kb_retrieval.atomic"}
            if not inside and name.split(".")[0] not in allowed_roots:
                offending.append(f"{path.name}: {name}")

    assert offending == []
