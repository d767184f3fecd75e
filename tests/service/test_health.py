"""``/healthz`` when Milvus goes away: the server keeps answering, health says 503 with the reason, and a lookup is
an outage result (``knowledge_base_unavailable``), never an error page. Milvus here is the same data dir served by
``milvus-lite server``, killed mid-run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kb_retrieval.bench.milvus_server import pick_free_ports
from kb_retrieval.bench.serve import ServeProcess
from tests.service.conftest import REDIS_ALERT


@pytest.mark.timeout(900)
def test_healthz_is_503_with_the_reason_once_milvus_is_unreachable(state_copy, tmp_path):
    state = state_copy("health")
    (port,) = pick_free_ports(1)
    command = [str(Path(sys.executable).parent / "milvus-lite"), "server", "--data-dir", str(state / "milvus.db")]
    lite = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = None
    try:
        assert lite.stdout is not None and "listening on 127.0.0.1" in lite.stdout.readline()
        uri = f"http://127.0.0.1:{port}"
        server = ServeProcess(state, tmp_path / "serve.log", args=["--uri", uri, "--mode", "sdk"]).start()
        healthy = httpx.get(server.url + "/healthz", timeout=30)
        assert healthy.status_code == 200 and healthy.json()["milvus"] == "server" and healthy.json()["chunks"] > 0
        lite.kill()  # Milvus gone, as in a crash
        lite.wait(timeout=30)
        down = httpx.get(server.url + "/healthz", timeout=60)
        assert down.status_code == 503, down.text
        body = down.json()
        assert body["status"] == "unavailable" and body["reason"].startswith("Milvus: ") and "\n" not in body["reason"]
        lookup = httpx.post(server.url + "/v1/lookup", json={"query": REDIS_ALERT}, timeout=120)
        assert lookup.status_code == 200, lookup.text
        result = lookup.json()
        assert result["found"] is False and result["evidenceStatus"] == "knowledge_base_unavailable"
        assert "Traceback" not in lookup.text
    finally:
        if lite.poll() is None:
            lite.kill()
            lite.wait(timeout=30)
        if server is not None:
            assert server.stop() == 0, server.log()[-3000:]
