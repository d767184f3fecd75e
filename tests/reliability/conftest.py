"""Shared pieces of the reliability suite: small knowledge bases, the Milvus backends (Lite and a real server), the
trace-store backends (SQLite and PostgreSQL), and a spy on the L1 searches a lookup makes.

Backends are parametrised where a scenario applies to both: ``milvus_backend`` is ``lite`` (a Milvus Lite data dir)
or ``server`` (the session's shared Milvus standalone server, one collection per test), and ``trace_url`` is a
SQLite file or a PostgreSQL schema of its own (``KB_TEST_POSTGRES_URL``; skipped, saying so, when it is unset).
"""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from pymilvus import MilvusClient
from sqlalchemy import create_engine, text

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.indexing.milvus import release_lite
from kb_retrieval.models import Candidate, LookupResult
from kb_retrieval.retrieval.l1.base import L1Search
from kb_retrieval.retrieval.l1.retriever import L1Retriever
from tests.conftest import SAMPLE_KB
from tests.support.kb import write_kb  # noqa: F401  (imported from here by the reliability tests)

#: Queries of the golden set whose top source is clear (a wide margin over the second), over four categories.
KNOWN_QUERIES: dict[str, str] = {
    "RedisMemoryHigh: Redis memory usage above 90% of maxmemory on instance redis-cache-01:6379 (current 93.4%)": (
        "redis/memory-usage-high.md"
    ),
    "RedisReplicationBroken: replica redis-replica-02:6379 reports master_link_status:down for 10m. Replica log: "
    "Error condition on socket for SYNC: Connection refused": "redis/replication-broken.md",
    "MySQLReplicationLag: MySQL replica db-replica-02 is 412 seconds behind its source for more than 5 minutes.": (
        "mysql/replication-lag.md"
    ),
    "MySQLTooManyConnections: db-orders-01 Threads_connected is 1421 of max_connections 1500 (94.7%)": (
        "mysql/too-many-connections.md"
    ),
    "KubePodCrashLooping: Pod payments/payments-api-7d9f8b6c4-x2k8q (api) is in waiting state "
    '(reason: "CrashLoopBackOff").': "kubernetes/pod-crashloopbackoff.md",
    "KubeNodeNotReady: worker-07 has been unready for more than 15 minutes.": "kubernetes/node-not-ready.md",
    "raised nofile in limits.conf but my systemd service still hits too many open files": (
        "linux/too-many-open-files.md"
    ),
    "What does the load average number really count on Linux?": "linux/understanding-load-average.md",
}
#: The sample KB's folders those queries need (the server backend ingests only these).
KNOWN_CATEGORIES = ("redis", "mysql", "kubernetes", "linux")


def check_result(result: LookupResult, settings: KBSettings) -> None:
    """What every result must satisfy, whatever happened: the budget holds, found agrees with the evidence."""
    summary = result.context_pack.summary
    assert summary.used_tokens <= settings.evidence.context_budget_tokens
    assert result.found == bool(result.evidence_blocks) == bool(result.context_pack.blocks)
    if not result.found:
        attempts = result.retrieval_trace.attempts
        # The knowledge base was never searched as a whole (no candidate, no unfiltered attempt completed): an
        # outage, told apart from an empty answer.
        failed = (
            bool(attempts)
            and not any(a.candidate_count for a in attempts)
            and all(a.filtered or a.outcome in ("error", "skipped") for a in attempts)
        )
        assert result.evidence_status.value == ("knowledge_base_unavailable" if failed else "no_evidence")


# --- Milvus backends --------------------------------------------------------------------------------------------


@dataclass
class MilvusBackend:
    """Makes settings for a fresh collection on one backend and drops what it made at the end."""

    name: str
    base: Path
    uri: str | None = None
    made: list[KBSettings] = field(default_factory=list)

    def settings(self, **changes: Any) -> KBSettings:
        tag = uuid.uuid4().hex[:10]
        values: dict[str, Any] = {"state_dir": self.base / f"state-{tag}", "vector_store_mode": "auto"}
        if self.uri is not None:
            values |= {"milvus_uri": self.uri, "collection": f"rel_{tag}"}
        settings = KBSettings(**(values | changes))
        self.made.append(settings)
        return settings

    def cleanup(self) -> None:
        """Release (not drop) server collections: after a drop, Milvus 2.3.5's graceful stop hangs for the whole
        30 s stop timeout at the end of the session; the server's data dir is temporary anyway."""
        for settings in self.made:
            if settings.is_milvus_server():
                client = MilvusClient(uri=settings.resolved_milvus_uri(), timeout=10)
                try:
                    if client.has_collection(settings.storage.collection):
                        client.release_collection(settings.storage.collection)
                finally:
                    client.close()
            else:
                release_lite(settings)


