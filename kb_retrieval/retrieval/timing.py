"""Stage timings: the wall time of named stages, added up per lookup (``LookupResult.stage_ms``)."""

from __future__ import annotations

import time


class StageClock:
    """``with clock("search"): ...`` adds the block's milliseconds to ``stage_ms["search"]`` (a stage may repeat).

    Example:
        >>> ms: dict[str, float] = {}
        >>> with StageClock(ms)("embed"):
        ...     pass
        >>> list(ms)
        ['embed']
    """

    def __init__(self, stage_ms: dict[str, float] | None = None) -> None:
        self.stage_ms = stage_ms if stage_ms is not None else {}
        self._name = ""
        self._t0 = 0.0

    def __call__(self, name: str) -> StageClock:
        self._name = name
        return self

    def __enter__(self) -> None:
        self._t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        elapsed = (time.perf_counter() - self._t0) * 1000
        self.stage_ms[self._name] = round(self.stage_ms.get(self._name, 0.0) + elapsed, 3)
