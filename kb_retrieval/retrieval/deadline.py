"""One deadline per lookup: every Milvus call gets what is left of it, capped by its own timeout.

Example:
    >>> d = Deadline.after(5.0)
    >>> 0 < d.timeout(cap=2.0) <= 2.0
    True
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass
from typing import TypeVar

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
