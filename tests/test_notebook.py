"""``notebooks/exploration.ipynb`` runs top to bottom on the venv's own kernel, offline, and is committed clean."""

from __future__ import annotations

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


def test_notebook_is_committed_with_outputs_cleared():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code
    assert all(not cell.outputs and cell.execution_count is None for cell in code)


@pytest.mark.timeout(900)
def test_notebook_runs_top_to_bottom(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the kernel inherits the environment
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook,
        kernel_name=KERNEL,
        timeout=600,
        allow_errors=False,  # any cell error raises CellExecutionError and fails the test
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()

    setup = next(cell for cell in notebook.cells if "setup" in cell.metadata.get("tags", []))
    printed = "".join(output.get("text", "") for output in setup.outputs)
    assert f"prefix: {sys.prefix}\n" in printed, printed  # the kernel ran in this venv
    errors = [o for cell in notebook.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    images = [o for cell in notebook.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "the rerank contribution chart was not displayed"
