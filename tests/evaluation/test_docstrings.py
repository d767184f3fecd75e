"""The examples in the package's docstrings run and give what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

pytestmark = pytest.mark.unit

#: The modules with examples in their docstrings (``report`` and ``runner`` have none: nothing of theirs would run).
MODULES = ["errors", "golden", "fixtures", "hit_levels", "metrics", "traffic", "traffic_command"]


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(f"kb_retrieval.evaluation.{module}"), verbose=False)

    assert result.attempted > 0, f"kb_retrieval.evaluation.{module} has no docstring example: nothing ran"
    assert result.failed == 0
