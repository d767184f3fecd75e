"""The bench's targets, judged from a report's figures: one small function per target (or group of targets), run in
order by :func:`targets`. Each reads only the figures it needs and says nothing when they were not measured.

Example:
    >>> targets({"speed": {"ingest_throughput": {"ratio": 0.9}}})
    {'ingest/raw_embedding>=0.85': {'ratio': 0.9, 'met': True}}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kb_retrieval.bench.report import SYSTEMS
from kb_retrieval.bench.speed import server_targets

#: Warm lookup p50 at most this share of the stock dense retriever's (its default torch threads and one thread),
#: per query set (issue 21).
LATENCY_TARGETS = {"alerts": 0.5, "questions": 0.5}
#: A ``KnowledgeLookup`` on the runbooks corpus builds within this many seconds, the model loaded (issue 21).
BUILD_TARGET_S = 1.5
#: Construction at the largest scale size once the index version's snapshot exists (issue 21: 100k chunks, 5 s).
SCALE_BUILD_TARGET_S = 5.0
#: Issue 21's scale targets: Lite lookup p50 at the largest size (100k chunks), in ms; on a server, lookup p50 at the
#: smallest size over (query embedding + raw vector search), the largest size's p50 over the smallest's, p95 over p50.
LITE_LARGEST_P50_MS = 150.0
SERVER_OVER_SEARCH = 2.0
SERVER_LARGEST_OVER_SMALLEST = 1.5
SERVER_P95_OVER_P50 = 3.0
#: Questions in an engineer's own words (no alert name), over the runbooks and in MIXED (issue 12, raised by 20).
PARAPHRASE_SET = "runbooks-paraphrase-dev"
PARAPHRASE_HIT1 = {"runbooks": 0.70, "mixed": 0.72}  # issue 20 (issue 12 asked 0.62 / 0.58)
PARAPHRASE_HIT5 = 0.88
#: Issue 20's found decision over the runbooks: answerable found=true at least this share, with unanswerable
#: found=false at least that share (7 of 8).
PARAPHRASE_FOUND, PARAPHRASE_REFUSED = 0.97, 0.875
#: Issue 39: ``serve`` with one worker per core (2 here) over one worker, in requests/s at this many concurrent
#: clients, with the most workers' p99 at most this many times their p50, and no request failed.
SERVE_SCALING, SERVE_SCALING_CLIENTS, SERVE_P99_OVER_P50 = 1.7, 16, 3.0
#: Issue 39: a whole ``kb-retrieval ingest`` of the runbooks into a fresh state at most this share of the time the stock
#: LlamaIndex path (``VectorStoreIndex``'s ``HuggingFaceEmbedding``, torch) spends only embedding them.
INGEST_OVER_STOCK = 0.58
#: Issue 37: the share of relevance-high lookups that are right, on every set.
RELEVANCE_HIGH_RIGHT = 0.90
#: Issue 37: the documentation questions' hit@1 at least the best stock retriever's plus this, and at least the floor.
DOCS_SET, DOCS_OVER_STOCK, DOCS_FLOOR = "prometheus-docs-dev", 0.10, 0.80
#: Issue 37: the right document in the agent's context pack for at least this share of answerable cases, every set.
RIGHT_DOC_IN_PACK = 0.95
#: Issue 37: unanswerable refused at least this share (6 of 8) with answerable found at least that share, on these
#: sets in these settings (the paraphrases' unanswerable questions were written for the runbooks: in the mixed
#: setting the awesome-alerts pages hold alert rules on several of their topics, Kafka lag or GitLab CI, as issue 20's
#: found target reads them over the runbooks only).
REFUSED_SETS, REFUSED, REFUSED_FOUND = {"prometheus-docs": DOCS_SET, "runbooks": PARAPHRASE_SET}, 0.75, 0.95

Target = Callable[[dict[str, Any]], dict[str, Any]]


def _quality(report: dict[str, Any]) -> dict[str, Any]:
    quality: dict[str, Any] = report.get("quality") or {}
    return quality


def _speed(report: dict[str, Any]) -> dict[str, Any]:
    speed: dict[str, Any] = report.get("speed") or {}
    return speed


def mixed_dev_hit1(report: dict[str, Any]) -> dict[str, Any]:
    """Alert texts over the runbooks and awesome-alerts together: hit@1 at least 0.80."""
    mixed_dev = _quality(report).get("mixed", {}).get("runbooks-alerts-dev")
    if not mixed_dev:
        return {}
    value = mixed_dev["lookup_knowledge"]["hit@1"]
    return {"mixed_dev_hit@1>=0.80": {"value": value, "met": value >= 0.80}}


def paraphrase(report: dict[str, Any]) -> dict[str, Any]:
    """Questions in an engineer's own words, per setting: hit@1, hit@5, and over the runbooks found / refused."""
    out: dict[str, Any] = {}
    for setting, least in PARAPHRASE_HIT1.items():
        found_set = _quality(report).get(setting, {}).get(PARAPHRASE_SET)
        if not found_set:
            continue
        ours = found_set["lookup_knowledge"]
        out[f"paraphrase_hit@1>={least}_{setting}"] = {"value": ours["hit@1"], "met": ours["hit@1"] >= least}
        hit5 = ours.get("hit@5")
        out[f"paraphrase_hit@5>={PARAPHRASE_HIT5}_{setting}"] = {
            "value": hit5,
            "met": hit5 is not None and hit5 >= PARAPHRASE_HIT5,
        }
        if setting == "runbooks":
            found, refused = ours.get("answerable_found_true"), ours.get("no_answer_found_false")
            out[f"paraphrase_found>={PARAPHRASE_FOUND}_refused>={PARAPHRASE_REFUSED}_runbooks"] = {
                "found": found,
                "refused": refused,
                "met": found is not None
                and refused is not None
                and found >= PARAPHRASE_FOUND
                and refused >= PARAPHRASE_REFUSED,
            }
    return out


