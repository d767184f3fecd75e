"""``kb-retrieval bench``: run the quality and speed benchmarks, write ``reports/bench/`` and the README section.

Quality figures are deterministic for the same inputs; speed figures are measurements of this machine and vary
between runs. Reports hold no timestamps, absolute paths or machine names.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from kb_retrieval.bench import PARTS
from kb_retrieval.bench.quality import SETTINGS, read_cases, run_setting
from kb_retrieval.bench.speed import (
    ingest_throughput,
    latency_at_scale,
    server_scale,
    start_up,
    warm_latency,
)
from kb_retrieval.bench.summary import QUESTIONS_SET, summary_markdown, update_readme, write_report
from kb_retrieval.bench.targets import targets
from kb_retrieval.config import KBSettings

#: The serve part's concurrency levels: clients sending at once, each through ``serve --workers 1`` and N.
SERVE_CLIENTS = (1, 4, 16)
#: A Milvus server for the scale part; unset, the bench starts its own (PyPI ``milvus``) and stops it after.
BENCH_MILVUS_URI_ENV = "KB_BENCH_MILVUS_URI"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_bench(shared: Path, out_dir: Path, state_root: Path, *, parts: set[str], readme: Path | None) -> dict[str, Any]:
    """Run the bench ``parts`` over the corpora and golden sets in ``shared``; write the report into ``out_dir`` and
    its summary into ``readme``; return the report."""
    from kb_retrieval.indexing.embeddings import load_embed_model

    started = time.perf_counter()
    embed_model = load_embed_model()
    previous = out_dir / "bench.json"
    # Running some parts keeps the other parts' figures from the last run.
    report: dict[str, Any] = {"quality": {}, "speed": {}}
    if set(parts) != set(PARTS) and previous.is_file():
        report.update(previous_figures(previous))
    runbooks = shared / "corpora" / "runbooks"
    queries = [c.query for c in read_cases(shared / "golden" / "runbooks-alerts-dev.jsonl")][:60]
    # Question-style queries on the same collection: people's wording (questions, symptoms in their own words).
    questions = [c.query for c in read_cases(shared / "golden" / QUESTIONS_SET)]
    if "quality" in parts:
        report["scoring_profile"] = KBSettings().scoring.version  # what the quality lookups read (KB_SCORING_PROFILE)
        for setting in SETTINGS:
            report["quality"][setting.name] = run_setting(setting, shared, state_root, embed_model, _log)
    if "speed" in parts:
        # The settings a user has by default: on Milvus Lite, the memory plan.
        settings = KBSettings(state_dir=state_root / "runbooks")
        from kb_retrieval.indexing.ingest import ingest

        ingest([runbooks], settings, embed_model=embed_model, progress=True)
        report["speed"]["warm_latency"] = warm_latency(
            settings, {"alerts": queries, "questions": questions}, embed_model
        )
        _log(f"[speed] warm latency: {report['speed']['warm_latency']}")
        report["speed"]["start_up"] = start_up(settings, embed_model, queries[0])
        _log(f"[speed] start-up: {report['speed']['start_up']}")
        from kb_retrieval.bench.serve import served_latency

        report["speed"]["served_latency"] = served_latency(settings, queries[:30], state_root)
        _log(f"[speed] through kb-retrieval serve: {report['speed']['served_latency']}")
        throughput_dir = state_root / "throughput"
        _remove_tree(throughput_dir)
        report["speed"]["ingest_throughput"] = ingest_throughput(runbooks, throughput_dir, embed_model)
        _log(f"[speed] ingest throughput: {report['speed']['ingest_throughput']}")
    if "scale" in parts:
        scale_dir = state_root / "scale"
        _remove_tree(scale_dir)
        report["speed"]["scale"] = latency_at_scale(runbooks, scale_dir, queries[:30], embed_model, log=_log)
        report["speed"]["scale_server"] = run_server_scale(runbooks, state_root, queries[:30], embed_model)
    if "serve" in parts:
        report["speed"]["serve_throughput"] = run_serve_throughput(runbooks, state_root, queries, embed_model)
    report["targets"] = targets(report)
    report[seconds_key(parts)] = round(time.perf_counter() - started, 1)
    write_report(report, out_dir)
    if readme is not None and report["quality"] and report["speed"]:
        update_readme(readme, summary_markdown(report))
    print(summary_markdown(report))
    return report


def previous_figures(path: Path) -> dict[str, Any]:
    """The figures of the last run in ``path`` (bench.json), settings and golden sets in a full run's order
    (bench.json is written with sorted keys), with the time of each earlier run."""
    kept = json.loads(path.read_text(encoding="utf-8"))
    quality = kept.get("quality") or {}
    return {
        "quality": {
            s.name: {g: quality[s.name][g] for g in s.golden_sets if g in quality[s.name]}
            for s in SETTINGS
            if s.name in quality
        },
        "speed": kept.get("speed") or {},
        **{k: v for k, v in kept.items() if k.startswith("seconds_") or k == "scoring_profile"},
    }


def seconds_key(parts: set[str]) -> str:
    """Where a run records its duration: a run of some parts keeps the full run's total and records its own apart."""
    return "seconds_total" if set(parts) == set(PARTS) else "seconds_" + "+".join(p for p in PARTS if p in parts)


