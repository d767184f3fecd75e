"""``kb-retrieval serve --workers 2``: two real worker processes behind one socket on a real Milvus Lite data dir that
the serve process holds; lookups answered by both, every trace row in the one SQLite file, server discovery as with
one process, a killed worker started again, and nothing left running after SIGTERM. No timing is asserted (the
throughput is the bench's: ``python -m kb_retrieval.bench.serve``)."""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from kb_retrieval.bench.serve import ServeProcess, post_json
from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.lite_lock import lite_lock_holder
from kb_retrieval.service.discovery import SERVE_FILE
from kb_retrieval.traces import TraceStore
from tests.service.conftest import CONNECTIONS, REDIS_ALERT
from tests.support.cli_probe import lookup_in_fresh_process

pytestmark = pytest.mark.timeout(900)

QUERIES = [REDIS_ALERT, CONNECTIONS, "MySQL replica lag behind source", "pod stuck in CrashLoopBackOff"]


def _workers(pid: int) -> list[psutil.Process]:
    """The serve process's live worker processes (not multiprocessing's resource tracker, not a child already gone)."""
    found = []
    for child in psutil.Process(pid).children():
        try:
            line = " ".join(child.cmdline())
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue  # a child that has exited and not yet been reaped is no worker
        if "spawn_main" in line and "resource_tracker" not in line:
            found.append(child)
    return found


def test_two_worker_processes_answer_lookups_and_share_one_trace_store(state_copy, tmp_path: Path) -> None:
    state = state_copy("workers")
    server = ServeProcess(state, tmp_path / "serve.log", args=["--workers", "2"]).start()
    try:
        assert server.proc is not None
        workers = _workers(server.proc.pid)
        assert len(workers) == 2, server.log()[-2000:]
        assert "with 2 worker processes" in server.log()
        # The serve process holds the data dir (the workers reach it through it), and says so in serve.json.
        assert lite_lock_holder((state / "milvus.db").resolve()) == server.proc.pid
        record = json.loads((state / SERVE_FILE).read_text())
        assert record["url"] == server.url and record["pid"] == server.proc.pid
        health = json.loads(_get(server.url + "/healthz"))
        assert health["status"] == "ok" and health["chunks"] > 0 and health["milvus"] == "lite"

        # Concurrent lookups, on new connections each: every one answered.
        def ask(n: int) -> tuple[int, dict]:
            return post_json(server.url + "/v1/lookup", {"query": QUERIES[n % len(QUERIES)]})

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, range(32)))
        assert [status for status, _ in answers] == [200] * 32, [body for status, body in answers if status != 200]
        redis = [body for n, (_, body) in enumerate(answers) if n % len(QUERIES) == 0]
        assert all(body["evidenceBlocks"][0]["source"] == "redis/memory-usage-high.md" for body in redis)
        assert all(body["traceRecorded"] for _, body in answers)
        # Both workers looked up (each loaded its own pipeline and answered some of the 32: CPU beyond start-up).
        busy = {w.pid: w.cpu_times().user for w in workers}
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(ask, range(32)))
        assert all(w.cpu_times().user > busy[w.pid] for w in workers)

        # `kb-retrieval lookup` with no flag finds the server (no pipeline loaded in that process).
        run = lookup_in_fresh_process(["--state-dir", str(state), "--json", REDIS_ALERT])
        assert json.loads(run.stdout)["evidenceBlocks"][0]["source"] == "redis/memory-usage-high.md"

        # A worker killed outright is started again; the server answers meanwhile and after.
        killed = workers[0]
        killed.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            now = _workers(server.proc.pid)
            if len(now) == 2 and killed.pid not in {w.pid for w in now}:
                break
            assert post_json(server.url + "/v1/lookup", {"query": REDIS_ALERT})[0] == 200
            time.sleep(1)
        else:
            pytest.fail("the killed worker was not started again: " + server.log()[-2000:])
        assert "worker 0 ended (exit status -9): starting it again" in server.log()
        workers = _workers(server.proc.pid)
    finally:
        assert server.stop() == 0, server.log()[-3000:]
    # Nothing left: the workers ended, the data dir and serve.json let go.
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    assert lite_lock_holder((state / "milvus.db").resolve()) is None
    assert not (state / SERVE_FILE).exists()
    # Every answered lookup has its row, whichever worker wrote it (one SQLite file, several writers).
    store = TraceStore.from_settings(KBSettings(state_dir=state))
    try:
        rows = store.rows()
    finally:
        store.close()
    assert len([r for r in rows if r.query in QUERIES]) >= 64 + 1, len(rows)


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()
