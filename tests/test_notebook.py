"""``notebooks/exploration.ipynb`` runs top to bottom on the venv's own kernel, offline, and is committed clean.

It is run twice on one state directory, its parameters injected the way papermill does it (a cell tagged
``injected-parameters`` after the cell tagged ``parameters``): the first run ingests the sample KB, the second, given
no state dir, reuses that state as the demo's and embeds nothing. Plots are shown inline, the rerank chart's stacked
totals are the evidence scores, and no progress-bar warning reaches the outputs. The first result is displayed as
its evidence table.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "exploration.ipynb"
# The venv's own kernelspec (.venv/share/jupyter/kernels/python3, argv "python"): jupyter_client runs a bare
# "python" as the interpreter of the client, i.e. this venv's python. The run below checks the kernel's sys.prefix.
KERNEL = "python3"
INGEST = re.compile(
    r"documents: (?P<documents>\d+) \(added (?P<added>\d+), updated (?P<updated>\d+), "
    r"unchanged (?P<unchanged>\d+), removed (?P<removed>\d+)\)\nchunks embedded: (?P<embedded>\d+) in "
)


def _tagged(notebook: nbformat.NotebookNode, tag: str) -> nbformat.NotebookNode:
    return next(cell for cell in notebook.cells if tag in cell.metadata.get("tags", []))


def _text(cell: nbformat.NotebookNode) -> str:
    return "".join(output.get("text", "") for output in cell.get("outputs", []))


def test_notebook_is_committed_with_outputs_cleared():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code
    assert all(not cell.outputs and cell.execution_count is None for cell in code)


def test_notebook_has_a_parameters_cell_and_keeps_its_state():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    parameters = _tagged(notebook, "parameters")
    assert notebook.cells.index(parameters) == 1  # first code cell, before anything uses the values
    assigned = {line.split(":")[0].split("=")[0].strip() for line in parameters.source.splitlines() if "=" in line}
    assert {"KB_DIRS", "STATE_DIR", "QUESTIONS", "GOLDEN"} <= assigned
    source = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    assert "savefig" not in source and 'use("Agg")' not in source  # plots inline, not written to files
    assert "rmtree" not in source and "mkdtemp" not in source  # the state dir is reused, never thrown away


def _run(notebook_path: Path, parameters: str) -> nbformat.NotebookNode:
    notebook = nbformat.read(notebook_path, as_version=4)
    index = notebook.cells.index(_tagged(notebook, "parameters"))
    injected = nbformat.v4.new_code_cell(parameters, metadata={"tags": ["injected-parameters"]})
    notebook.cells.insert(index + 1, injected)
    client = NotebookClient(
        notebook,
        kernel_name=KERNEL,
        timeout=600,
        allow_errors=False,  # any cell error raises CellExecutionError and fails the test
        resources={"metadata": {"path": str(notebook_path.parent)}},
    )
    client.execute()
    return notebook


@pytest.mark.timeout(900)
def test_notebook_runs_top_to_bottom_and_a_rerun_skips_unchanged_documents(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the kernel inherits the environment
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.delenv("MPLBACKEND", raising=False)
    state = tmp_path / "state"
    before = sorted(NOTEBOOK.parent.iterdir())

    # The second run is given no state dir: it finds the first run's state as the demo's and reuses it.
    runs = [
        _run(NOTEBOOK, f"STATE_DIR = {str(state)!r}"),
        _run(NOTEBOOK, f"STATE_DIR = None\nDEMO_STATE_DIR = {str(state)!r}"),
    ]
    assert "(the demo's, reused: nothing to embed again)" in _text(_tagged(runs[1], "ingest"))

    first, second = (INGEST.search(_text(_tagged(run, "ingest"))) for run in runs)
    assert first and second, _text(_tagged(runs[0], "ingest"))
    assert int(first["documents"]) > 20 and first["added"] == first["documents"] and int(first["embedded"]) > 100
    assert second["unchanged"] == second["documents"] == first["documents"]
    assert (second["added"], second["updated"], second["removed"], second["embedded"]) == ("0", "0", "0", "0")

    for run in runs:
        setup = _text(_tagged(run, "setup"))
        assert f"prefix: {sys.prefix}\n" in setup, setup  # the kernel ran in this venv
        outputs = [output for cell in run.cells for output in cell.get("outputs", [])]
        assert [o for o in outputs if o.get("output_type") == "error"] == []
        assert not [o for o in outputs if "TqdmWarning" in o.get("text", "")]
        assert not [o for o in outputs if o.get("name") == "stderr"], [o["text"] for o in outputs if "text" in o]
        images = [o for o in outputs if "image/png" in o.get("data", {})]
        assert images, "the rerank contribution chart was not shown inline"
        chart = _tagged(run, "rerank-chart")
        assert any("image/png" in o.get("data", {}) for o in chart.outputs)
        drawn = json.loads(_text(chart).strip().splitlines()[-1])
        # The stacked bars add up to the evidence table's scores, block by block in the evidence's order.
        assert len(drawn["stacked_totals"]) == len(drawn["evidence_scores"]) >= 2
        assert drawn["stacked_totals"] == pytest.approx(drawn["evidence_scores"], abs=2e-4)
        # The first result, evaluated in a cell, shows as its evidence table (HTML), not a pydantic repr.
        shown = [o["data"] for o in _tagged(run, "result").outputs if "text/html" in o.get("data", {})]
        assert shown, _tagged(run, "result").outputs
        page = shown[0]["text/html"]
        assert "evidence document(s)" in page and "<th>in pack</th>" in page and "<details>" in page
        assert shown[0]["text/plain"].startswith("<LookupResult found=True")
    assert not list(state.rglob("*.png")) and sorted(NOTEBOOK.parent.iterdir()) == before  # no chart files


def test_readme_says_how_to_open_the_notebook_and_set_its_parameters():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### The notebook") :]
    assert ".venv/bin/jupyter lab notebooks/exploration.ipynb" in section
    assert "pip install jupyterlab" in section
    assert all(name in section for name in ("`parameters`", "`KB_DIRS`", "`STATE_DIR`"))
