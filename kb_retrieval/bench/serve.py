"""``kb-retrieval serve`` as a separate process: started on a free port, waited for, stopped with SIGTERM; the
warm latency of a lookup through it beside the same lookups in process (what the HTTP hop costs); and its throughput
and latency under concurrent clients for one and several worker processes (:func:`served_throughput`).

The load comes from :mod:`kb_retrieval.bench.load` (``wrk`` when it is on ``PATH``, else Python threads); each run
records the server's and the generator's CPU a request beside the requests/s.

Throughput on its own (a state dir with a collection; the queries one per line, or a golden JSONL set)::

    python -m kb_retrieval.bench.serve --state .kb-state --queries ../shared/golden/runbooks-alerts-dev.jsonl \
        --workers 1,2 --clients 1,4,16 --rounds 2

The tests start their servers with :class:`ServeProcess` too.
"""

from __future__ import annotations

import argparse
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

from kb_retrieval.bench.load import load, pick_generator, post_json, process_tree_cpu_s, wrk_load
from kb_retrieval.bench.milvus_server import pick_free_ports
from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.milvus import release_lite

__all__ = ["ServeProcess", "post_json", "served_latency", "served_throughput"]


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
                    # Every worker listens once the line is out (the first one answers /healthz before).
                    if response.status == 200 and "listening on" in self.log():
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


def served_latency(settings: KBSettings, queries: Sequence[str], work_dir: Path, rounds: int = 3) -> dict[str, Any]:
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
    same = ["--mode", settings.retrieval.vector_store_mode, "--collection", settings.storage.collection]
    with ServeProcess(settings.storage.state_dir, work_dir / "serve-bench.log", env=quiet, args=same) as server:
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


def served_throughput(
    state_dir: Path,
    queries: Sequence[str],
    work_dir: Path,
    *,
    workers: Sequence[int] = (1, 2),
    clients: Sequence[int] = (1, 4, 16),
    rounds: int = 2,
    requests: int = 160,
    seconds: int = 4,
    generator: str = "auto",
    args: Sequence[str] = (),
    log: Any = None,
) -> dict[str, Any]:
    """Requests/s, p50 and p99 through ``kb-retrieval serve --workers W`` for each W and client count, the sides
    alternating: each round starts one server per worker count in turn (one process holds a Lite data dir at a
    time), warms it (every query once per worker) and runs each client count: ``seconds`` of ``wrk``, or
    ``requests`` lookups from Python threads (``generator``: ``auto`` takes wrk when it is on ``PATH``). Per
    (W, clients) the round with the most requests/s is kept (the machine is shared: the best round is the least
    disturbed one), with every round's figures beside it; ``scaling``: requests/s of the most workers over one
    worker, per client count.

    Each run also says where the CPU went, per request answered: ``server_cpu_ms`` (the serve process and its
    workers), ``generator_cpu_ms``, and ``cores_busy`` (both over the run's wall time); on 2 cores the generator's
    share is what a second worker cannot have."""
    chosen = pick_generator(generator)
    runs: dict[str, list[dict[str, Any]]] = {}
    quiet = {"KB_SERVER_ACCESS_LOG": "false"}
    for round_number in range(rounds):
        for count in workers:
            server_args = [*args, "--workers", str(count)]
            log_path = work_dir / f"serve-throughput-w{count}.log"
            with ServeProcess(state_dir, log_path, env=quiet, args=server_args) as server:
                assert server.proc is not None
                for _ in range(count):  # a worker's first lookups warm its caches: each worker gets some
                    for query in queries:
                        post_json(server.url + "/v1/lookup", {"query": query})
                for n in clients:
                    before = process_tree_cpu_s(server.proc.pid)
                    if chosen == "wrk":
                        figures = wrk_load(server.url, queries, n, seconds, work_dir)
                    else:
                        figures = load(server.url, queries, n, requests)
                    figures.update(_cpu_split(before, process_tree_cpu_s(server.proc.pid), figures))
                    figures["round"] = round_number
                    runs.setdefault(f"{count}x{n}", []).append(figures)
                    if log is not None:
                        log(f"[serve] workers {count}, clients {n}, round {round_number} ({chosen}): {figures}")
    best = {key: max(found, key=lambda f: f["rps"]) for key, found in runs.items()}
    most = max(workers)
    scaling = {
        str(n): round(best[f"{most}x{n}"]["rps"] / best[f"1x{n}"]["rps"], 2)
        for n in clients
        if 1 in workers and best[f"1x{n}"]["rps"]
    }
    return {
        "workers": list(workers),
        "clients": list(clients),
        "generator": chosen,
        "requests_per_run": requests if chosen == "python" else None,
        "seconds_per_run": seconds if chosen == "wrk" else None,
        "rounds": rounds,
        "best": best,
        "runs": runs,
        f"scaling_{most}_over_1": scaling,
        "errors": sum(f["errors"] for found in runs.values() for f in found),
    }


def _cpu_split(before: dict[int, float], after: dict[int, float], figures: dict[str, Any]) -> dict[str, Any]:
    """The server's and the generator's CPU per request answered (ms), and the cores both kept busy."""
    server_s = sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())
    answered = max(1, round(figures["rps"] * figures["seconds"]))
    return {
        "server_cpu_ms": round(server_s / answered * 1000, 2),
        "generator_cpu_ms": round(figures["generator_cpu_s"] / answered * 1000, 2),
        "cores_busy": round((server_s + figures["generator_cpu_s"]) / figures["seconds"], 2),
    }


def _read_queries(path: Path) -> list[str]:
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix == ".jsonl":
        return [json.loads(line)["query"] for line in lines]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """The serve throughput bench from the command line: requests/s, p50 and p99 per worker count and concurrency."""
    parser = argparse.ArgumentParser(prog="python -m kb_retrieval.bench.serve", description=served_throughput.__doc__)
    parser.add_argument("--state", type=Path, required=True, help="a state dir with a collection (not written)")
    parser.add_argument("--queries", type=Path, required=True, help="queries, one per line, or a golden JSONL set")
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated (default 1,2)")
    parser.add_argument("--clients", default="1,4,16", help="concurrent clients, comma-separated (default 1,4,16)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the worker counts alternating (default 2)")
    parser.add_argument("--requests", type=int, default=160, help="requests per run (the python generator)")
    parser.add_argument("--seconds", type=int, default=4, help="whole seconds per run (wrk; default 4)")
    parser.add_argument(
        "--generator",
        choices=("auto", "wrk", "python"),
        default="auto",
        help="the load generator: wrk (Debian's wrk), python (threads of this process), auto: wrk when on PATH",
    )
    parser.add_argument("--limit", type=int, default=60, help="queries used (default the first 60)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    ns = parser.parse_args(argv)
    figures = served_throughput(
        ns.state,
        _read_queries(ns.queries)[: ns.limit],
        ns.state.parent,
        workers=[int(w) for w in ns.workers.split(",")],
        clients=[int(c) for c in ns.clients.split(",")],
        rounds=ns.rounds,
        requests=ns.requests,
        seconds=ns.seconds,
        generator=ns.generator,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    text = json.dumps({k: v for k, v in figures.items() if k != "runs"}, indent=2)
    print(text)
    if ns.out is not None:
        ns.out.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
