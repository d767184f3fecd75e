"""The sidecar beside a lookup: off by default, parallel, bounded by its deadline, never changing the main result.

How waiting works (``sidecar/runner.py``): the sidecar starts at the beginning of the lookup; the end of the
lookup waits for what is left of ``sidecar_timeout_s`` counted from that start. So a lookup takes
``max(main, min(sidecar, timeout))``, never ``main + sidecar``. The tests below pin each part of that down.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from llama_index.core.schema import NodeWithScore, QueryBundle
from sidecar_fakes import QUERY, FakeRetriever, stable

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.milvus import connect
from kb_retrieval.retrieval.l1.sdk import SdkPath
from kb_retrieval.sidecar_protocol import DISABLED_REASON, load_runner
from sidecar.comparison import lookup_with_sidecar, sidecar_run
from sidecar.models import SidecarRun, disabled_run
from sidecar.runner import SidecarJob, SidecarRunner
from tests.support.kb import offline_env, write_kb

pytestmark = pytest.mark.timeout(300)


def _timed(lookup: KnowledgeLookup, query: str = QUERY):
    t0 = time.perf_counter()
    result, ranking, run = _with_sidecar(lookup, query)
    return time.perf_counter() - t0, result, ranking, run


def _with_sidecar(lookup: KnowledgeLookup, query: str = QUERY):
    detail = lookup_with_sidecar(lookup, query)
    return detail.result, detail.ranking, sidecar_run(detail.sidecar)


def _details(lookup: KnowledgeLookup) -> dict:
    return lookup.traces.rows()[-1].retrieval_details


# --- disabled by default ------------------------------------------------------------------------------------


def test_disabled_by_default(monkeypatch, sample_lookup):
    monkeypatch.delenv("KB_SIDECAR_ENABLED", raising=False)
    assert KBSettings().sidecar.enabled is False
    monkeypatch.setenv("KB_SIDECAR_ENABLED", "true")
    assert KBSettings().sidecar.enabled is True  # enabling is that one setting

    assert sample_lookup.sidecar is None
    detail = lookup_with_sidecar(sample_lookup, QUERY)
    assert detail.result.found and detail.sidecar is None
    run = sidecar_run(detail.sidecar)
    assert run.status == "disabled" and run.reason == DISABLED_REASON
    assert _details(sample_lookup)["sidecar"] == {"status": "disabled", "reason": DISABLED_REASON}


def test_the_sidecar_implements_the_cores_sidecar_protocol(sample_settings, embed_model):
    """The core creates it from the dotted factory name; it answers through the protocol only."""
    runner = load_runner("sidecar.runner:SidecarRunner", sample_settings, embed_model)
    assert isinstance(runner, SidecarRunner)
    job = runner.start(QUERY)
    assert isinstance(job, SidecarJob)
    run = job.collect()
    assert isinstance(run, SidecarRun) and run.status == "ok", run.reason
    entry = run.trace_entry()
    assert entry["status"] == "ok" and entry["top_candidates"] and "content" not in str(entry)
    assert disabled_run().reason == DISABLED_REASON  # one disabled reason, the core's


def test_disabled_sidecar_is_never_imported(tmp_path):
    """In a fresh interpreter: a lookup with the sidecar off imports nothing of it; switching it on does."""
    write_kb(
        tmp_path / "kb",
        {
            "jvm/gc.md": "# Choosing a JVM garbage collector\n\nFor latency-sensitive services use G1 or ZGC; "
            "pause times stay low when the heap is sized with headroom.\n"
        },
    )
    script = textwrap.dedent(
        f"""
        import json, sys
        from kb_retrieval.config import KBSettings
        from kb_retrieval.engine import KnowledgeLookup
        from kb_retrieval.indexing.ingest import ingest

        settings = KBSettings(state_dir={str(tmp_path / "state")!r}, vector_store_mode="sdk")
        ingest([{str(tmp_path / "kb")!r}], settings)
        lookup = KnowledgeLookup(settings)
        result = lookup.lookup("which garbage collector for a latency-sensitive JVM service")
        off = sorted(m for m in sys.modules if m == "sidecar" or m.startswith("sidecar."))
        details = lookup.traces.rows()[-1].retrieval_details
        # the positive control: the same check sees the sidecar once it is switched on
        KnowledgeLookup(settings.model_copy(update={{"sidecar_enabled": True}}), embed_model=lookup.embed_model)
        on = sorted(m for m in sys.modules if m == "sidecar" or m.startswith("sidecar."))
        print(json.dumps({{"found": result.found, "off": off, "on": on, "sidecar": details["sidecar"]}}))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=_offline_env()
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["found"] is True
    assert report["off"] == []
    assert report["sidecar"]["status"] == "disabled"
    assert "sidecar" in report["on"] and "sidecar.runner" in report["on"]


