"""The ``auto`` path: the vectorstore path first; the sdk path when it is unavailable or raises.

When both fail, the error raised names both failures, so the attempt's trace says why each path did not serve.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kb_retrieval.retrieval.deadline import MIN_CALL_S, DeadlineExceededError
from kb_retrieval.retrieval.l1.base import FetchPath, HybridPath, HybridRequest, L1Search, VectorPath

log = logging.getLogger(__name__)

P = TypeVar("P", bound=VectorPath)


class AllPathsFailedError(RuntimeError):
    """Both the preferred and the fallback path failed; the message names each failure."""


class AutoPath:
    """The preferred path, and the fallback when it fails (the fallback given what is left of the timeout).

    It has a feature beside the dense search (a hybrid search, a read by key with vectors) when both of its paths
    have it: each pair is typed once, here, and a call for a feature they lack is a ``TypeError``
    (:class:`~kb_retrieval.retrieval.l1.retriever.PathFeatures` finds the same with :func:`.base.supports`, so the
    pipeline never makes one)."""

    name = "auto"

    def __init__(self, preferred: VectorPath, fallback: VectorPath) -> None:
        self.preferred = preferred
        self.fallback = fallback
        self._hybrid: tuple[HybridPath, HybridPath] | None = None
        if isinstance(preferred, HybridPath) and isinstance(fallback, HybridPath):
            self._hybrid = (preferred, fallback)
        self._fetch: tuple[FetchPath, FetchPath] | None = None
        if isinstance(preferred, FetchPath) and isinstance(fallback, FetchPath):
            self._fetch = (preferred, fallback)

    def paths(self) -> tuple[VectorPath, VectorPath]:
        """The preferred path and the fallback (a feature is auto's when both have it)."""
        return self.preferred, self.fallback

    def search(
        self, embedding: list[float], top_k: int, filter_expr: str | None, timeout: float | None = None
    ) -> L1Search:
        """The dense search on the preferred path, else on the fallback."""
        return self._serve(self.paths(), lambda path, left: path.search(embedding, top_k, filter_expr, left), timeout)

    def hybrid_search(self, request: HybridRequest, timeout: float | None = None) -> L1Search:
        """The hybrid search on the preferred path, else on the fallback (both must have it: ``supports_hybrid``)."""
        pair = _both(self._hybrid, "a hybrid search")
        return self._serve(pair, lambda path, left: path.hybrid_search(request, left), timeout)

    def fetch(
        self, embedding: list[float], filter_expr: str, timeout: float | None = None
    ) -> tuple[L1Search, dict[str, Any]]:
        """The chunks ``filter_expr`` selects, read by key on the preferred path, else on the fallback; with the
        vectors read."""
        vectors: dict[str, Any] = {}

        def call(path: FetchPath, left: float | None) -> L1Search:
            found, read = path.fetch(embedding, filter_expr, left)
            vectors.update(read)
            return found

        return self._serve(_both(self._fetch, "a read by key"), call, timeout), vectors

    def _serve(self, pair: tuple[P, P], call: Callable[[P, float | None], L1Search], timeout: float | None) -> L1Search:
        preferred, fallback = pair
        started = time.monotonic()
        try:
            return call(preferred, timeout)
        except Exception as exc:
            reason = f"{preferred.name} failed: {type(exc).__name__}: {_first_line(exc)}"
            log.warning("auto mode falling back to %s: %s", fallback.name, reason)
        left = None if timeout is None else timeout - (time.monotonic() - started)
        try:
            if left is not None and left < MIN_CALL_S:
                raise DeadlineExceededError("no time left for the fallback path (lookup_timeout_s)")
            result = call(fallback, left)
        except Exception as exc:
            # Both halves short enough to survive the 500 characters the attempt's trace keeps of an error.
            raise AllPathsFailedError(
                f"{reason[:230]}; {fallback.name} failed: {type(exc).__name__}: {_first_line(exc)[:200]}"
            ) from exc
        result.path_fallback_reason = reason
        return result


def _both(pair: tuple[P, P] | None, feature: str) -> tuple[P, P]:
    """``pair``, the two paths typed for a feature; a ``TypeError`` when one of them lacks it."""
    if pair is None:
        raise TypeError(f"auto: one of its paths has no {feature}")
    return pair


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