def never_below_stock(report: dict[str, Any]) -> dict[str, Any]:
    """On every set, hit@1 never below the best stock retriever's."""
    quality = _quality(report)
    if not quality:
        return {}
    below = []
    for setting, sets in quality.items():
        for name, systems in sets.items():
            ours = systems["lookup_knowledge"]["hit@1"]
            best = max((systems[s]["hit@1"] for s in SYSTEMS[1:] if systems[s]["hit@1"] is not None), default=None)
            if ours is not None and best is not None and ours < best:
                below.append(f"{setting}/{name}: {ours} < {best}")
    return {"never_below_best_stock_hit@1": {"met": not below, "below": below}}


def no_answer_found_false(report: dict[str, Any]) -> dict[str, Any]:
    """Unanswerable questions: found=false for most of them on every set."""
    quality = _quality(report)
    if not quality:
        return {}
    no_answer = [
        systems["lookup_knowledge"]["no_answer_found_false"]
        for sets in quality.values()
        for systems in sets.values()
        if systems["lookup_knowledge"]["no_answer_found_false"] is not None
    ]
    share = min(no_answer, default=None)
    return {"no_answer_mostly_found_false": {"min_share": share, "met": share is not None and share > 0.5}}


def filter_never_excludes_every_expected(report: dict[str, Any]) -> dict[str, Any]:
    """Issue 20: a category filter never excludes every expected document."""
    quality = _quality(report)
    if not quality:
        return {}
    excluded = {
        f"{setting}/{name}": count
        for setting, sets in quality.items()
        for name, systems in sets.items()
        if (count := systems["lookup_knowledge"].get("filter_excluded_all_expected"))
    }
    return {"filter_excluded_every_expected==0": {"excluded": excluded, "met": not excluded}}


def relevance_high_right(report: dict[str, Any]) -> dict[str, Any]:
    """Issue 37: relevance ``high`` means right nearly always, on every set."""
    quality = _quality(report)
    if not quality:
        return {}
    high = {
        f"{setting}/{name}": level["precision"]
        for setting, sets in quality.items()
        for name, systems in sets.items()
        if (level := (systems["lookup_knowledge"].get("relevance_calibration") or {}).get("high"))
    }
    return {
        f"relevance_high_right>={RELEVANCE_HIGH_RIGHT}": {
            "below": {k: v for k, v in high.items() if v < RELEVANCE_HIGH_RIGHT},
            "met": bool(high) and all(v >= RELEVANCE_HIGH_RIGHT for v in high.values()),
        }
    }


def documentation(report: dict[str, Any]) -> dict[str, Any]:
    """Issue 37: the documentation questions' hit@1 at least the best stock retriever's + 0.10, and at least 0.80."""
    systems = _quality(report).get("prometheus-docs", {}).get(DOCS_SET)
    if not systems:
        return {}
    ours = systems["lookup_knowledge"]["hit@1"]
    best = max(systems[s]["hit@1"] for s in SYSTEMS[1:] if systems[s]["hit@1"] is not None)
    need = round(max(best + DOCS_OVER_STOCK, DOCS_FLOOR), 4)
    return {
        f"docs_hit@1>=best_stock+{DOCS_OVER_STOCK:g}_and>={DOCS_FLOOR:g}": {
            "value": ours,
            "best_stock": best,
            "met": ours >= need,
        }
    }


