"""The serve bench's load generators against a real server: wrk (skipped where it is not installed) and the Python
threads each answer with the same figures, every request a 200, the generator's own CPU counted, and the server's
CPU read from its process tree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kb_retrieval.bench.load import load, pick_generator, process_tree_cpu_s, wrk_load
from kb_retrieval.bench.serve import served_throughput
from tests.service.conftest import CONNECTIONS, REDIS_ALERT

QUERIES = [REDIS_ALERT, CONNECTIONS, "MySQL replica lag behind source"]
FIGURES = {"clients", "requests", "seconds", "rps", "p50_ms", "p99_ms", "errors", "first_error", "generator_cpu_s"}


def _server_cpu(served) -> float:
    assert served.proc is not None
    return sum(process_tree_cpu_s(served.proc.pid).values())


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (Debian: apt-get install wrk)")
def test_wrk_sends_lookups_and_counts_its_own_cpu(served, tmp_path: Path) -> None:
    before = _server_cpu(served)
    figures = wrk_load(served.url, QUERIES, 2, 2, tmp_path)
    assert set(figures) == FIGURES
    assert figures["errors"] == 0 and figures["first_error"] is None, figures
    assert figures["requests"] > 0 and figures["rps"] > 0 and 0 < figures["p50_ms"] <= figures["p99_ms"]
    assert 0 < figures["generator_cpu_s"] < figures["seconds"]
    assert _server_cpu(served) > before  # the lookups ran in the server's processes


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (Debian: apt-get install wrk)")
def test_wrk_counts_what_the_server_refuses_as_errors(served, tmp_path: Path) -> None:
    figures = wrk_load(served.url, ["   "], 1, 1, tmp_path)  # an empty query: 422 every time
    assert figures["requests"] > 0 and figures["errors"] == figures["requests"] and figures["rps"] == 0
    assert figures["p50_ms"] is None and "status" in figures["first_error"]


def test_wrk_runs_whole_seconds(tmp_path: Path) -> None:
    for seconds in (0, 0.5, 2.5):
        with pytest.raises(ValueError, match="whole seconds"):
            wrk_load("http://127.0.0.1:9", QUERIES, 1, seconds, tmp_path)  # type: ignore[arg-type]


def test_python_threads_send_lookups_and_count_their_cpu(served) -> None:
    figures = load(served.url, QUERIES, 2, 6)
    assert set(figures) == FIGURES
    assert figures["requests"] == 6 and figures["errors"] == 0 and figures["generator_cpu_s"] > 0


def test_a_generator_is_chosen_by_what_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kb_retrieval.bench.load.shutil.which", lambda name: None)
    assert pick_generator() == "python" and pick_generator("python") == "python"
    with pytest.raises(ValueError, match="wrk is not on PATH"):
        pick_generator("wrk")
    with pytest.raises(ValueError, match="unknown load generator"):
        pick_generator("ab")
    monkeypatch.setattr("kb_retrieval.bench.load.shutil.which", lambda name: "/usr/bin/wrk")
    assert pick_generator() == "wrk"


def test_the_throughput_bench_records_the_generator_and_the_cpu_split(state_copy, tmp_path: Path) -> None:
    figures = served_throughput(
        state_copy("load-generators"), QUERIES, tmp_path, workers=(1,), clients=(2,), rounds=1, requests=6, seconds=1
    )
    best = figures["best"]["1x2"]
    assert figures["generator"] == pick_generator() and figures["errors"] == 0
    assert best["server_cpu_ms"] > 0 and best["generator_cpu_ms"] > 0 and best["cores_busy"] > 0
