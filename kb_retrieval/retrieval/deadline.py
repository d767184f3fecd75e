"""One deadline per lookup: every Milvus call gets what is left of it, capped by its own timeout.

Example:
    >>> d = Deadline.after(5.0)
    >>> 0 < d.timeout(cap=2.0) <= 2.0
    True
"""

from __future__ import annotations

import time
from dataclasses import dataclass

#: The least a call is given: a call started with less would fail on its own overhead.
MIN_CALL_S = 0.05


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
