"""The bench's words: the README section (:func:`summary_markdown`), ``bench.json`` and ``bench.md`` with their
charts (:func:`write_report`), and the README update between its markers. Figures in, Markdown out: no measuring here
(that is :mod:`kb_retrieval.bench.run` and the part modules)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kb_retrieval.bench.report import SYSTEMS, write_bench_charts
from kb_retrieval.bench.targets import warm_latency_sets
from kb_retrieval.reporting import replace_marked_section
from kb_retrieval.settings import EvidenceSettings

#: The question-style query set of the warm-latency figures (alert texts: runbooks-alerts-dev).
QUESTIONS_SET = "runbooks-paraphrase-dev.jsonl"
README_START = "<!-- bench:start -->"
README_END = "<!-- bench:end -->"


def summary_markdown(report: dict[str, Any]) -> str:
    """The README's bench section: hit@1 per setting and golden set, then the speed figures."""
    lines = [
        "| setting | golden set | "
        + " | ".join(f"{s} hit@1" for s in SYSTEMS)
        + " | lookup_knowledge no-answer found=false | lookup_knowledge strong@1 |"
    ]
    lines.append("| --- | --- | " + " | ".join("---:" for _ in SYSTEMS) + " | ---: | ---: |")
    for setting, sets in (report.get("quality") or {}).items():
        for name, systems in sets.items():
            cells = [_fmt(systems[s]["hit@1"]) for s in SYSTEMS]
            lines.append(
                f"| {setting} | {name} | "
                + " | ".join(cells)
                + f" | {_fmt(systems['lookup_knowledge']['no_answer_found_false'])}"
                + f" | {_fmt(systems['lookup_knowledge'].get('strong@1'))} |"
            )
    lines += profile_lines(report)
    speed = report.get("speed") or {}
    if latency := speed.get("warm_latency"):
        encoder = latency.get("query_encoder", "the embedding model")
        lines.append("")
        for name, figures in warm_latency_sets(latency).items():
            lines.append(
                f"Warm lookup latency, {LATENCY_SET_WORDS.get(name, name)} ({figures['queries']} lookups"
                + (f" of {figures['distinct_queries']} distinct queries" if "distinct_queries" in figures else "")
                + f"): lookup_knowledge p50 {figures['lookup_knowledge_ms']['p50']} ms / p95 "
                f"{figures['lookup_knowledge_ms']['p95']} ms; stock VectorIndexRetriever on the same collection p50 "
                f"{figures['stock_dense_ms']['p50']} ms / p95 {figures['stock_dense_ms']['p95']} ms; ratio "
                f"{figures['p50_ratio']}"
                + (
                    f" (stock pinned to one torch thread: p50 {one['p50']} ms, ratio {figures['p50_ratio_1_thread']})"
                    if (one := figures.get("stock_dense_1_thread_ms"))
                    else ""
                )
                + f". Plan {latency.get('lookup_plan', 'milvus')}; queries embedded by {encoder}; "
                + ("p50" if "stage_p50_ms" in figures else "mean")
                + " ms per stage: "
                + ", ".join(f"{k} {v}" for k, v in (figures.get("stage_p50_ms") or figures["stage_mean_ms"]).items())
                + (f"; not under any stage p50 {u['p50']} ms" if (u := figures.get("unclocked_ms")) else "")
                + "."
            )
    if start := speed.get("start_up"):
        lines.append(
            f"Start-up: a KnowledgeLookup on the runbooks corpus builds in {start['lookup_build_s']} s (model "
            f"loaded); a CLI lookup from nothing takes {start['cli_lookup_wall_s']} s wall, "
            # ru_maxrss / 1024 (kb_retrieval.bench.speed.whole_process): MiB, whatever the key's suffix says.
            f"{start['cli_lookup_peak_rss_mb']} MiB peak RSS (median of {start['runs']})."
        )
    if served := speed.get("served_latency"):
        lines.append(
            f"Through `kb-retrieval serve` (POST /v1/lookup, {served['queries']} warm lookups): p50 "
            f"{served['server_ms']['p50']} ms / p95 {served['server_ms']['p95']} ms against "
            f"{served['in_process_ms']['p50']} / {served['in_process_ms']['p95']} ms in process (the HTTP hop "
            f"{served['http_hop_p50_ms']} ms at p50)."
        )
    if serving := speed.get("serve_throughput"):
        lines.append(serve_throughput_markdown(serving))
    if throughput := speed.get("ingest_throughput"):
        lines += ingest_markdown(throughput)
    if scale := speed.get("scale"):
        lines.append(
            "Lookup p50 by collection size: " + ", ".join(f"{s['chunks']} chunks {s['p50_ms']} ms" for s in scale) + "."
        )
        if "lookup_rebuild_s" in scale[-1]:
            lines.append(
                "KnowledgeLookup construction by collection size, reading every chunk from Milvus / from the state "
                "snapshot of the index version (a later process's start): "
                + ", ".join(f"{s['chunks']} chunks {s['lookup_build_s']} / {s['lookup_rebuild_s']} s" for s in scale)
                + "."
            )
    if server := speed.get("scale_server"):
        lines.append(server_scale_markdown(server, speed.get("scale") or []))
    if report.get("targets"):
        lines += [
            "",
            "Targets: "
            + "; ".join(f"{k}: {'met' if v['met'] else 'NOT met'}" for k, v in report["targets"].items())
            + ".",
        ]
    return "\n".join(lines)


