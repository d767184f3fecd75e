"""The ``auto`` path: the vectorstore path first; the sdk path when it is unavailable or raises.

When both fail, the error raised names both failures, so the attempt's trace says why each path did not serve.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kb_retrieval.retrieval.deadline import MIN_CALL_S, DeadlineExceededError
from kb_retrieval.retrieval.l1.base import HybridRequest, L1Search, VectorPath

log = logging.getLogger(__name__)


class AllPathsFailedError(RuntimeError):
    """Both the preferred and the fallback path failed; the message names each failure."""


class AutoPath:
    """The preferred path, and the fallback when it fails (the fallback given what is left of the timeout)."""

    name = "auto"

    def __init__(self, preferred: VectorPath, fallback: VectorPath) -> None:
        self.preferred = preferred
        self.fallback = fallback

    def paths(self) -> tuple[VectorPath, VectorPath]:
        """The preferred path and the fallback (a feature is auto's when both have it)."""
        return self.preferred, self.fallback

    def search(
        self, embedding: list[float], top_k: int, filter_expr: str | None, timeout: float | None = None
    ) -> L1Search:
        return self._serve(lambda path, left: path.search(embedding, top_k, filter_expr, left), timeout)

    def hybrid_search(self, request: HybridRequest, timeout: float | None = None) -> L1Search:
        """The hybrid search on the preferred path, else on the fallback (both must have it: ``supports_hybrid``)."""

        return self._serve(lambda path, left: path.hybrid_search(request, left), timeout)

    def fetch(self, embedding: list[float], filter_expr: str, timeout: float | None = None) -> tuple[L1Search, Any]:
        """The chunks ``filter_expr`` selects, read by key on the preferred path, else on the fallback; with the
        vectors read."""
        vectors: dict[str, Any] = {}

        def call(path: Any, left: float | None) -> L1Search:
            found, read = path.fetch(embedding, filter_expr, left)
            vectors.update(read)
            return found

        return self._serve(call, timeout), vectors

    def _serve(self, call: Callable[[Any, float | None], L1Search], timeout: float | None) -> L1Search:
        started = time.monotonic()
        try:
            return call(self.preferred, timeout)
        except Exception as exc:
            reason = f"{self.preferred.name} failed: {type(exc).__name__}: {_first_line(exc)}"
            log.warning("auto mode falling back to %s: %s", self.fallback.name, reason)
        left = None if timeout is None else timeout - (time.monotonic() - started)
        try:
            if left is not None and left < MIN_CALL_S:
                raise DeadlineExceededError("no time left for the fallback path (lookup_timeout_s)")
            result = call(self.fallback, left)
        except Exception as exc:
            # Both halves short enough to survive the 500 characters the attempt's trace keeps of an error.
            raise AllPathsFailedError(
                f"{reason[:230]}; {self.fallback.name} failed: {type(exc).__name__}: {_first_line(exc)[:200]}"
            ) from exc
        result.path_fallback_reason = reason
        return result


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
