"""The ``auto`` path: the vectorstore path first; the sdk path when it is unavailable or raises."""

from __future__ import annotations

import logging

from kb_retrieval.retrieval.l1.base import L1Search, VectorPath

log = logging.getLogger(__name__)


class AutoPath:
    name = "auto"

    def __init__(self, preferred: VectorPath, fallback: VectorPath) -> None:
        self.preferred = preferred
        self.fallback = fallback

    def search(self, embedding: list[float], top_k: int, filter_expr: str | None) -> L1Search:
        try:
            return self.preferred.search(embedding, top_k, filter_expr)
        except Exception as exc:
            reason = f"{self.preferred.name} failed: {type(exc).__name__}: {_first_line(exc)}"
            log.warning("auto mode falling back to %s: %s", self.fallback.name, reason)
        result = self.fallback.search(embedding, top_k, filter_expr)
        result.path_fallback_reason = reason
        return result


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