@pytest.fixture(params=["lite", pytest.param("server", marks=pytest.mark.server)])
def milvus_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MilvusBackend]:
    uri = request.getfixturevalue("milvus_server").uri if request.param == "server" else None
    backend = MilvusBackend(request.param, tmp_path, uri)
    yield backend
    backend.cleanup()


@pytest.fixture(scope="session")
def server_sample_settings(milvus_server, tmp_path_factory: pytest.TempPathFactory, embed_model) -> KBSettings:
    """Four folders of the sample KB ingested once into the shared Milvus server."""
    kb = tmp_path_factory.mktemp("rel-server-kb")
    for category in KNOWN_CATEGORIES:  # under one root, so the source ids are those of the sample KB
        shutil.copytree(SAMPLE_KB / category, kb / category)
    settings = KBSettings(
        state_dir=tmp_path_factory.mktemp("rel-server-sample"),
        milvus_uri=milvus_server.uri,
        collection="rel_sample",
        vector_store_mode="auto",
    )
    ingest([kb], settings, embed_model=embed_model)
    return settings


@pytest.fixture(params=["lite", pytest.param("server", marks=pytest.mark.server)])
def known_kb(request: pytest.FixtureRequest) -> KBSettings:
    """KBSettings of a collection holding the sources of :data:`KNOWN_QUERIES`, on Milvus Lite or the server."""
    if request.param == "lite":
        return request.getfixturevalue("sample_settings").model_copy(update={"vector_store_mode": "auto"})
    return request.getfixturevalue("server_sample_settings")


# --- trace-store backends ---------------------------------------------------------------------------------------


def _postgres_schema_url(base_url: str) -> tuple[str, Callable[[], None]]:
    """A URL whose connections live in a new, empty schema (so row counts are this test's), and its dropper."""
    schema = f"rel_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    separator = "&" if "?" in base_url else "?"
    url = f"{base_url}{separator}options={quote(f'-csearch_path={schema}')}&application_name={schema}"

    def drop() -> None:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()

    return url, drop


@pytest.fixture
def postgres_schema_url(postgres_url: str) -> Iterator[str]:
    """A URL into a fresh schema of the PostgreSQL server (``application_name`` = the schema), dropped after."""
    url, drop = _postgres_schema_url(postgres_url)
    try:
        yield url
    finally:
        drop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def trace_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A trace-store URL of this test alone: a SQLite file, or a fresh schema on the PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'traces.db'}"
    url: str = request.getfixturevalue("postgres_schema_url")
    return url


# --- spying on what a lookup searched --------------------------------------------------------------------------


@dataclass
class SearchRecord:
    category: str | None
    ids: list[str] | None
    candidates: list[Candidate]
    kind: str = "dense"  # "dense": a dense search; "hybrid": one hybrid_search (its raw union of every request)


class SearchSpy:
    """Wraps ``lookup.dense.search`` and ``lookup.dense.hybrid_search``: every L1 search of a lookup, per thread
    (the calls of one lookup)."""

    def __init__(self, lookup: KnowledgeLookup) -> None:
        self._local = threading.local()
        self.all: list[SearchRecord] = []
        self._lock = threading.Lock()
        retriever: L1Retriever = lookup.dense
        real = retriever.search

        def search(
            embedding: list[float], category: str | None = None, top_k: int | None = None, **kwargs: Any
        ) -> L1Search:
            result = real(embedding, category, top_k, **kwargs)
            record = SearchRecord(category, kwargs.get("ids"), list(result.candidates))
            self.current.append(record)
            with self._lock:
                self.all.append(record)
            return result

        real_hybrid = retriever.hybrid_search

        def hybrid_search(embedding: list[float], terms: str, category: str | None = None, **kwargs: Any) -> L1Search:
            result = real_hybrid(embedding, terms, category, **kwargs)
            record = SearchRecord(category, kwargs.get("ids"), list(result.candidates), kind="hybrid")
            self.current.append(record)
            with self._lock:
                self.all.append(record)
            return result

        retriever.search = search  # type: ignore[method-assign]
        retriever.hybrid_search = hybrid_search  # type: ignore[method-assign]

    @property
    def current(self) -> list[SearchRecord]:
        """This thread's searches since :meth:`reset`."""
        if not hasattr(self._local, "records"):
            self._local.records = []
        records: list[SearchRecord] = self._local.records
        return records

    def reset(self) -> None:
        self._local.records = []
