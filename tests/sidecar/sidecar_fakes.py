"""Fakes that pin down the sidecar's timing and failure logic beside the real pipeline (sample KB, Milvus Lite).

Imported as ``sidecar_fakes`` (pytest puts this folder on ``sys.path``). The main path stays real; only its
vector-store path can be slowed down (``SlowPath``), and only the sidecar's retriever is faked (slow, crashing,
hanging).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from kb_retrieval.retrieval.l1.sdk import SdkPath

# A query with no single L0 domain, so the main path makes exactly one (unfiltered) attempt.
QUERY = "How do I choose a garbage collector for a latency-sensitive JVM service?"
VOLATILE = {"elapsedMs", "stageMs", "traceRecorded"}


def stable(value: Any) -> Any:
    """A result's JSON without its timings, for comparing two lookups' results."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


class SlowPath:
    """The real SDK path, slowed down by ``delay`` seconds per search (a main path whose duration we control)."""

    name = "sdk"

    def __init__(self, inner: SdkPath, delay: float) -> None:
        self.inner = inner
        self.delay = delay

    def search(self, embedding: list[float], top_k: int, filter_expr: str | None, *args: Any, **kwargs: Any) -> Any:
        time.sleep(self.delay)
        return self.inner.search(embedding, top_k, filter_expr, *args, **kwargs)


class FakeRetriever(BaseRetriever):
    """A sidecar retriever that sleeps, raises, or blocks until released, then returns two chunks."""

    def __init__(self, sleep: float = 0.0, error: Exception | None = None, gate: threading.Event | None = None):
        super().__init__()
        self.sleep = sleep
        self.error = error
        self.gate = gate
        self.calls = 0

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self.calls += 1
        if self.gate is not None:
            self.gate.wait()
        time.sleep(self.sleep)
        if self.error is not None:
            raise self.error
        return [
            NodeWithScore(node=TextNode(text="a", metadata={"source": "jvm/gc.md", "category": "jvm"}), score=0.8),
            NodeWithScore(node=TextNode(text="b", metadata={"source": "jvm/gc.md", "category": "jvm"}), score=0.7),
            NodeWithScore(node=TextNode(text="c", metadata={"source": "jvm/heap.md", "category": "jvm"}), score=0.6),
        ]
