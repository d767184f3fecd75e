"""A Milvus server that goes away mid-run and comes back, on a server of this module's own (never the shared one).

* Stopped: every lookup answers ``found = false`` within seconds with the error in the trace (auto: both paths'
  errors), the tool gives the agent text, and a lookup whose vectorstore path is on the stopped server while its sdk
  path is elsewhere is served by sdk, saying why.
* Started again (same data dir, same port): the *same* lookup objects serve again, no rebuild, no new process.
* Hung (the server's processes stopped with SIGSTOP, so connections open but nothing answers): lookups fail within
  the search deadline instead of blocking (pymilvus would wait for its keepalive, then retry: over a minute).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.models import EvidenceStatus, LookupResult
from kb_retrieval.retrieval.l1 import AutoPath, SdkPath, VectorStorePath
from kb_retrieval.tool import make_lookup_tool
from kb_retrieval.traces import TraceStore
from tests.conftest import SAMPLE_KB
from tests.reliability.conftest import check_result
from tests.support.milvus_server import MilvusServer

pytestmark = pytest.mark.server

QUERY = "MySQLReplicationLag: MySQL replica db-replica-02 is 412 seconds behind its source for more than 5 minutes."
SOURCE = "mysql/replication-lag.md"
#: Per-lookup bound while the server is down or hung: two attempts, each failing within the configured timeouts.
DOWN_BOUND_S = 20.0
RECOVERY_DEADLINE_S = 150.0


@dataclass
class Outage:
    server: MilvusServer
    settings: KBSettings
    lookups: dict[str, KnowledgeLookup]  # sdk / vectorstore / auto, all on the server
    split: KnowledgeLookup  # auto: vectorstore on the server, sdk on Milvus Lite


@pytest.fixture(scope="module")
def outage(tmp_path_factory, embed_model, sample_settings) -> Iterator[Outage]:
    kb = tmp_path_factory.mktemp("outage-kb")
    for folder in ("mysql", "redis"):
        shutil.copytree(SAMPLE_KB / folder, kb / folder)
    server = MilvusServer(tmp_path_factory.mktemp("own-milvus"))
    server.start()
    try:
        settings = KBSettings(
            state_dir=tmp_path_factory.mktemp("outage-state"),
            milvus_uri=server.uri,
            collection="outage",
            milvus_timeout_s=3,
            milvus_search_timeout_s=3,
        )
        ingest([kb], settings, embed_model=embed_model)

        def make(name: str, mode: str | None = None, **kwargs) -> KnowledgeLookup:
            store = TraceStore(f"sqlite:///{settings.storage.state_dir / f'traces-{name}.db'}")
            return KnowledgeLookup(
                settings.model_copy(update={"vector_store_mode": mode or name}),
                embed_model=embed_model,
                trace_store=store,
                **kwargs,
            )

        lookups = {mode: make(mode) for mode in ("sdk", "vectorstore", "auto")}
        lite = KnowledgeLookup(sample_settings, embed_model=embed_model, trace_store=TraceStore("sqlite://"))
        split = make("split", "auto", path=AutoPath(VectorStorePath(settings), SdkPath(lite.client, sample_settings)))
        yield Outage(server, settings, lookups, split)
    finally:
        server.stop()


def _timed(lookup: KnowledgeLookup) -> tuple[LookupResult, float]:
    started = time.monotonic()
    result = lookup.lookup(QUERY)
    check_result(result, lookup.settings)
    return result, time.monotonic() - started


def _serves(result: LookupResult) -> bool:
    return result.found and result.evidence_blocks[0].source == SOURCE


def _wait_until_serving(lookups: dict[str, KnowledgeLookup]) -> dict[str, float]:
    """Seconds until each lookup answers again (polling every 0.5 s), the same objects throughout."""
    started = time.monotonic()
    recovered: dict[str, float] = {}
    while len(recovered) < len(lookups) and time.monotonic() - started < RECOVERY_DEADLINE_S:
        for name, lookup in lookups.items():
            if name not in recovered and _serves(lookup.lookup(QUERY)):
                recovered[name] = round(time.monotonic() - started, 1)
        time.sleep(0.5)
    return recovered


@pytest.mark.timeout(600)
def test_stopped_server_fails_fast_then_the_same_lookups_recover(outage: Outage) -> None:
    everyone = {**outage.lookups, "split": outage.split}
    for name, lookup in everyone.items():
        assert _serves(lookup.lookup(QUERY)), name
    assert outage.split.lookup(QUERY).retrieval_trace.path_served == "vectorstore"

    outage.server.stop()

    for mode, lookup in outage.lookups.items():
        result, seconds = _timed(lookup)
        assert result.found is False, mode
        assert seconds < DOWN_BOUND_S, f"{mode}: {seconds:.1f} s while the server is down"
        attempts = result.retrieval_trace.attempts
        assert attempts and all(a.outcome == "error" and a.error for a in attempts), mode
        assert "Fail connecting" in attempts[0].error or "unavailable" in attempts[0].error.lower(), attempts[0].error
        if mode == "auto":
            assert "vectorstore failed:" in attempts[0].error and "sdk failed:" in attempts[0].error
        assert result.evidence_status is EvidenceStatus.UNAVAILABLE, mode  # an outage, not an empty answer
        row = lookup.traces.rows()[-1]
        assert row.found is False and row.retrieval_details["retrieval_trace"]["attempts"][0]["error"]
        assert row.evidence_status == "knowledge_base_unavailable"
    tool_text = make_lookup_tool(outage.lookups["auto"]).call(query=QUERY).content
    assert tool_text.startswith("The knowledge base could not be searched") and "attempt 1: error" in tool_text
    assert "not an empty answer" in tool_text

    split, seconds = _timed(outage.split)  # its sdk path is on Milvus Lite: still serving
    assert _serves(split) and split.retrieval_trace.path_served == "sdk" and seconds < DOWN_BOUND_S
    assert split.retrieval_trace.attempts[0].path_fallback_reason.startswith("vectorstore failed: MilvusException")

    restart_began = time.monotonic()
    outage.server.start()
    restart_s = time.monotonic() - restart_began
    recovered = _wait_until_serving(everyone)
    print(f"\nrestart took {restart_s:.1f} s; serving again after (s): {recovered}")
    assert set(recovered) == set(everyone), f"not serving {RECOVERY_DEADLINE_S:.0f} s after the restart: {recovered}"
    assert outage.split.lookup(QUERY).retrieval_trace.path_served == "vectorstore"  # back on its preferred path


@pytest.mark.timeout(300)
def test_hung_server_fails_within_the_search_deadline_then_recovers(outage: Outage) -> None:
    if not outage.server.running:
        outage.server.start()
    # The server's session leases are 10 s of wall time, and a frozen server's clock runs on: a lookup held for its
    # default 20 s deadline (three 3 s Milvus calls: ~9.5 s seen) froze it nearly that long, and once it came back
    # without its query channel and served nothing for 150 s (CI, 2026-12-03). A 5 s deadline keeps the freeze at
    # about 5 s.
    hung = {mode: outage.lookups[mode].with_settings(lookup_timeout_s=5.0) for mode in ("sdk", "vectorstore")}
    assert all(_serves(lookup.lookup(QUERY)) for lookup in hung.values())
    processes = outage.server.process_tree()
    results: dict[str, tuple[LookupResult, float]] = {}

    def run(mode: str) -> None:
        results[mode] = _timed(hung[mode])

    for proc in processes:
        proc.send_signal(signal.SIGSTOP)
    try:  # both at once: the server stays frozen for one lookup's time (at most its 5 s deadline)
        threads = [threading.Thread(target=run, args=(mode,)) for mode in hung]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DOWN_BOUND_S * 2)
    finally:
        for proc in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGCONT)

    for mode in hung:
        assert mode in results, f"{mode}: no answer within {DOWN_BOUND_S * 2:.0f} s from a hung server"
        result, seconds = results[mode]
        deadline = outage.settings.storage.milvus_search_timeout_s
        assert result.found is False and seconds < len(result.retrieval_trace.attempts) * deadline + 5, seconds
        assert all(a.outcome in ("error", "skipped") for a in result.retrieval_trace.attempts)
        assert result.evidence_status is EvidenceStatus.UNAVAILABLE
        assert seconds < outage.settings.retrieval.lookup_timeout_s + 3, seconds  # one deadline for the whole lookup
        assert "DEADLINE_EXCEEDED" in (result.retrieval_trace.attempts[0].error or ""), result.retrieval_trace
    recovered = _wait_until_serving(hung)
    took = {mode: round(seconds, 1) for mode, (_, seconds) in results.items()}
    print(f"\nlookups against the frozen server took (s): {took}")
    assert set(recovered) == set(hung), recovered
