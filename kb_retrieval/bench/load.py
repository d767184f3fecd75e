"""The serve bench's load generators: ``wrk`` (:func:`wrk_load`) when it is on ``PATH``, else threads of this process
(:func:`load`); both send ``POST /v1/lookup`` with the queries in turn, each request on a connection of its own (as
Alertmanager and the CLI send them), and say what the generator itself cost in CPU. :func:`process_tree_cpu_s` reads
the server's side (the serve process and its workers).

Debian's ``wrk`` is C with one event loop: about 0.1 ms of CPU a request here, against 0.6 ms for the Python threads
(urllib, JSON, the GIL). On 2 cores the generator shares the cores with the workers, so its cost caps what a second
worker can add: ``2w / (w + c)`` for ``w`` the server's and ``c`` the generator's CPU a request.

Example:
    >>> wrk_load("http://127.0.0.1:8765", ["etcd has no leader"], 16, 4.0, Path("/tmp"))  # doctest: +SKIP
    {'clients': 16, 'requests': 431, 'seconds': 4.01, 'rps': 107.48, 'p50_ms': 147.2, ...}
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import psutil


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


def load(url: str, queries: Sequence[str], clients: int, requests: int, timeout_s: float = 60.0) -> dict[str, Any]:
    """``requests`` lookups (``POST /v1/lookup``, the queries in turn) from ``clients`` threads at once, each request
    on a connection of its own (as Alertmanager and the CLI send them): requests/s over the wall time, latency
    p50/p99 in ms, and the requests that did not get a 200."""
    from kb_retrieval.bench.speed import percentile

    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    counter = iter(range(requests))

    def client() -> None:
        while True:
            with lock:
                n = next(counter, None)
            if n is None:
                return
            t0 = time.perf_counter()
            try:
                status, body = post_json(url + "/v1/lookup", {"query": queries[n % len(queries)]}, timeout_s=timeout_s)
            except Exception as exc:  # a refused or reset connection is an error of the run, not of the bench
                status, body = 0, f"{type(exc).__name__}: {exc}"
            elapsed = (time.perf_counter() - t0) * 1000
            with lock:
                if status == 200:
                    latencies.append(elapsed)
                else:
                    errors.append(f"{status}: {str(body)[:200]}")

    threads = [threading.Thread(target=client) for _ in range(clients)]
    cpu = _own_cpu_s()
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    return {
        "clients": clients,
        "requests": requests,
        "seconds": round(wall, 3),
        "rps": round(len(latencies) / wall, 2),
        "p50_ms": round(percentile(latencies, 50), 1) if latencies else None,
        "p99_ms": round(percentile(latencies, 99), 1) if latencies else None,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "generator_cpu_s": round(_own_cpu_s() - cpu, 3),  # this process: only the client threads run meanwhile
    }


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


#: wrk's script: ``POST /v1/lookup`` with the bodies of the file ``KB_WRK_BODIES`` names (one JSON body a line) in
#: turn, each request on a connection of its own (``Connection: close``, as Alertmanager and the CLI send them); at
#: the end one JSON line with the counts and the latency percentiles (microseconds).
WRK_SCRIPT = """\
local requests = {}
local n = 0

function init(args)
  local headers = {["Content-Type"] = "application/json", ["Connection"] = "close"}
  for line in io.lines(os.getenv("KB_WRK_BODIES")) do
    if #line > 0 then requests[#requests + 1] = wrk.format("POST", "/v1/lookup", headers, line) end
  end
end

function request()
  n = n + 1
  return requests[(n - 1) % #requests + 1]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"answered": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d, '
    .. '"p50_us": %d, "p99_us": %d}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def wrk_load(
    url: str, queries: Sequence[str], clients: int, seconds: int, work_dir: Path, timeout_s: float = 60.0
) -> dict[str, Any]:
    """What :func:`load` measures, sent by ``wrk`` (one thread, ``clients`` connections, for ``seconds``, whole
    seconds: wrk takes no fraction): each
    request on a connection of its own, the queries in turn. ``generator_cpu_s``: wrk's own CPU time (from
    ``wait4``). A request that got no 200, or no answer, is an error."""
    if seconds < 1 or seconds != int(seconds):
        raise ValueError(f"wrk runs for whole seconds, at least 1: not {seconds!r}")
    bodies = work_dir / "wrk-bodies.jsonl"
    bodies.write_text("".join(json.dumps({"query": q}) + "\n" for q in queries), encoding="utf-8")
    script = work_dir / "wrk-lookup.lua"
    script.write_text(WRK_SCRIPT, encoding="utf-8")
    command = ["wrk", "-t1", f"-c{clients}", f"-d{int(seconds)}s", "--timeout", f"{timeout_s:g}s", "-s", str(script)]
    proc = subprocess.Popen(
        [*command, url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "KB_WRK_BODIES": str(bodies)},
    )
    assert proc.stdout is not None
    output = proc.stdout.read().decode("utf-8", errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = [line for line in output.splitlines() if line.startswith('{"answered"')]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed (exit status {proc.returncode}): {output[-1000:]}")
    found = json.loads(lines[-1])
    seconds_run = found["duration_us"] / 1e6
    failed = sum(found[kind] for kind in ("connect", "read", "write", "timeout", "status"))
    ok = found["answered"] - found["status"]
    return {
        "clients": clients,
        "requests": found["answered"],
        "seconds": round(seconds_run, 3),
        "rps": round(ok / seconds_run, 2),
        "p50_ms": round(found["p50_us"] / 1000, 1) if ok else None,
        "p99_ms": round(found["p99_us"] / 1000, 1) if ok else None,
        "errors": failed,
        "first_error": ", ".join(
            f"{kind} {found[kind]}" for kind in ("connect", "read", "write", "timeout", "status") if found[kind]
        )
        or None,
        "generator_cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
    }


def process_tree_cpu_s(pid: int) -> dict[int, float]:
    """CPU time (user + system, seconds) of ``pid`` and each process under it, by pid (processes gone are left out)."""
    found: dict[int, float] = {}
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return found
    for proc in tree:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        found[proc.pid] = times.user + times.system
    return found


Generator = Literal["wrk", "python"]


def pick_generator(asked: str = "auto") -> Generator:
    """``wrk`` when asked for or, for ``auto``, when it is on ``PATH``; else ``python`` (:func:`load`)."""
    if asked not in ("auto", "wrk", "python"):
        raise ValueError(f"unknown load generator {asked!r}: auto, wrk or python")
    if asked == "wrk" and shutil.which("wrk") is None:
        raise ValueError("wrk is not on PATH (Debian: apt-get install wrk), or use the python generator")
    if asked == "auto":
        return "wrk" if shutil.which("wrk") else "python"
    return asked  # type: ignore[return-value]