def right_doc_in_pack(report: dict[str, Any]) -> dict[str, Any]:
    """Issue 37: the right document in the agent's context pack for >= 0.95 of the answerable cases of every set."""
    shares = {
        f"{setting}/{name}": share
        for setting, sets in _quality(report).items()
        for name, systems in sets.items()
        if (share := systems["lookup_knowledge"].get("right_doc_in_pack")) is not None
    }
    if not shares:
        return {}
    below = {k: v for k, v in shares.items() if v < RIGHT_DOC_IN_PACK}
    return {f"right_doc_in_pack>={RIGHT_DOC_IN_PACK}_every_set": {"below": below, "met": not below}}


def refused_unanswerable(report: dict[str, Any]) -> dict[str, Any]:
    """Issue 37: on the documentation and the paraphrase questions, unanswerable refused >= 6 of 8 with answerable
    found >= 0.95 (the paraphrases over the runbooks: :data:`REFUSED_SETS`)."""
    out: dict[str, Any] = {}
    for setting, name in REFUSED_SETS.items():
        if not (systems := _quality(report).get(setting, {}).get(name)):
            continue
        ours = systems["lookup_knowledge"]
        refused, found = ours.get("no_answer_found_false"), ours.get("answerable_found_true")
        out[f"refused>={REFUSED:g}_found>={REFUSED_FOUND:g}_{setting}/{name}"] = {
            "refused": refused,
            "found": found,
            "met": refused is not None and found is not None and refused >= REFUSED and found >= REFUSED_FOUND,
        }
    return out


def chunks_within_model(report: dict[str, Any]) -> dict[str, Any]:
    """Issue 37: no stored chunk longer than the embedding model's maximum word pieces, on every corpus."""
    over = {
        setting: count
        for setting, sets in _quality(report).items()
        for systems in sets.values()
        if (count := systems["lookup_knowledge"].get("chunks_over_model_max")) is not None
    }
    if not over:
        return {}
    return {"chunks_over_model_max==0": {"over": {k: v for k, v in over.items() if v}, "met": not any(over.values())}}


def warm_latency(report: dict[str, Any]) -> dict[str, Any]:
    """Warm lookup p50 over the stock dense retriever's, per query set (default threads and one thread)."""
    out: dict[str, Any] = {}
    latency_sets = warm_latency_sets(_speed(report).get("warm_latency"))
    for name, bound in LATENCY_TARGETS.items():
        if figures := latency_sets.get(name):
            for suffix in ("", "_1_thread"):
                if (ratio := figures.get(f"p50_ratio{suffix}")) is not None:
                    out[f"warm_p50<={bound}x_stock_dense{suffix}_{name}"] = {"ratio": ratio, "met": ratio <= bound}
    return out


def lookup_build(report: dict[str, Any]) -> dict[str, Any]:
    """A lookup over the runbooks builds within :data:`BUILD_TARGET_S`."""
    if not (start := _speed(report).get("start_up")):
        return {}
    build = start["lookup_build_s"]
    return {f"lookup_build<={BUILD_TARGET_S}s_runbooks": {"seconds": build, "met": build <= BUILD_TARGET_S}}


def scale_build(report: dict[str, Any]) -> dict[str, Any]:
    """Issue 21: a start at the largest Lite size within :data:`SCALE_BUILD_TARGET_S`, from the snapshot."""
    lite_sizes = _speed(report).get("scale") or []
    if not lite_sizes or "lookup_rebuild_s" not in lite_sizes[-1]:
        return {}
    largest = lite_sizes[-1]
    return {
        f"lookup_build<={SCALE_BUILD_TARGET_S}s_{largest['chunks']}_chunks": {
            "seconds": largest["lookup_rebuild_s"],
            "state": largest["lookup_rebuild_state"],
            "met": largest["lookup_rebuild_s"] <= SCALE_BUILD_TARGET_S
            and largest["lookup_rebuild_state"] == "snapshot",
        }
    }


def ingest_throughput(report: dict[str, Any]) -> dict[str, Any]:
    """Ingest at least 0.85 of the raw embedding rate; a whole ``kb-retrieval ingest`` within
    :data:`INGEST_OVER_STOCK` of the stock path's torch embedding alone (issue 39), when that was measured."""
    if not (throughput := _speed(report).get("ingest_throughput")):
        return {}
    out = {"ingest/raw_embedding>=0.85": {"ratio": throughput["ratio"], "met": throughput["ratio"] >= 0.85}}
    if (ratio := throughput.get("stock_ratio")) is not None:
        out[f"ingest<={INGEST_OVER_STOCK}x_stock_torch_embedding"] = {
            "ratio": ratio,
            "ingest_s": throughput["cli_ingest_wall_s"],
            "stock_s": throughput["stock_torch_embedding_seconds"],
            "met": ratio <= INGEST_OVER_STOCK,
        }
    return out


