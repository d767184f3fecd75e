"""The writer threads of a trace store: a bounded queue of rows, a few daemon threads writing them, and the drain
that settles every accepted row at close and at the end of the process (written, or given up, logged and counted).

A row is a :class:`Job`: the store builds it, the writer queues it, a thread hands it to the store's ``write``, and
whoever waits for it (a lookup with ``wait=True``, :meth:`RowWriter.flush`) is told when it is settled.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Literal

#: A database that honours its own timeout reports its error within this margin of it; then the lookup moves on.
WAIT_MARGIN_S = 0.25
#: Background writer threads per store: writes to a hung database occupy them; later rows wait (bounded) in a queue.
WRITERS = 4
#: Rows a store holds for its writers at most (a few hundred KB); when full, a lookup waits up to ``timeout_s``.
QUEUE_ROWS = 1000


class Job:
    """One row on its way to the database, and what became of it. ``detached``: nobody waits for it, so the writer
    reports its failure."""

    def __init__(self, row: dict[str, Any], *, detached: bool) -> None:
        self.row = row
        self.detached = detached
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.state: Literal["queued", "writing", "committing", "abandoned"] = "queued"
        self.error: Exception | None = None


class RowWriter:
    """The queue and the writer threads of one store. ``write``: writes one job (the store's; it never raises);
    ``failed``: logs and counts lost rows (a message, how many); ``timeout_s``: how long a caller waits for room in
    the queue, and how long a drain waits for the database to take a row."""

    def __init__(
        self,
        write: Callable[[Job], None],
        failed: Callable[[str, int], None],
        *,
        timeout_s: float,
        queue_rows: int = QUEUE_ROWS,
    ) -> None:
        self._write = write
        self._failed = failed
        self.timeout_s = timeout_s
        self._lock = threading.Lock()  # guards the threads and the outstanding rows; never held on I/O
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=queue_rows)
        self._outstanding: set[Job] = set()  # accepted rows not yet written, failed or given up
        self._settled = 0  # rows settled so far: progress, while the queue drains
        self._threads: list[threading.Thread] = []
        _OPEN_WRITERS.add(self)  # rows still queued when the process ends are written then (or counted as lost)

    def enqueue(self, job: Job) -> bool:
        """Hand the row to the writers; when the queue stays full for ``timeout_s``, give it up (logged, counted)."""
        self._start()
        with self._lock:
            self._outstanding.add(job)
        try:
            self._jobs.put(job, timeout=self.timeout_s)
        except queue.Full:
            self.settle(job)
            self._failed(
                f"QueueFull: {self._jobs.maxsize} rows were already waiting for the trace database; this one was given "
                f"up after {self.timeout_s:g} s",
                1,
            )
            return False
        return True

    def settle(self, job: Job) -> None:
        """The row is written, failed or given up: nothing waits for it any more."""
        job.done.set()
        with self._lock:
            self._outstanding.discard(job)
            self._settled += 1

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every row accepted so far is written, failed or given up (at most ``timeout_s``, by default
        ``timeout_s`` + :data:`WAIT_MARGIN_S`); True when none is left waiting. Gives nothing up."""
        deadline = time.monotonic() + (self.timeout_s + WAIT_MARGIN_S if timeout_s is None else timeout_s)
        with self._lock:
            pending = list(self._outstanding)
        return all(job.done.wait(max(0.0, deadline - time.monotonic())) for job in pending)

    def give_up_pending(self, why: str) -> None:
        """Give up the rows still waiting (they are rolled back or never started, so they never land later), and log
        and count them; a row whose commit is under way is counted as in doubt."""
        with self._lock:
            pending = list(self._outstanding)
        lost = in_doubt = 0
        for job in pending:
            with job.lock:
                if job.done.is_set() or job.state == "abandoned":
                    continue
                if job.state == "committing":
                    in_doubt += 1
                    continue
                job.state = "abandoned"
            self.settle(job)
            lost += 1
        if lost:
            self._failed(f"TimeoutError: {lost} row(s) still waiting for the trace database {why}: given up", lost)
        if in_doubt:
            self._failed(f"TimeoutError: {in_doubt} commit(s) unanswered {why} (the rows may be recorded)", in_doubt)

    def drain(self, why: str) -> None:
        """Wait for the accepted rows while the database keeps taking them; once none has been settled for
        ``timeout_s`` + :data:`WAIT_MARGIN_S`, give up the rest (logged, counted)."""
        while True:
            settled = self._settled
            if self.flush():
                return
            if self._settled == settled:
                self.give_up_pending(f"{why} (none settled for {self.timeout_s + WAIT_MARGIN_S:g} s)")
                return

    def stop(self) -> None:
        """Stop the writer threads once idle (threads stuck on a hung database are daemons, left). They start again
        with the next row."""
        with self._lock:
            for _ in self._threads:
                with contextlib.suppress(queue.Full):
                    self._jobs.put_nowait(None)
            self._threads = []

    def _start(self) -> None:
        if self._threads:
            return
        with self._lock:
            while len(self._threads) < WRITERS:
                # Daemon threads: a write stuck on a hung database never keeps the process from exiting (rows still
                # queued at exit are written, or given up and counted, by the atexit hook below).
                thread = threading.Thread(target=self._run, name="kb-trace-writer", daemon=True)
                thread.start()
                self._threads.append(thread)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self._write(job)
            finally:
                self.settle(job)


_OPEN_WRITERS: weakref.WeakSet[RowWriter] = weakref.WeakSet()


@atexit.register
def _drain_open_writers() -> None:
    """At the end of the process (the writers are daemon threads), write the rows every store still holds, or, once
    its database takes none for ``timeout_s``, give them up, logged and counted: a lookup that returned before its
    row was written never loses it silently."""
    for writer in list(_OPEN_WRITERS):
        writer.drain("at the end of the process")
