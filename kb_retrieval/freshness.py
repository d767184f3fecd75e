"""The freshness check of a long-lived lookup, off the request path.

A ``KnowledgeLookup`` checks the index version at most every ``freshness_check_s`` and reloads its state when another
process ingested. The check (one Milvus call) and the reload (several) run on a thread of their own, so a hung or
restarting Milvus never holds a lookup past its deadline: the lookup that starts a check waits for it at most
:data:`WAIT_SHARE` of what is left of its deadline, then goes on with the state it has (its search then meets the
outage, within the deadline, and says so); other lookups never wait for a check in flight. One check at a time: while
one is stuck on a frozen server, no other piles up behind it.

Example:
    >>> check = FreshnessCheck(lambda force: True, interval_s=0)
    >>> check.run(deadline=Deadline.after(5.0))
    True
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kb_retrieval.retrieval.deadline import Deadline

log = logging.getLogger(__name__)

#: The share of a lookup's remaining deadline it waits for the check it started (the rest is for its search).
WAIT_SHARE = 0.5


class FreshnessCheck:
    """Runs ``check(force)`` (True when it reloaded) at most every ``interval_s``, on a daemon thread, one at a time."""

    def __init__(self, check: Callable[[bool], bool], interval_s: float) -> None:
        self._check = check
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._checked_at = time.monotonic()  # the state was just read
        self._running: _Run | None = None

    @property
    def in_flight(self) -> bool:
        """True while a check started earlier has not finished (e.g. stuck on a frozen server)."""
        running = self._running
        return running is not None and not running.done.is_set()

    def run(self, *, deadline: Deadline | None = None, force: bool = False) -> bool:
        """Start a check when one is due (``force``: now, and wait for it whole); True when it reloaded in time.

        Without ``force`` the caller waits at most :data:`WAIT_SHARE` of what is left of ``deadline`` (no deadline:
        until the check ends); a check already in flight is not waited for.
        """
        with self._lock:
            if not force and (self.in_flight or time.monotonic() - self._checked_at < self.interval_s):
                return False
            self._checked_at = time.monotonic()
            run = _Run(self._check, force)
            self._running = run
        wait_s = None if force or deadline is None else deadline.remaining() * WAIT_SHARE
        if not run.done.wait(wait_s):
            log.warning(
                "the index-version check did not finish within %.2f s: the lookup goes on with its state", wait_s
            )
            return False
        return run.reloaded


class _Run:
    """One check on its own daemon thread (a check stuck on a hung server never keeps the process from exiting)."""

    def __init__(self, check: Callable[[bool], bool], force: bool) -> None:
        self.done = threading.Event()
        self.reloaded = False
        self._check = check
        self._force = force
        threading.Thread(target=self._work, name="kb-freshness-check", daemon=True).start()

    def _work(self) -> None:
        try:
            self.reloaded = self._check(self._force)
        except Exception as exc:  # the check logs its own failures; this is a bug's last line
            log.warning("the index-version check failed: %s", exc)
        finally:
            self.done.set()
