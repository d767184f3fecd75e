"""``kb-retrieval serve`` as users run it: a real subprocess (uvicorn) on a free loopback port, over real Milvus Lite
holding part of the sample KB plus one hostile document (HTML and a script in its text).

Milvus Lite opens a data dir in one process only, so the knowledge base is ingested once here (this process then
lets the dir go) and every server, and the in-process lookup the answers are compared with, gets a copy of it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kb_retrieval.bench.serve import ServeProcess
from tests.conftest import SAMPLE_KB

#: Sample-KB folders ingested (a part, to keep the ingest short): the tests' queries need these.
FOLDERS = ("redis", "kubernetes", "mysql")
HOSTILE_SOURCE = "security/console-markup-injection.md"
HOSTILE_DOC = """---
title: Alert console shows <b>raw markup</b> from alert text
keywords: [ConsoleMarkupInjection]
category: security
---
# Alert console shows <b>raw markup</b> from alert text

## The payload
An alert description may carry <script>document.title='pwned';window.kbPwned=1</script> and
<img src=x onerror="document.title='pwned'"> verbatim. Render alert text as text, never as HTML.

## Mitigation
Escape every field of the alert before display; the ConsoleMarkupInjection rule fires when one is not.
"""
REDIS_ALERT = (
    "RedisMemoryHigh: Redis memory usage above 90% of maxmemory on instance redis-cache-01:6379 (current 93.4%)"
)
#: A query that reaches several categories unscoped (connection limits: MySQL's and Redis').
CONNECTIONS = "Too many connections: new clients refused, max clients reached"
MYSQL_ONLY = {"filters": [{"key": "category", "value": "mysql", "operator": "=="}], "condition": "and"}
#: Timing fields: they differ between any two runs of the same lookup.
TIMING_KEYS = ("elapsedMs", "stageMs")


def without_timings(result: dict) -> dict:
    """A result JSON without what differs from run to run (times) or from store to store (``traceRecorded``)."""
    out = {k: v for k, v in result.items() if k not in (*TIMING_KEYS, "traceRecorded")}
    trace = dict(out["retrievalTrace"])
    trace["attempts"] = [{k: v for k, v in a.items() if k != "elapsedMs"} for a in trace["attempts"]]
    out["retrievalTrace"] = trace
    return out


def categories(result: dict) -> set[str]:
    """The categories of a result JSON's evidence documents."""
    return {block["category"] for block in result["evidenceBlocks"]}


@pytest.fixture(scope="session")
def service_state(tmp_path_factory: pytest.TempPathFactory, embed_model) -> Path:
    """A state dir holding the knowledge base, ingested once; copy it (``state_copy``) before opening it."""
    from kb_retrieval.config import KBSettings
    from kb_retrieval.indexing.ingest import ingest
    from kb_retrieval.indexing.milvus import release_lite

    root = tmp_path_factory.mktemp("service-kb")
    kb = root / "kb"
    for folder in FOLDERS:
        shutil.copytree(SAMPLE_KB / folder, kb / folder)
    (kb / "security").mkdir()
    (kb / HOSTILE_SOURCE).write_text(HOSTILE_DOC, encoding="utf-8")
    settings = KBSettings(state_dir=root / "state", vector_store_mode="sdk")
    summary = ingest([kb], settings, embed_model=embed_model)
    assert summary.documents == len(list(kb.rglob("*.md")))
    release_lite(settings)  # the copies are opened by other processes
    return settings.storage.state_dir


@pytest.fixture(scope="session")
def state_copy(service_state: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """A fresh copy of the ingested state dir (Milvus Lite data, no traces) for one process to open."""

    def copy(name: str) -> Path:
        target = tmp_path_factory.mktemp(f"state-{name}") / "state"
        shutil.copytree(service_state, target)
        return target

    return copy


@pytest.fixture(scope="session")
def served(state_copy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One server for the session's endpoint tests: loopback, no token, the default trace mode."""
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    server = ServeProcess(state_copy("shared"), log, args=["--mode", "sdk"]).start()
    try:
        yield server
    finally:
        code = server.stop()
        assert code == 0, server.log()[-3000:]


@pytest.fixture(scope="session")
def in_process(state_copy) -> Iterator[object]:
    """The same knowledge base looked up in this process (its own copy), to compare the server's answers with."""
    from kb_retrieval.config import KBSettings
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.traces import TraceStore

    settings = KBSettings(state_dir=state_copy("in-process"), vector_store_mode="sdk")
    lookup = KnowledgeLookup(settings, trace_store=TraceStore("sqlite://"))
    yield lookup
    lookup.close()
