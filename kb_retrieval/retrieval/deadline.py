"""One deadline per lookup: every Milvus call gets what is left of it, capped by its own timeout.

A call a lookup must not wait for past its deadline runs on a worker (:class:`Workers`, one pool per purpose:
:data:`SEARCHES`, :data:`DENSE_BESIDE`) and is waited for until the deadline and :data:`DEADLINE_GRACE_S`.

Example:
    >>> d = Deadline.after(5.0)
    >>> 0 < d.timeout(cap=2.0) <= 2.0
    True
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

#: The least a call is given: a call started with less would fail on its own overhead.
MIN_CALL_S = 0.05
#: What a lookup waiting for a call on another thread gives it beyond its deadline (the call's own timeout normally
#: ends it first).
DEADLINE_GRACE_S = 0.2


class DeadlineExceededError(TimeoutError):
    """The lookup's deadline passed before a stage could start."""


@dataclass(frozen=True)
class Deadline:
    """The moment a lookup must answer by (``time.monotonic()``), and what is left of it for a call."""

    ends_at: float  # time.monotonic()

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def remaining(self) -> float:
        return max(0.0, self.ends_at - time.monotonic())

    @property
    def expired(self) -> bool:
        return self.remaining() < MIN_CALL_S

    def timeout(self, cap: float) -> float:
        """Seconds a call may take: what is left, at most ``cap``; raises when too little is left to start one."""
        left = self.remaining()
        if left < MIN_CALL_S:
            raise DeadlineExceededError("the lookup's deadline (lookup_timeout_s) passed")
        return min(cap, left)


def wait_until(future: concurrent.futures.Future[T], deadline: Deadline) -> T:
    """The result of ``future`` (a Milvus call on a worker thread), waited for until ``deadline`` and
    :data:`DEADLINE_GRACE_S`; then :class:`DeadlineExceededError` (the call is left to finish on its worker: pymilvus'
    reconnect after a server restart ignores the call's own timeout)."""
    try:
        return future.result(timeout=deadline.remaining() + DEADLINE_GRACE_S)
    except concurrent.futures.TimeoutError:
        raise DeadlineExceededError("the lookup's deadline passed during the Milvus search") from None


class Workers:
    """One thread pool for one purpose: each call runs in a copy of the caller's context (its spans and events stay
    the lookup's) and is waited for until the lookup's deadline (:func:`wait_until`)."""

    def __init__(self, name: str, max_workers: int = 8) -> None:
        self.name = name
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        """``fn(*args, **kwargs)`` on a worker, in a copy of this thread's context."""
        return self._pool.submit(contextvars.copy_context().run, fn, *args, **kwargs)

    @staticmethod
    def wait(future: concurrent.futures.Future[T], deadline: Deadline) -> T:
        """:func:`wait_until`."""
        return wait_until(future, deadline)


#: An attempt's search in Milvus (a call held past the deadline is left to finish here).
SEARCHES = Workers("kb-milvus-search")
#: The dense search sent beside a read by key (in-process BM25 on the milvus plan). Its own pool: the caller already
#: runs on a worker of :data:`SEARCHES`, which must not wait on itself.
DENSE_BESIDE = Workers("kb-milvus-dense")