def _offline_env() -> dict[str, str]:
    return offline_env()


# --- parallel, and bounded by the deadline ------------------------------------------------------------------


class MeetingPath:
    """The real SDK path, whose first search waits until the sidecar has started (and says it is in its search)."""

    name = "sdk"

    def __init__(self, inner: SdkPath, sidecar_started: threading.Event) -> None:
        self.inner = inner
        self.in_search = threading.Event()
        self.sidecar_started = sidecar_started
        self.met: list[bool] = []

    def search(self, embedding: list[float], top_k: int, filter_expr: str | None, *args: Any, **kwargs: Any) -> Any:
        self.in_search.set()
        self.met.append(self.sidecar_started.wait(timeout=30))
        return self.inner.search(embedding, top_k, filter_expr, *args, **kwargs)


class MeetingRetriever(FakeRetriever):
    """A sidecar retriever that says it has started, then waits until the main path is in its search."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.main: MeetingPath | None = None
        self.met: list[bool] = []

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self.started.set()
        assert self.main is not None
        self.met.append(self.main.in_search.wait(timeout=30))
        return super()._retrieve(query_bundle)


def test_sidecar_runs_in_parallel_with_the_main_path(sample_settings, embed_model):
    """The main path and the sidecar meet: each waits until the other is running. Run one after the other, the first
    would wait for nothing (its wait times out, False), whatever the machine's speed."""
    settings = sample_settings.model_copy(update={"sidecar_enabled": True, "sidecar_timeout_s": 60.0})
    sidecar = MeetingRetriever()
    client = connect(settings)
    sidecar.main = path = MeetingPath(SdkPath(client, settings), sidecar.started)
    runner = SidecarRunner(settings, embed_model, factory=lambda: sidecar)
    lookup = KnowledgeLookup(settings, embed_model=embed_model, client=client, path=path, sidecar=runner)
    try:
        _, _, run = _with_sidecar(lookup)
    finally:
        sidecar.started.set()
        path.in_search.set()
        lookup.close()
    assert run.status == "ok" and sidecar.met == [True] and path.met and all(path.met)


def test_a_slower_sidecar_is_waited_for_only_until_it_answers(make_lookup):
    """Fast main path, sidecar 1.5 s, deadline 60 s: the lookup waits for the sidecar's answer (that is the design),
    and for no more: it returns with the answer, long before the deadline."""
    lookup = make_lookup(FakeRetriever(sleep=1.5), timeout_s=60.0)
    total_s, result, _, run = _timed(lookup)
    assert run.status == "ok" and run.waited_ms > 0
    assert result.elapsed_ms >= 1500  # elapsed_ms is what the caller waited: the sidecar's 1.5 s at least
    assert total_s < 30, "the lookup waited for the sidecar's deadline, not for its answer"


