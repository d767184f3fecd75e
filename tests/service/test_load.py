"""Under load: 8 concurrent clients x 100 lookups get 800 answers and leave 800 trace rows; SIGTERM in the middle of
load loses no accepted row; a server with a token refuses requests without it and logs no query text in hash mode."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from kb_retrieval.bench.serve import ServeProcess
from tests.service.conftest import REDIS_ALERT

QUERIES = (
    REDIS_ALERT,
    "MySQLReplicationLag: MySQL replica db-replica-02 is 412 seconds behind its source for more than 5 minutes.",
    "MySQLTooManyConnections: db-orders-01 Threads_connected is 1421 of max_connections 1500 (94.7%)",
    "KubePodCrashLooping: Pod payments/payments-api-7d9f8b6c4-x2k8q (api) is in waiting state (CrashLoopBackOff).",
    "KubeNodeNotReady: worker-07 has been unready for more than 15 minutes.",
    "how do I pick a Redis eviction policy for a cache",
    "pvc stuck in Pending after a deploy",
    "ConsoleMarkupInjection: the alert console renders raw markup",
)


def trace_rows(state_dir: Path) -> int:
    """Rows in the server's trace table (0 before its first row created it)."""
    with sqlite3.connect(state_dir / "traces.db") as db:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'tool_invocation'").fetchone():
            return 0
        return int(db.execute("SELECT count(*) FROM tool_invocation").fetchone()[0])


@pytest.mark.timeout(1500)
def test_eight_clients_times_one_hundred_lookups_get_800_answers_and_800_rows(served):
    before = trace_rows(served.state_dir)

    def client(number: int) -> list[int]:
        statuses = []
        with httpx.Client(base_url=served.url, timeout=120) as http:
            for i in range(100):
                response = http.post("/v1/lookup", json={"query": QUERIES[(number + i) % len(QUERIES)]})
                statuses.append(response.status_code)
                if response.status_code == 200:
                    assert response.json()["found"] is True
        return statuses

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = [status for result in pool.map(client, range(8)) for status in result]
    assert len(statuses) == 800 and set(statuses) == {200}
    httpx.get(served.url + "/v1/traces?limit=1", timeout=60)  # a read waits for the rows accepted before it
    assert trace_rows(served.state_dir) - before == 800


@pytest.mark.timeout(1200)
def test_sigterm_under_load_loses_no_accepted_row_and_the_token_guards_every_api(state_copy, tmp_path):
    token = "s3cret-token-for-the-test"
    server = ServeProcess(
        state_copy("sigterm"),
        tmp_path / "serve.log",
        env={"KB_SERVER_TOKEN": token, "KB_TRACE_QUERY": "hash"},
        args=["--mode", "sdk"],
    ).start()
    auth = {"authorization": f"Bearer {token}"}
    try:
        assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200  # open: probes carry no token
        assert httpx.get(server.url + "/", timeout=30).status_code == 200  # the page (static) too
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": token}):
            refused = httpx.post(server.url + "/v1/lookup", json={"query": REDIS_ALERT}, headers=headers, timeout=30)
            assert refused.status_code == 401 and "bearer token" in refused.json()["error"]
        assert httpx.get(server.url + "/v1/traces", timeout=30).status_code == 401
        assert httpx.post(server.url + "/mcp", json={}, timeout=30).status_code == 401
        assert httpx.post(server.url + "/v1/lookup", json={"query": REDIS_ALERT}, headers=auth, timeout=60).is_success

        answered = 0
        started = 0
        lock = threading.Lock()
        stop = threading.Event()

        def client(number: int) -> None:
            nonlocal answered, started
            with httpx.Client(base_url=server.url, timeout=120, headers=auth) as http:
                i = 0
                while not stop.is_set():
                    with lock:
                        started += 1
                    try:
                        response = http.post("/v1/lookup", json={"query": QUERIES[(number + i) % len(QUERIES)]})
                    except httpx.HTTPError:
                        return  # the server stopped taking connections
                    i += 1
                    if response.status_code != 200:
                        return
                    with lock:
                        answered += 1

        threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 300
        while answered < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert answered >= 40, server.log()[-2000:]
    finally:
        code = server.stop()  # SIGTERM while the four clients are still sending
        stop_all = locals().get("stop")
        if stop_all is not None:
            stop_all.set()
    for thread in threads:
        thread.join(timeout=120)
    assert code == 0, server.log()[-3000:]
    rows = trace_rows(server.state_dir)
    assert answered + 1 <= rows <= started + 1, (answered, started, rows)  # +1: the lookup before the load
    log = server.log()
    assert "stopped by SIGTERM" in log and "(0 trace rows not recorded)" in log
    # KB_TRACE_QUERY=hash: neither the rows nor the access log hold the query text.
    assert "RedisMemoryHigh" not in log and "sha256:" in log and token not in log
    entries = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert any(e["path"] == "/v1/lookup" and e["status"] == 401 for e in entries)
    with sqlite3.connect(server.state_dir / "traces.db") as db:
        stored = {row[0] for row in db.execute("SELECT query FROM tool_invocation")}
    assert stored and all(q.startswith("sha256:") for q in stored)