def run_server_scale(runbooks: Path, state_root: Path, queries: list[str], embed_model: Any) -> dict[str, Any]:
    """Scale on a Milvus server: the one ``KB_BENCH_MILVUS_URI`` names (the bench collection dropped first), else
    a Milvus 2.3 standalone server the bench starts on a fresh data dir and stops, whole process tree, after."""
    import importlib.metadata
    import os

    from pymilvus import MilvusClient

    state_dir = state_root / "scale-server"
    _remove_tree(state_dir)
    uri = os.environ.get(BENCH_MILVUS_URI_ENV)
    if uri:
        settings = KBSettings(milvus_uri=uri)
        client = MilvusClient(uri=uri, token=settings.storage.milvus_token.get_secret_value())
        for name in ("kb_bench_scale", "kb_bench_scale_l0", "kb_bench_scale_docs", "kb_bench_scale_meta"):
            if client.has_collection(name):
                client.drop_collection(name)
        figures = server_scale(runbooks, state_dir, queries, embed_model, uri, log=_log)
        figures["server"] = f"{client.get_server_version()} at {BENCH_MILVUS_URI_ENV}"
        return figures
    from kb_retrieval.bench.milvus_server import MilvusServer

    data_dir = state_root / "milvus-server"
    _remove_tree(data_dir)
    with MilvusServer(data_dir) as server:
        _log(f"[scale] Milvus server up at {server.uri} in {server.startup_seconds:.0f} s")
        figures = server_scale(runbooks, state_dir, queries, embed_model, server.uri, log=_log)
        release = importlib.metadata.version("milvus")
        figures["server"] = f"Milvus {release} standalone (PyPI milvus), started by the bench"
    return figures


def run_serve_throughput(
    runbooks: Path, state_root: Path, queries: list[str], embed_model: Any, *, workers: int | None = None
) -> dict[str, Any]:
    """``kb-retrieval serve`` under 1, 4 and 16 concurrent clients with one worker process and with ``workers`` (one
    per core by default, at least 2): requests/s, p50 and p99 per level and the CPU split per request
    (:func:`~kb_retrieval.bench.serve.served_throughput`; load from ``wrk`` when it is on ``PATH``), on the default
    settings over the runbooks (ingested into ``state_root/runbooks``, unchanged when the speed part already did)."""
    import os

    from kb_retrieval.bench.serve import served_throughput
    from kb_retrieval.indexing.ingest import ingest
    from kb_retrieval.indexing.milvus import release_lite

    settings = KBSettings(state_dir=state_root / "runbooks")
    ingest([runbooks], settings, embed_model=embed_model, progress=True)
    release_lite(settings)  # one process per Lite data dir: the servers', from here on
    most = workers or max(2, os.cpu_count() or 2)
    figures = served_throughput(
        settings.storage.state_dir, queries, state_root, workers=(1, most), clients=SERVE_CLIENTS, log=_log
    )
    if figures["generator"] != "wrk":
        _log(
            "[serve] wrk is not on PATH: the load came from Python threads in this process, about 6x wrk's CPU a "
            "request, taken from the cores the workers share (Debian: apt-get install wrk)"
        )
    figures.pop("runs")  # each round's figures are in the log; the report keeps the best round per level
    figures["queries"] = len(queries)
    figures["cores"] = os.cpu_count()
    return figures


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