def test_hanging_sidecar_times_out_and_leaves_the_main_result_unchanged(make_lookup):
    baseline = make_lookup()
    expected = stable(baseline.lookup_ranked(QUERY)[0].to_json_dict())

    gate = threading.Event()  # released at teardown
    lookup = make_lookup(FakeRetriever(gate=gate), timeout_s=0.5)
    _, result, _, run = _timed(lookup)

    # The lookup answered while the sidecar was still hung (its gate closed): bounded by the sidecar's deadline.
    assert not gate.is_set()
    assert run.status == "timeout" and "0.5 s" in (run.reason or "") and "retrieving" in (run.reason or "")
    assert stable(result.to_json_dict()) == expected
    entry = _details(lookup)["sidecar"]
    assert entry["status"] == "timeout" and entry["top_candidates"] == []


def test_crashing_sidecar_fails_and_leaves_the_main_result_unchanged(make_lookup):
    baseline = make_lookup()
    expected = stable(baseline.lookup_ranked(QUERY)[0].to_json_dict())

    lookup = make_lookup(FakeRetriever(error=RuntimeError("boom in the stock retriever")))
    _, result, _, run = _timed(lookup)

    assert run.status == "failed"
    assert "RuntimeError: boom in the stock retriever" in (run.reason or "")
    assert stable(result.to_json_dict()) == expected
    assert _details(lookup)["sidecar"]["status"] == "failed"


def test_sidecar_that_cannot_initialise_is_unavailable(make_lookup):
    baseline = make_lookup()
    expected = stable(baseline.lookup_ranked(QUERY)[0].to_json_dict())

    def no_store():
        raise ConnectionError("Milvus at http://127.0.0.1:9 refused the connection")

    lookup = make_lookup(no_store)
    _, result, _, run = _timed(lookup)
    assert run.status == "unavailable"
    assert "cannot initialise" in (run.reason or "") and "ConnectionError" in (run.reason or "")
    assert stable(result.to_json_dict()) == expected


def test_hung_sidecars_do_not_pile_up(make_lookup):
    gate = threading.Event()
    lookup = make_lookup(FakeRetriever(gate=gate), timeout_s=0.2, max_in_flight=1)
    first = _with_sidecar(lookup)[2]
    second = _with_sidecar(lookup)[2]
    assert first.status == "timeout"
    assert second.status == "unavailable" and "still running" in (second.reason or "")
    runner = lookup.sidecar
    assert isinstance(runner, SidecarRunner) and runner.in_flight == 1
    gate.set()
    deadline = time.monotonic() + 10
    while runner.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runner.in_flight == 0
    assert _with_sidecar(lookup)[2].status == "ok"


def test_ok_run_is_in_the_trace_row_and_deduped_by_source(make_lookup):
    lookup = make_lookup(FakeRetriever())
    _, _, _, run = _timed(lookup)
    assert run.status == "ok" and run.chunk_count == 3
    assert [(r.rank, r.source, r.score) for r in run.results] == [(1, "jvm/gc.md", 0.8), (2, "jvm/heap.md", 0.6)]
    entry = _details(lookup)["sidecar"]
    assert entry["status"] == "ok" and entry["path"] == "sidecar:vectorstore" and entry["reason"] is None
    assert entry["score_label"] == "cosine_similarity" and entry["elapsed_ms"] >= 0
    assert entry["top_candidates"] == [
        {"rank": 1, "source": "jvm/gc.md", "score_label": "cosine_similarity", "score": 0.8},
        {"rank": 2, "source": "jvm/heap.md", "score_label": "cosine_similarity", "score": 0.6},
    ]


def test_a_sidecar_thread_that_cannot_start_is_unavailable(monkeypatch):
    from sidecar import runner as runner_module

    class NoThread:
        def __init__(self, **kwargs):
            pass

        def start(self):
            raise RuntimeError("can't start new thread")

    # only the runner's module sees the broken Thread; the rest of the process keeps real threads
    fake = SimpleNamespace(Thread=NoThread, Lock=threading.Lock, Event=threading.Event)
    monkeypatch.setattr(runner_module, "threading", fake)
    runner = runner_module.SidecarRunner(KBSettings(), embed_model=None, factory=FakeRetriever)  # type: ignore[arg-type]
    run = runner.run(QUERY)
    assert run.status == "unavailable" and "can't start new thread" in (run.reason or "")
    assert runner.in_flight == 0