#: How the summary names each warm-latency query set.
LATENCY_SET_WORDS = {
    "alerts": "runbook alert texts (runbooks-alerts-dev)",
    "questions": f"question-style queries ({QUESTIONS_SET.removesuffix('.jsonl')})",
}


def profile_lines(report: dict[str, Any]) -> list[str]:
    """The line naming the scoring profile the quality figures were measured with (none in a report without it)."""
    profile = report.get("scoring_profile")
    return ["", f"Scoring profile {profile} (kb_retrieval.scoring_profile; docs/configuration.md)."] if profile else []


def serve_throughput_markdown(figures: dict[str, Any]) -> str:
    """The serve part in one paragraph: per worker count, requests/s, p50 and p99 at each concurrency level; the
    load generator, and where the CPU went at the most clients (a report from before either says nothing of it)."""
    most = max(figures["workers"])
    levels = "; ".join(
        f"{count} worker{'s' if count > 1 else ''}: "
        + ", ".join(
            f"{n} client{'s' if n > 1 else ''} {best['rps']} req/s p50 {best['p50_ms']} / p99 {best['p99_ms']} ms"
            for n in figures["clients"]
            if (best := figures["best"].get(f"{count}x{n}"))
        )
        for count in figures["workers"]
    )
    scaling = figures.get(f"scaling_{most}_over_1") or {}
    per_level = (
        f"{figures['seconds_per_run']:g} s of wrk per level"
        if figures.get("generator") == "wrk"
        else f"{figures['requests_per_run']} lookups per level from Python threads"
    )
    top = max(figures["clients"])
    split = "; ".join(
        f"{count} worker{'s' if count > 1 else ''}: server {best['server_cpu_ms']} ms, generator "
        f"{best['generator_cpu_ms']} ms ({best['cores_busy']} cores busy)"
        for count in figures["workers"]
        if "server_cpu_ms" in (best := figures["best"].get(f"{count}x{top}") or {})
    )
    return (
        f"Through `kb-retrieval serve --workers W` ({per_level}, one connection a request, the best of "
        f"{figures['rounds']} rounds, worker counts alternating): {levels}. {most} workers over 1: "
        + ", ".join(f"{scaling[str(n)]}x at {n} clients" for n in figures["clients"] if str(n) in scaling)
        + f"; {figures['errors']} errors."
        + (f" CPU a request at {top} clients: {split}." if split else "")
    )


