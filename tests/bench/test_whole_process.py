"""A command's peak memory as its own, not the benchmarking process's (which a direct child's ``ru_maxrss`` shows)."""

from __future__ import annotations

import sys

import pytest

from kb_retrieval.bench.speed import whole_process

pytestmark = pytest.mark.unit
MIB = 1024 * 1024


def test_a_small_command_from_a_large_process_is_small() -> None:
    ballast = bytearray(300 * MIB)
    ballast[::4096] = b"\x01" * len(ballast[::4096])  # resident in this process
    wall_s, peak = whole_process([sys.executable, "-c", "pass"])
    assert 0 < peak < 100 and wall_s > 0
    # It measures the command's own peak: one that holds 200 MiB says so.
    _, big = whole_process(
        [sys.executable, "-c", "b = bytearray(200 * 1024 * 1024); b[::4096] = b'1' * len(b[::4096])"]
    )
    assert big > 200
    del ballast


def test_a_failing_command_is_an_error_naming_it() -> None:
    with pytest.raises(RuntimeError, match="exited with 3: boom"):
        whole_process([sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"])


def test_what_the_command_prints_can_be_kept(tmp_path) -> None:
    printed = tmp_path / "out.json"
    whole_process([sys.executable, "-c", "print('{\"seconds\": 1.5}')"], stdout=printed)
    assert printed.read_text() == '{"seconds": 1.5}\n'
