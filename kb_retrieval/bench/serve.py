"""``kb-retrieval serve`` as a separate process: started on a free port, waited for, stopped with SIGTERM; and the
warm latency of a lookup through it beside the same lookups in process (what the HTTP hop costs).

The tests start their servers with :class:`ServeProcess` too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from kb_retrieval.bench.milvus_server import pick_free_ports
from kb_retrieval.config import Settings
from kb_retrieval.indexing.milvus import release_lite


class ServeProcess:
    """``python -m kb_retrieval.cli serve`` on ``state_dir`` and a free loopback port, until :meth:`stop`.

    ``env`` is added to this process's environment (``KB_SERVER_TOKEN``, ``KB_TRACE_QUERY``, ...); stderr (the
    access log) goes to ``log_path``.

    Example:
        >>> with ServeProcess(Path(".kb-state/demo"), Path("/tmp/serve.log")) as server:  # doctest: +SKIP
        ...     urllib.request.urlopen(server.url + "/healthz").status
        200
    """

    def __init__(
        self,
        state_dir: Path,
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        args: Sequence[str] = (),
        start_timeout_s: float = 300.0,
    ) -> None:
        self.state_dir = state_dir
        self.log_path = log_path
        self.port = pick_free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
        self.args = list(args)
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> ServeProcess:
        command = [sys.executable, "-m", "kb_retrieval.cli", "serve", "--state-dir", str(self.state_dir)]
        command += ["--port", str(self.port), *self.args]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (held open while the server runs)
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=5) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"serve did not answer /healthz within {self.start_timeout_s:g} s: {self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 120.0) -> int:
        """SIGTERM, then wait for the process (it drains the trace writer); its exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if self._log is not None:
            self._log.close()
        return int(self.proc.returncode)

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def post_json(url: str, payload: dict[str, Any], token: str = "", timeout_s: float = 60.0) -> tuple[int, Any]:
    """POST ``payload`` as JSON; the status and the decoded body (a 4xx/5xx's too)."""
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def served_latency(settings: Settings, queries: Sequence[str], work_dir: Path, rounds: int = 3) -> dict[str, Any]:
    """Warm lookup p50/p95 in process and through ``kb-retrieval serve`` (``POST /v1/lookup`` from this process),
    on the same state dir and queries; the difference of the p50s is the HTTP hop (JSON both ways included).

    In process first, then this process lets the Milvus Lite data dir go (one process per data dir) and the server
    opens it. Each query runs once to warm up, then ``rounds`` times.
    """
    from kb_retrieval.bench.speed import percentile
    from kb_retrieval.engine import KnowledgeLookup

    lookup = KnowledgeLookup(settings)
    try:
        for query in queries:
            lookup.lookup(query)
        ours = []
        for _ in range(rounds):
            for query in queries:
                t0 = time.perf_counter()
                lookup.lookup(query)
                ours.append((time.perf_counter() - t0) * 1000)
    finally:
        lookup.close()
    release_lite(settings)
    served = []
    quiet = {"KB_SERVER_ACCESS_LOG": "false"}
    same = ["--mode", settings.vector_store_mode, "--collection", settings.collection]
    with ServeProcess(settings.state_dir, work_dir / "serve-bench.log", env=quiet, args=same) as server:
        for query in queries:
            post_json(server.url + "/v1/lookup", {"query": query})
        for _ in range(rounds):
            for query in queries:
                t0 = time.perf_counter()
                status, _ = post_json(server.url + "/v1/lookup", {"query": query})
                served.append((time.perf_counter() - t0) * 1000)
                if status != 200:
                    raise RuntimeError(f"the server answered {status} to a bench query")
    return {
        "queries": len(served),
        "in_process_ms": {"p50": percentile(ours, 50), "p95": percentile(ours, 95)},
        "server_ms": {"p50": percentile(served, 50), "p95": percentile(served, 95)},
        "http_hop_p50_ms": round(percentile(served, 50) - percentile(ours, 50), 3),
    }
