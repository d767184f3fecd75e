"""docs/bring-your-own-data.md: every ```python block runs as written, in order, from a fresh working folder, and
prints what the page says it prints."""

from __future__ import annotations

import contextlib
import io

import pytest

from tests.conftest import REPO
from tests.test_readme import python_blocks

PAGE = REPO / "docs" / "bring-your-own-data.md"
BLOCKS = python_blocks(PAGE.read_text(encoding="utf-8"))

pytestmark = pytest.mark.timeout(900)


def test_the_page_has_the_simple_directory_reader_example() -> None:
    assert len(BLOCKS) == 2 and "SimpleDirectoryReader(" in BLOCKS[0] and ".load_data()" in BLOCKS[0]


def test_every_python_block_runs_as_written(tmp_path, monkeypatch, embed_model) -> None:
    monkeypatch.chdir(tmp_path)
    printed = []
    for number, code in enumerate(BLOCKS, 1):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"{PAGE.name} block {number}", "exec"), {"__name__": f"byod_block_{number}"})
        printed.append(out.getvalue())
    reader, pipeline = printed
    assert reader.splitlines()[0] == "web/nginx-502.html | Nginx 502 Bad Gateway"
    assert "[1] source: kafka-lag.txt" in reader
    assert pipeline.strip() == "['Disk full > Check', 'Disk full > Fix']"
