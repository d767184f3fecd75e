"""One deadline per lookup, the freshness check included (issue 23 items 1 and 2), on real servers.

A long-lived lookup checks the index version every ``freshness_check_s``; that check used to call Milvus with no
timeout, so a frozen server (SIGSTOP: sockets open, nothing answers) held a lookup with a 3 s deadline for as long as
the freeze (7-77 s). Now the check runs off the request path: the lookup answers within its deadline plus 0.5 s as
``knowledge_base_unavailable``, the same during a restart, and serves again after. While a restarted server loads
its collection, an unfiltered search can answer no candidates: that is told as an outage, not as ``no_evidence``.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.models import EvidenceStatus, LookupResult
from kb_retrieval.traces import TraceStore
from tests.conftest import SAMPLE_KB
from tests.reliability.conftest import check_result
from tests.support.milvus_server import MilvusServer
from tests.support.processes import frozen, lite_server

QUERY = "MySQLReplicationLag: MySQL replica db-replica-02 is 412 seconds behind its source for more than 5 minutes."
SOURCE = "mysql/replication-lag.md"
DEADLINE_S = 3.0
#: What the issue allows past the deadline.
SLACK_S = 0.5
RECOVERY_S = 150.0


def _settings(uri: str, state: object) -> KBSettings:
    return KBSettings(
        state_dir=state,
        milvus_uri=uri,
        collection="fresh_deadline",
        vector_store_mode="sdk",
        lookup_timeout_s=DEADLINE_S,
        milvus_timeout_s=2.0,
        milvus_search_timeout_s=DEADLINE_S,
        freshness_check_s=1.0,
    )


@dataclass
class Served:
    name: str
    lookup: KnowledgeLookup
    processes: object  # () -> list[psutil.Process]


def _ingested(uri: str, tmp_path_factory: pytest.TempPathFactory, embed_model) -> KBSettings:
    kb = tmp_path_factory.mktemp("fresh-kb")
    shutil.copytree(SAMPLE_KB / "mysql", kb / "mysql")
    settings = _settings(uri, tmp_path_factory.mktemp("fresh-state"))
    ingest([kb], settings, embed_model=embed_model)
    return settings


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MilvusServer]:
    """A Milvus server of this module's own (it is frozen and restarted; never the session's shared one)."""
    server = MilvusServer(tmp_path_factory.mktemp("fresh-milvus"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _lookup(settings: KBSettings) -> KnowledgeLookup:
    """A lookup embedding queries as the service does, with the default query encoder (the ONNX export of the
    bundled model; ingest used the torch model: the same vectors within the export's tolerance).

    Not the torch model of the session's fixture: while a restarted server starts and loads its collections it takes
    both cores, and one query's embedding by the torch model (two intra-op threads) took 0.35-1.5 s in that window
    here, by the ONNX encoder 23-77 ms. The deadline cannot take that CPU back (a lookup does not abandon its own
    embedding): one lookup spent 1.27 s waiting for the freshness check and 1.53 s embedding, 2.8 of its 3 s, and
    one in CI answered in 4.23 s. A caller's torch model on a starved machine can do the same; what this module
    checks is that no wait on Milvus holds a lookup past its deadline.
    """
    return KnowledgeLookup(settings, trace_store=TraceStore("sqlite://"))


def _timed(lookup: KnowledgeLookup) -> tuple[LookupResult, float]:
    started = time.monotonic()
    result = lookup.lookup(QUERY)
    seconds = time.monotonic() - started
    check_result(result, lookup.settings)
    return result, seconds


def _serves(result: LookupResult) -> bool:
    return result.found and result.evidence_blocks[0].source == SOURCE


def _frozen_lookups(lookup: KnowledgeLookup, processes) -> list[tuple[LookupResult | None, float]]:
    """Two lookups in a row while the server is frozen, the first one due its freshness check; each in a thread
    joined at deadline + 5 s (a lookup held by the freeze fails the test instead of hanging it)."""
    out: list[tuple[LookupResult | None, float]] = []
    time.sleep(lookup.settings.retrieval.freshness_check_s + 0.2)  # due its check
    with frozen(processes()):
        for _ in range(2):
            box: list[tuple[LookupResult, float]] = []
            started = time.monotonic()
            thread = threading.Thread(target=lambda into=box: into.append(_timed(lookup)), daemon=True)
            thread.start()
            thread.join(DEADLINE_S + 5)
            out.append(box[0] if box else (None, time.monotonic() - started))
    return out


def _assert_unavailable_in_time(outcomes: list[tuple[LookupResult | None, float]], where: str) -> None:
    for result, seconds in outcomes:
        assert result is not None, f"{where}: no answer {seconds:.1f} s into a {DEADLINE_S} s deadline"
        assert seconds < DEADLINE_S + SLACK_S, f"{where}: {seconds:.2f} s for a {DEADLINE_S} s deadline"
        assert result.evidence_status is EvidenceStatus.UNAVAILABLE, (where, result.retrieval_trace.attempts)
        assert not result.found


def _recover(lookup: KnowledgeLookup) -> float:
    started = time.monotonic()
    while time.monotonic() - started < RECOVERY_S:
        if _serves(lookup.lookup(QUERY)):
            return time.monotonic() - started
        time.sleep(0.3)
    pytest.fail(f"not serving {RECOVERY_S:.0f} s after the server came back")


@pytest.mark.server
@pytest.mark.timeout(600)
def test_frozen_and_restarting_milvus_server_answers_within_the_deadline(own_server, tmp_path_factory, embed_model):
    settings = _ingested(own_server.uri, tmp_path_factory, embed_model)
    lookup = _lookup(settings)
    assert _serves(lookup.lookup(QUERY))

    outcomes = _frozen_lookups(lookup, own_server.process_tree)
    print(f"\nfrozen Milvus server: {[round(s, 2) for _, s in outcomes]} s")
    _assert_unavailable_in_time(outcomes, "frozen server")
    print(f"serving again {_recover(lookup):.1f} s after SIGCONT")

    # A restart: down, then starting (the lookup due its check each time), then loading its collections.
    time.sleep(settings.retrieval.freshness_check_s + 0.2)
    own_server.stop()
    result, seconds = _timed(lookup)
    assert seconds < DEADLINE_S + SLACK_S and result.evidence_status is EvidenceStatus.UNAVAILABLE, seconds
    starting = threading.Thread(target=own_server.start, daemon=True)
    starting.start()
    seen: list[tuple[str, float, str]] = []
    began = time.monotonic()
    while time.monotonic() - began < RECOVERY_S:
        result, seconds = _timed(lookup)
        error = next((a.error for a in result.retrieval_trace.attempts if a.error), "") or ""
        slow = {stage: round(ms) for stage, ms in result.stage_ms.items() if ms > 20}
        seen.append((result.evidence_status.value, round(seconds, 2), error[:90], slow))
        assert seconds < DEADLINE_S + SLACK_S, f"{seconds:.2f} s during the restart: {seen[-5:]}"
        # An empty answer from a collection of 7 documents is the restart window, not an empty knowledge base.
        assert result.evidence_status is not EvidenceStatus.NO_EVIDENCE, seen[-5:]
        if _serves(result) and not starting.is_alive():
            break
        time.sleep(0.2)
    starting.join(RECOVERY_S)
    assert own_server.running and _serves(lookup.lookup(QUERY))
    window = [s for s in seen if "answered no candidates" in s[2]]
    print(f"restart: {len(seen)} lookups, max {max(s[1] for s in seen):.2f} s; {len(window)} in the loading window")
    lookup.close()


@pytest.mark.timeout(300)
def test_frozen_milvus_lite_server_answers_within_the_deadline(tmp_path, tmp_path_factory, embed_model):
    with lite_server(tmp_path / "shared.db") as server:
        settings = _ingested(server.uri, tmp_path_factory, embed_model)
        lookup = _lookup(settings)
        assert _serves(lookup.lookup(QUERY))
        outcomes = _frozen_lookups(lookup, server.processes)
        print(f"\nfrozen milvus-lite server: {[round(s, 2) for _, s in outcomes]} s")
        _assert_unavailable_in_time(outcomes, "frozen milvus-lite server")
        print(f"serving again {_recover(lookup):.1f} s after SIGCONT")
        lookup.close()