def server_scale_markdown(server: dict[str, Any], lite: list[dict[str, Any]]) -> str:
    """The server's scale figures in one paragraph, beside Lite's index-version cost."""
    sizes = server["sizes"]
    params = ", ".join(f"{k}={v}" for k, v in sorted(server["index"]["params"].items()))
    text = (
        f"On a Milvus server ({server.get('server', 'Milvus')}, {server['index']['type']}"
        + (f" {params}" if params else "")
        + "): lookup p50/p95 by collection size "
        + ", ".join(f"{s['chunks']} chunks {s['p50_ms']}/{s['p95_ms']} ms" for s in sizes)
        + "; vector search alone p50 "
        + ", ".join(f"{s['raw_search_p50_ms']} ms" for s in sizes)
        + " (recall@20 "
        + ", ".join(f"{s['recall@20']}" for s in sizes)
        + f"). Ingest into the server {server['ingest']['ingest_chunks_per_s']} chunks/s "
        f"({server['ingest']['embed_seconds']} s of {server['ingest']['ingest_seconds']} s embedding); filler inserts "
        f"{server.get('filler_insert_rows_per_s', 'n/a')} rows/s, flushes "
        f"{server.get('filler_flush_seconds', 'n/a')} s in all. One index-version check p50: server "
        f"{sizes[-1]['index_version_p50_ms']} ms"
    )
    if lite and "index_version_p50_ms" in lite[-1]:
        text += f", Milvus Lite {lite[-1]['index_version_p50_ms']} ms"
    return text + "."


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def write_report(report: dict[str, Any], out_dir: Path) -> None:
    """Write ``bench.json``, its Markdown and charts into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    charts = write_bench_charts(report, out_dir)
    md = [
        "# Benchmarks",
        "",
        "Document-level quality of `lookup_knowledge` against the stock LlamaIndex retrievers (MarkdownNodeParser + "
        "SentenceSplitter(512) chunks, all-MiniLM-L6-v2, Milvus Lite COSINE, top 20) on the golden sets of "
        "`../shared/golden`, and speed on this machine. Regenerate with `make bench`.",
        "",
        "## Summary",
        "",
        summary_markdown(report),
        "",
        "## Charts",
        "",
        *charts.markdown(),
        "",
        "## Quality in detail",
        "",
    ]
    for setting, sets in (report.get("quality") or {}).items():
        md += [
            f"### {setting}",
            "",
            "| golden set | system | hit@1 | hit@3 | hit@5 | MRR@10 | no-answer found=false | answerable found=true "
            "| strong@1 (judged) | filter excluded every expected | right doc in pack | chunks over model max |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name, systems in sets.items():
            for system in SYSTEMS:
                m = systems[system]
                md.append(
                    f"| {name} | {system} | {_fmt(m['hit@1'])} | {_fmt(m['hit@3'])} | {_fmt(m['hit@5'])} | "
                    f"{_fmt(m['mrr@10'])} | {_fmt(m['no_answer_found_false'])} | {_fmt(m['answerable_found_true'])} | "
                    f"{_strong(m)} | {_excluded(system, m)} | {_fmt(m.get('right_doc_in_pack'))} | "
                    f"{m.get('chunks_over_model_max', 'n/a')} |"
                )
        md.append("")
    md += _found_curves(report)
    md += _relevance_calibration(report)
    if speed := report.get("speed"):
        md += ["## Speed", "", "```json", json.dumps(speed, indent=2, sort_keys=True), "```", ""]
    (out_dir / "bench.md").write_text("\n".join(md), encoding="utf-8")


def _found_curves(report: dict[str, Any]) -> list[str]:
    """The found decision's trade-off per set with unanswerable cases: answerable found=true against unanswerable
    found=false, at each evidence_threshold (the default marked)."""
    md = [
        "## The found decision: answerable found=true / unanswerable found=false by evidence_threshold",
        "",
        "Each case looked up again at each threshold (`KB_EVIDENCE_THRESHOLD`, the knowledge base's calibration off); "
        "the default is in bold, and the threshold the calibration used per set is in the relevance calibration table.",
        "",
    ]
    rows = 0
    default = EvidenceSettings.model_fields["evidence_threshold"].default
    for setting, sets in (report.get("quality") or {}).items():
        for name, systems in sets.items():
            if not (curve := systems["lookup_knowledge"].get("found_curve")):
                continue
            if not rows:
                md.append("| setting | golden set | " + " | ".join(_threshold(p, default) for p in curve) + " |")
                md.append("| --- | --- | " + " | ".join("---:" for _ in curve) + " |")
            cells = [f"{_fmt(p['answerable_found_true'])} / {_fmt(p['no_answer_found_false'])}" for p in curve]
            md.append(f"| {setting} | {name} | " + " | ".join(cells) + " |")
            rows += 1
    return [*md, ""] if rows else []


def _relevance_calibration(report: dict[str, Any]) -> list[str]:
    """The calibration table per set: lookups at each relevance level and how many were right, with the thresholds
    the knowledge base's calibration used (``retrievalTrace.calibration``)."""
    from kb_retrieval.bench.quality import LEVELS

    md = [
        "## Relevance calibration: relevance level vs correct",
        "",
        "lookup_knowledge's lookups at each relevance level: right / lookups (right: found, and the first document is "
        "an expected or acceptable one; an unanswerable case found is wrong); then the thresholds used and where they "
        "came from (measured on the knowledge base, or the settings).",
        "",
        "| setting | golden set | " + " | ".join(LEVELS) + " | found threshold | high from | thresholds from |",
        "| --- | --- | " + " | ".join("---:" for _ in LEVELS) + " | ---: | ---: | --- |",
    ]
    rows = 0
    for setting, sets in (report.get("quality") or {}).items():
        for name, systems in sets.items():
            ours = systems["lookup_knowledge"]
            if not (table := ours.get("relevance_calibration")):
                continue
            cells = [_level(table.get(level)) for level in LEVELS]
            used = ours.get("calibration") or {}
            md.append(
                f"| {setting} | {name} | "
                + " | ".join(cells)
                + f" | {_three_decimals(used.get('evidenceThreshold'))} | "
                f"{_three_decimals(used.get('relevanceHigh'))} | {used.get('source', 'n/a')} |"
            )
            rows += 1
    return [*md, ""] if rows else []


