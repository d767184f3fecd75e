"""OnThread: the call runs on another thread, its value or its exception reaches the caller of ``result``."""

from __future__ import annotations

import threading

import pytest

from kb_retrieval.on_thread import OnThread


def test_the_call_runs_on_a_thread_of_its_own() -> None:
    release = threading.Event()

    def wait_then_name() -> str:
        assert release.wait(timeout=60)
        return threading.current_thread().name

    running = OnThread(wait_then_name, name="kb-test-loader")
    release.set()  # the constructor returned while the call was still waiting: it did not run here
    assert running.result() == "kb-test-loader"
    assert running.result() == "kb-test-loader"  # asked again, the same value


def test_its_exception_is_raised_by_result() -> None:
    def fail(message: str) -> None:
        raise ValueError(message)

    running = OnThread(fail, "no model", name="kb-test-loader")
    with pytest.raises(ValueError, match="no model"):
        running.result()
