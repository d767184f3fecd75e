"""The trace store's writer threads: the order of a row's write and the answer of the lookup that made it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kb_retrieval.traces import writer as writer_module
from kb_retrieval.traces.writer import WRITE_AFTER_S, Job, RowWriter

pytestmark = pytest.mark.unit


def _written(monkeypatch: pytest.MonkeyPatch, *, detached: bool) -> tuple[list[float], list[float]]:
    """One row through a RowWriter: the sleeps its writer thread took before the write, and when the write began
    (both on a fake clock that moves only by those sleeps, so nothing here depends on the machine's speed)."""
    now = [100.0]
    slept: list[float] = []
    began: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(writer_module, "time", SimpleNamespace(monotonic=lambda: now[0], sleep=sleep))
    rows = RowWriter(lambda job: began.append(now[0]), lambda message, count=1: None, timeout_s=5.0)
    job = Job({"query": "etcd has no leader"}, detached=detached)
    assert rows.enqueue(job) and job.done.wait(10.0)
    rows.stop()
    return slept, began


def test_a_row_nobody_waits_for_is_written_after_its_lookup_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    # Written at once, the row's INSERT takes the GIL while the lookup's response is rendered and sent.
    slept, began = _written(monkeypatch, detached=True)
    assert slept == [pytest.approx(WRITE_AFTER_S)]
    assert began == [pytest.approx(100.0 + WRITE_AFTER_S)]


def test_a_row_a_caller_waits_for_is_written_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    slept, began = _written(monkeypatch, detached=False)
    assert slept == [] and began == [100.0]
