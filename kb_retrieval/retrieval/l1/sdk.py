"""The ``sdk`` path: ``pymilvus.MilvusClient.search`` directly.

Every search carries a deadline (``milvus_search_timeout_s``, pymilvus' retries included), so a hung or restarting
server fails the attempt in bounded time. Reconnecting is pymilvus' own: its connection manager resets the channel
on UNAVAILABLE, so the same client serves again once the server is back (tests/reliability show both).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from llama_index.core.instrumentation import get_dispatcher
from pymilvus import MilvusClient

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.milvus import search_params
from kb_retrieval.models import Candidate
from kb_retrieval.retrieval.l1.base import HybridRequest, L1Search, one_version_per_source, output_fields, to_candidate
from kb_retrieval.retrieval.l1.full_text import fetched_and_scored, milvus_hybrid_search

dispatcher = get_dispatcher(__name__)


class SdkPath:
    """Dense search through ``MilvusClient.search``."""

    name = "sdk"

    def __init__(self, client: MilvusClient, settings: KBSettings) -> None:
        self.client = client
        self.settings = settings
        self._fields = output_fields(settings)

    @dispatcher.span
    def search(
        self, embedding: list[float], top_k: int, filter_expr: str | None, timeout: float | None = None
    ) -> L1Search:
        hits = self.client.search(
            self.settings.storage.collection,
            data=[embedding],
            limit=top_k,
            filter=filter_expr or "",
            output_fields=self._fields,
            anns_field=self.settings.schema_fields.vector_field,
            search_params=search_params(self.settings, top_k),  # the metric, and the index's breadth (HNSW ef)
            timeout=self.settings.storage.milvus_search_timeout_s if timeout is None else timeout,
        )[0]
        candidates = [
            to_candidate(
                self.settings,
                chunk_id=hit["id"],
                raw_score=hit["distance"],
                fields=hit["entity"],
                content=hit["entity"].get(self.settings.schema_fields.content_field, ""),
                path="sdk",
            )
            for hit in hits
        ]
        return L1Search(candidates=one_version_per_source(candidates), path="sdk")

    @dispatcher.span
    def search_ids(
        self, embedding: list[float], top_k: int, filter_expr: str | None, timeout: float | None = None
    ) -> list[tuple[str, float]]:
        """The hits' ids and raw scores only, best first: no field is read or sent back."""
        return _ids_and_scores(self.client.search(**self._ids_request(embedding, top_k, filter_expr, timeout))[0])

    def send_ids(
        self, embedding: list[float], top_k: int, filter_expr: str | None, timeout: float | None = None
    ) -> Callable[[], list[tuple[str, float]]]:
        """:meth:`search_ids` sent now and answered later: the request leaves before this returns (gRPC's own
        future, no thread of ours), and the call returned waits for the answer, at most ``timeout`` (the request's
        gRPC deadline). The same request, so the same hits."""
        request = self._ids_request(embedding, top_k, filter_expr, timeout)
        future = self.client.search(**request, _async=True)
        return lambda: _ids_and_scores(future.result()[0])

    def _ids_request(
        self, embedding: list[float], top_k: int, filter_expr: str | None, timeout: float | None
    ) -> dict[str, Any]:
        return {
            "collection_name": self.settings.storage.collection,
            "data": [embedding],
            "limit": top_k,
            "filter": filter_expr or "",
            "output_fields": [],
            "anns_field": self.settings.schema_fields.vector_field,
            "search_params": search_params(self.settings, top_k),
            "timeout": self.settings.storage.milvus_search_timeout_s if timeout is None else timeout,
        }

    @dispatcher.span
    def read(self, filter_expr: str, timeout: float | None = None) -> list[Candidate]:
        """The rows ``filter_expr`` selects (an id list), read by key, as candidates to rescore (raw score 0)."""
        rows = self.client.query(
            self.settings.storage.collection,
            filter=filter_expr,
            output_fields=self._fields,
            timeout=self.settings.storage.milvus_search_timeout_s if timeout is None else timeout,
        )
        return [
            to_candidate(
                self.settings,
                chunk_id=row[self.settings.schema_fields.id_field],
                raw_score=0.0,
                fields=row,
                content=row.get(self.settings.schema_fields.content_field, ""),
                path="sdk",
            )
            for row in rows
        ]

    @dispatcher.span
    def hybrid_search(self, request: HybridRequest, timeout: float | None = None) -> L1Search:
        """Dense and BM25 in one ``MilvusClient.hybrid_search`` call (scores: :mod:`.full_text`)."""
        return milvus_hybrid_search(self.client, self.settings, request, timeout, "sdk")

    @dispatcher.span
    def fetch(
        self, embedding: list[float], filter_expr: str, timeout: float | None = None
    ) -> tuple[L1Search, dict[str, np.ndarray]]:
        """The chunks ``filter_expr`` selects, read by key and scored here (:func:`.full_text.fetched_and_scored`)."""
        return fetched_and_scored(self.client, self.settings, embedding, filter_expr, timeout, "sdk")


def _ids_and_scores(hits: Any) -> list[tuple[str, float]]:
    return [(str(hit["id"]), float(hit["distance"])) for hit in hits]