def lite_largest_p50(report: dict[str, Any]) -> dict[str, Any]:
    """Issue 21: Lite lookup p50 at the largest size (100k text-bearing chunks)."""
    if not (lite_sizes := _speed(report).get("scale") or []):
        return {}
    largest = lite_sizes[-1]
    name = f"lite_p50_{largest['chunks']}_chunks<={LITE_LARGEST_P50_MS:g}ms"
    return {name: {"ms": largest["p50_ms"], "met": largest["p50_ms"] <= LITE_LARGEST_P50_MS}}


def server_scale(report: dict[str, Any]) -> dict[str, Any]:
    """Issue 21's targets on a server, from the sizes measured (smallest first)."""
    out: dict[str, Any] = {}
    sizes = (_speed(report).get("scale_server") or {}).get("sizes") or []
    if not sizes:
        return out
    smallest, largest = sizes[0], sizes[-1]
    if "stage_mean_ms" in smallest:
        ratio = server_targets(sizes)["p50_over_embed_plus_search"][str(smallest["chunks"])]
        out[f"server_p50_{smallest['chunks']}_chunks<={SERVER_OVER_SEARCH:g}x_embed+search"] = {
            "ratio": ratio,
            "met": ratio <= SERVER_OVER_SEARCH,
        }
    if len(sizes) >= 2:
        ratio = round(largest["p50_ms"] / smallest["p50_ms"], 3)
        name = f"server_p50_{largest['chunks']}_chunks<={SERVER_LARGEST_OVER_SMALLEST:g}x_{smallest['chunks']}"
        out[name] = {"ratio": ratio, "met": ratio <= SERVER_LARGEST_OVER_SMALLEST}
    worst = max(round(s["p95_ms"] / s["p50_ms"], 3) for s in sizes)
    out[f"server_p95<={SERVER_P95_OVER_P50:g}x_p50"] = {"ratio": worst, "met": worst <= SERVER_P95_OVER_P50}
    return out


def serve_workers(report: dict[str, Any]) -> dict[str, Any]:
    """Issue 39: ``serve --workers N`` at :data:`SERVE_SCALING_CLIENTS` clients: at least :data:`SERVE_SCALING`
    times one worker's requests/s, p99 within :data:`SERVE_P99_OVER_P50` x p50, zero errors in the whole run."""
    if not (figures := _speed(report).get("serve_throughput")):
        return {}
    most, clients = max(figures["workers"]), str(SERVE_SCALING_CLIENTS)
    scaling = (figures.get(f"scaling_{most}_over_1") or {}).get(clients)
    best = figures["best"].get(f"{most}x{clients}") or {}
    tail = round(best["p99_ms"] / best["p50_ms"], 2) if best.get("p50_ms") else None
    met = scaling is not None and scaling >= SERVE_SCALING and tail is not None and tail <= SERVE_P99_OVER_P50
    name = f"serve_{most}_workers>={SERVE_SCALING:g}x_1_at_{clients}_clients_p99<={SERVE_P99_OVER_P50:g}x_p50_no_errors"
    return {
        name: {
            "scaling": scaling,
            "p99_over_p50": tail,
            "errors": figures["errors"],
            "met": met and figures["errors"] == 0,
        }
    }


#: Every target, in the order a report lists them.
TARGETS: tuple[Target, ...] = (
    mixed_dev_hit1,
    paraphrase,
    never_below_stock,
    no_answer_found_false,
    filter_never_excludes_every_expected,
    relevance_high_right,
    documentation,
    right_doc_in_pack,
    refused_unanswerable,
    chunks_within_model,
    warm_latency,
    lookup_build,
    scale_build,
    ingest_throughput,
    lite_largest_p50,
    server_scale,
    serve_workers,
)


def targets(report: dict[str, Any]) -> dict[str, Any]:
    """Every target judged from ``report``'s figures: name -> the figures it read and ``met``."""
    out: dict[str, Any] = {}
    for target in TARGETS:
        out.update(target(report))
    return out


def warm_latency_sets(latency: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The warm-latency figures per query set; a report written before there were sets holds alert texts only."""
    if not latency:
        return {}
    if "p50_ratio" in latency:
        return {"alerts": latency}
    return {name: latency[name] for name in (*LATENCY_TARGETS, *latency) if isinstance(latency.get(name), dict)}