def _three_decimals(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _level(counts: dict[str, Any] | None) -> str:
    return f"{counts['right']}/{counts['lookups']} ({_fmt(counts['precision'])})" if counts else "-"


def _threshold(point: dict[str, float], default: float) -> str:
    value = f"{point['evidence_threshold']:.2f}"
    return f"**{value}**" if abs(point["evidence_threshold"] - default) < 1e-9 else value


def _excluded(system: str, m: dict[str, Any]) -> str:
    """Answerable cases whose L0 category filter excluded every expected document (lookup_knowledge only: the stock
    retrievers filter nothing)."""
    value = m.get("filter_excluded_all_expected")
    return str(value) if system == "lookup_knowledge" and value is not None else "n/a"


def _strong(m: dict[str, Any]) -> str:
    """strong@1 with the number of cases it was judged on (n/a for the stock retrievers: judged on the packed
    evidence the agent receives, which only lookup_knowledge has)."""
    return f"{_fmt(m['strong@1'])} ({m['strong_judged']})" if m.get("strong@1") is not None else "n/a"


def update_readme(readme: Path, summary: str) -> None:
    """Replace the README's bench section (between its markers) with ``summary``."""
    text = readme.read_text(encoding="utf-8")
    new = replace_marked_section(text, README_START, README_END, summary)
    if new != text:
        readme.write_text(new, encoding="utf-8")


def ingest_markdown(throughput: dict[str, Any]) -> list[str]:
    """Ingest against its floor (the same encoder on the same texts) and, when measured, a whole ``kb-retrieval
    ingest`` against the stock path's torch embedding alone."""
    lines = [
        f"Ingest {throughput['ingest_chunks_per_s']} chunks/s vs raw embedding by the same encoder (sorted fp32 "
        f"ONNX) {throughput['raw_embedding_chunks_per_s']} chunks/s (ratio {throughput['ratio']}); a 100k-chunk "
        f"knowledge base at this rate: ~{throughput.get('projected_100k_chunks_minutes', '?')} min."
    ]
    if "stock_ratio" in throughput:
        lines.append(
            f"A whole `kb-retrieval ingest` of the runbooks into a fresh state (a process from nothing, median of "
            f"{throughput['runs']}) takes {throughput['cli_ingest_wall_s']} s, "
            f"{throughput['ingest_beyond_embedding_seconds']} s of its ingest beyond embedding; the stock path "
            f"spends {throughput['stock_torch_embedding_seconds']} s only embedding the same corpus "
            f"({throughput['stock_chunks']} chunks, {throughput['stock_embed_model']}, torch): ratio "
            f"{throughput['stock_ratio']}."
        )
    return lines
