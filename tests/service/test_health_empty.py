"""``/healthz`` is 503 when the collection holds no chunk (lost data or never ingested): lookups could not answer.

The route's logic with the chunk count pinned (a fake lookup object: no Milvus); ``test_http.py`` checks the 200
of a real server, ``test_health.py`` the 503 of an unreachable Milvus, ``tests/reliability/test_full_disk.py`` that
lost or garbage Lite files are named before a server starts.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from kb_retrieval.config import KBSettings
from kb_retrieval.service import routes
from kb_retrieval.service.app import create_app

pytestmark = pytest.mark.unit


def _client(monkeypatch, chunks: int) -> TestClient:
    lookup = SimpleNamespace(
        settings=KBSettings(),
        lexical_mode="milvus_bm25",
        index_version="v1",
        client=None,
        traces=SimpleNamespace(stored_query=lambda text: text),
    )
    monkeypatch.setattr(routes, "count_rows", lambda client, settings: chunks)
    return TestClient(create_app(lookup), base_url="http://127.0.0.1")  # type: ignore[arg-type]


def test_an_empty_collection_is_503_with_the_reason(monkeypatch):
    response = _client(monkeypatch, 0).get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable" and body["chunks"] == 0
    assert "holds no chunks" in body["reason"] and "kb-retrieval ingest" in body["reason"]


def test_a_collection_with_chunks_is_200(monkeypatch):
    response = _client(monkeypatch, 53).get("/healthz")
    assert response.status_code == 200 and response.json()["chunks"] == 53
