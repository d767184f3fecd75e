"""One process at a time teaches a state dir's ranking fit (``rank_teach.teaching_turn``): another process's turn is
an ``flock`` on a file opened apart, which conflicts with this process's own open as another process's would."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kb_retrieval.indexing.rank_teach import TeachingStopped, teaching_turn
from kb_retrieval.retrieval.rank_fit import RankFit, fit_path, store_fit

pytestmark = pytest.mark.unit
fcntl = pytest.importorskip("fcntl", reason="flock is POSIX: elsewhere each process teaches for itself")


def _fit(version: str) -> RankFit:
    return RankFit(version, {"title": 0.75}, 0.0, 1.0, 60, "fitted on 60 pseudo-queries")


def _held(state_dir: Path) -> object:
    """The teaching lock taken as another process would take it (its own open file)."""
    lock = fit_path(state_dir, "v1").with_name(".teaching.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock, "a+b")  # noqa: SIM115 - closed by the test
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return handle


def _enter(state_dir: Path, stop: threading.Event | None = None) -> tuple[threading.Thread, dict[str, object]]:
    seen: dict[str, object] = {}

    def run() -> None:
        try:
            with teaching_turn(state_dir, "v1", stop) as stored:
                seen["stored"] = stored
        except TeachingStopped as exc:
            seen["stopped"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, seen


def test_a_free_turn_is_taken_and_held_for_the_block(tmp_path: Path) -> None:
    with teaching_turn(tmp_path, "v1") as stored:
        assert stored is None  # nothing stored: teach
        with pytest.raises(BlockingIOError):
            _held(tmp_path)  # another process cannot teach meanwhile
    _held(tmp_path).close()  # let go after the block


def test_a_waiting_process_takes_the_fit_the_teaching_one_stored(tmp_path: Path) -> None:
    other = _held(tmp_path)
    thread, seen = _enter(tmp_path)
    thread.join(1.0)
    assert thread.is_alive() and not seen  # waits while the other teaches
    store_fit(tmp_path, _fit("v1"))
    thread.join(10)
    assert seen == {"stored": _fit("v1")}  # nothing left to teach
    other.close()


def test_a_turn_let_go_without_a_fit_passes_to_the_waiting_process(tmp_path: Path) -> None:
    other = _held(tmp_path)
    thread, seen = _enter(tmp_path)
    thread.join(0.6)
    assert thread.is_alive()
    other.close()  # the teaching process died or gave up: its flock is gone with its file
    thread.join(10)
    assert seen == {"stored": None}  # this one teaches


def test_a_lookup_closed_while_waiting_stops_waiting(tmp_path: Path) -> None:
    other = _held(tmp_path)
    stop = threading.Event()
    thread, seen = _enter(tmp_path, stop)
    thread.join(0.6)
    assert thread.is_alive()
    stop.set()
    thread.join(10)
    assert isinstance(seen.get("stopped"), TeachingStopped)
    other.close()


def test_fits_stored_at_once_by_several_writers_leave_one_whole_file(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def store_often() -> None:
        try:
            for _ in range(20):
                store_fit(tmp_path, _fit("v1"))
        except OSError as exc:  # a temporary file another writer renamed away
            errors.append(exc)

    threads = [threading.Thread(target=store_often) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(p.name for p in fit_path(tmp_path, "v1").parent.iterdir()) == ["v1.json"]
