"""The bench report: targets judged from the figures, deterministic files, the README section replaced in place.

The benchmark itself runs with ``make bench`` (minutes, real corpora); these tests pin what it writes.
"""

from __future__ import annotations

import copy

from kb_retrieval.bench.report import bench_charts
from kb_retrieval.bench.summary import README_END, README_START, summary_markdown, update_readme, write_report
from kb_retrieval.bench.targets import targets
from kb_retrieval.reporting import draw_chart, label_problems


def _systems(ours: float, dense: float, no_answer: float | None = None) -> dict:
    def metrics(hit1: float) -> dict:
        return {
            "hit@1": hit1,
            "hit@3": hit1,
            "hit@5": hit1,
            "mrr@10": hit1,
            "no_answer_found_false": no_answer,
            "answerable_found_true": 1.0,
        }

    return {
        "lookup_knowledge": metrics(ours),
        "stock_dense": metrics(dense),
        "stock_bm25": metrics(0.1),
        "stock_fusion": metrics(0.2),
    }


REPORT = {
    "quality": {
        "runbooks": {"runbooks-alerts-dev": _systems(0.9, 0.8), "runbooks-alerts-instances": _systems(0.7, 0.75, 0.6)},
        "mixed": {"runbooks-alerts-dev": _systems(0.85, 0.4, None)},
    },
    "speed": {
        "warm_latency": {
            "query_encoder": "ONNX int8 export of bundled:all-MiniLM-L6-v2",
            "rounds": 2,
            "alerts": {
                "queries": 4,
                "distinct_queries": 2,
                "lookup_knowledge_ms": {"p50": 20.0, "p95": 30.0},
                "stock_dense_ms": {"p50": 40.0, "p95": 50.0},
                "p50_ratio": 0.5,
                "stage_mean_ms": {"embed": 8.0, "search": 9.0, "trace_write": 1.0},
            },
            "questions": {
                "queries": 6,
                "distinct_queries": 3,
                "lookup_knowledge_ms": {"p50": 14.0, "p95": 20.0},
                "stock_dense_ms": {"p50": 30.0, "p95": 40.0},
                "p50_ratio": 0.467,
                "stage_mean_ms": {"embed": 4.0, "search": 7.0, "trace_write": 0.1},
            },
        },
        "ingest_throughput": {"ratio": 0.8, "ingest_chunks_per_s": 8.0, "raw_embedding_chunks_per_s": 10.0},
        "scale": [{"chunks": 1000, "p50_ms": 20.0, "p95_ms": 25.0, "search_p50_ms": 9.0}],
    },
}


def test_targets_are_judged_from_the_figures():
    judged = targets(REPORT)
    assert judged["mixed_dev_hit@1>=0.80"] == {"value": 0.85, "met": True}
    assert judged["never_below_best_stock_hit@1"] == {
        "met": False,
        "below": ["runbooks/runbooks-alerts-instances: 0.7 < 0.75"],
    }
    assert judged["no_answer_mostly_found_false"] == {"min_share": 0.6, "met": True}
    assert judged["warm_p50<=0.5x_stock_dense_alerts"] == {"ratio": 0.5, "met": True}
    assert judged["warm_p50<=0.5x_stock_dense_questions"] == {"ratio": 0.467, "met": True}
    assert judged["ingest/raw_embedding>=0.85"] == {"ratio": 0.8, "met": False}
    assert not any(name.startswith("paraphrase_") for name in judged)  # no paraphrase set in this report
    slower = copy.deepcopy(REPORT)
    slower["speed"]["warm_latency"]["alerts"]["p50_ratio"] = 0.51
    slower["speed"]["warm_latency"]["questions"]["p50_ratio"] = 0.52
    slower["speed"]["warm_latency"]["questions"]["p50_ratio_1_thread"] = 0.45
    slower["quality"]["mixed"]["runbooks-alerts-dev"]["lookup_knowledge"]["hit@1"] = 0.79
    judged = targets(slower)
    assert not judged["warm_p50<=0.5x_stock_dense_alerts"]["met"] and not judged["mixed_dev_hit@1>=0.80"]["met"]
    assert not judged["warm_p50<=0.5x_stock_dense_questions"]["met"]
    assert judged["warm_p50<=0.5x_stock_dense_1_thread_questions"] == {"ratio": 0.45, "met": True}


def test_latency_of_a_report_from_before_the_query_sets_counts_as_alert_texts():
    old = copy.deepcopy(REPORT)
    flat = {k: v for k, v in REPORT["speed"]["warm_latency"]["alerts"].items() if k != "distinct_queries"}
    old["speed"]["warm_latency"] = {"query_encoder": "x", **flat}
    judged = targets(old)
    assert judged["warm_p50<=0.5x_stock_dense_alerts"] == {"ratio": 0.5, "met": True}
    assert "warm_p50<=0.5x_stock_dense_questions" not in judged
    assert "Warm lookup latency, runbook alert texts (runbooks-alerts-dev) (4 lookups):" in summary_markdown(old)


def test_report_files_are_byte_identical_for_the_same_figures(tmp_path):
    report = {**REPORT, "targets": targets(REPORT)}
    write_report(report, tmp_path / "a")
    write_report(report, tmp_path / "b")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == ["bench.json", "bench.md", "latency_scale.png", "quality_hit1.png"]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    md = (tmp_path / "a" / "bench.md").read_text(encoding="utf-8")
    assert "| mixed | runbooks-alerts-dev | 0.85 | 0.40 | 0.10 | 0.20 | n/a |" in md
    assert "ratio 0.5" in md and "embed 8.0, search 9.0, trace_write 1.0" in md
    assert "runbook alert texts (runbooks-alerts-dev) (4 lookups of 2 distinct queries)" in md
    assert "question-style queries (runbooks-paraphrase-dev) (6 lookups of 3 distinct queries)" in md
    assert "ratio 0.467" in md and "warm_p50<=0.5x_stock_dense_questions: met" in md
    assert str(tmp_path) not in md
    assert "](quality_hit1.png)" in md and "](latency_scale.png)" in md  # linked from the report


# Every golden set of a full run, with the long names that used to overlap under the bars.
FULL = {
    "quality": {
        setting: {name: _systems(0.9, 0.8, 0.1) for name in sets}
        for setting, sets in (
            ("runbooks", [f"runbooks-alerts-{n}" for n in ("dev", "dev-named", "instances", "etcd", "unmapped")]),
            ("mixed", [f"runbooks-alerts-{n}" for n in ("dev", "dev-named", "instances", "etcd", "unmapped")]),
            ("prometheus-docs", ["prometheus-docs-faq"]),
        )
    },
    "speed": {"scale": [{"chunks": c, "p50_ms": c / 100, "search_p50_ms": c / 200} for c in (1e3, 1e4, 1e5)]},
}


def test_charts_have_titles_and_labels_that_do_not_overlap():
    charts = bench_charts(FULL)
    assert [chart.file_name for chart in charts] == ["quality_hit1.png", "latency_scale.png"]
    for chart in charts:
        figure = draw_chart(chart)
        assert chart.title and figure.get_suptitle() == chart.title
        assert label_problems(figure) == [], chart.file_name
    assert len(charts[0].categories) == 11 and "mixed / dev-named" in charts[0].categories


def test_readme_section_is_replaced_in_place(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\n{README_START}\nold figures\n{README_END}\n\n## After\n", encoding="utf-8")
    update_readme(readme, "new figures")
    assert readme.read_text(encoding="utf-8") == f"# Title\n\n{README_START}\nnew figures\n{README_END}\n\n## After\n"
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n", encoding="utf-8")
    update_readme(plain, "new figures")
    assert plain.read_text(encoding="utf-8") == "no markers\n"


def test_strong_is_judged_on_the_packed_text_with_either_breadcrumb_form(tmp_path):
    import json as _json

    from kb_retrieval.bench.quality import SystemScores, read_cases

    golden = tmp_path / "g.jsonl"
    rows = [
        {"case_id": "a", "query": "q", "expected_docs": ["d.md"], "expected_keywords": ["Mitigation step"]},
        {"case_id": "b", "query": "q", "expected_docs": ["d.md"], "expected_breadcrumbs": [{"heading": "Remote"}]},
        {"case_id": "c", "query": "q", "expected_docs": ["d.md"]},  # names nothing: not judged
    ]
    golden.write_text("\n".join(_json.dumps(r) for r in rows), encoding="utf-8")
    a, b, c = read_cases(golden)
    assert b.breadcrumbs == ["Remote"] and not c.judged_strong
    scores = SystemScores()
    scores.add_strong(a, "d.md", "### D > Mitigation\nthe mitigation STEP is here")
    scores.add_strong(b, "other.md", "### Remote")  # wrong document: not strong
    scores.add_strong(c, "d.md", "")
    assert scores.summary()["strong@1"] == 0.5 and scores.summary()["strong_judged"] == 2


def test_paraphrase_targets_per_setting():
    report = copy.deepcopy(REPORT)
    report["quality"]["runbooks"]["runbooks-paraphrase-dev"] = _systems(0.70, 0.4, 0.875)
    report["quality"]["mixed"]["runbooks-paraphrase-dev"] = _systems(0.71, 0.4)
    judged = targets(report)
    assert judged["paraphrase_hit@1>=0.7_runbooks"] == {"value": 0.70, "met": True}
    assert judged["paraphrase_hit@1>=0.72_mixed"] == {"value": 0.71, "met": False}
    assert judged["paraphrase_hit@5>=0.88_runbooks"] == {"value": 0.70, "met": False}  # _systems: hit@5 = hit@1
    found = "paraphrase_found>=0.97_refused>=0.875_runbooks"
    assert judged[found] == {"found": 1.0, "refused": 0.875, "met": True}
    report["quality"]["runbooks"]["runbooks-paraphrase-dev"]["lookup_knowledge"]["answerable_found_true"] = 0.9649
    assert targets(report)[found]["met"] is False  # 55 of 57
    assert found.replace("runbooks", "mixed") not in judged  # the issue asks it over the runbooks


def test_the_any_knowledge_base_targets_are_judged_per_set():
    """Issue 37's done-when figures: documentation hit@1 over the best stock + 0.10 (and 0.80), the right document in
    the pack on every set, unanswerable refused with answerable found on the docs and paraphrase sets, no chunk over
    the model's maximum."""
    report = copy.deepcopy(REPORT)
    report["quality"]["prometheus-docs"] = {"prometheus-docs-dev": _systems(0.95, 0.85, 0.75)}
    for sets in report["quality"].values():
        for systems in sets.values():
            systems["lookup_knowledge"] |= {"right_doc_in_pack": 0.96, "chunks_over_model_max": 0}
    judged = targets(report)
    assert judged["docs_hit@1>=best_stock+0.1_and>=0.8"] == {"value": 0.95, "best_stock": 0.85, "met": True}
    assert judged["right_doc_in_pack>=0.95_every_set"] == {"below": {}, "met": True}
    assert judged["refused>=0.75_found>=0.95_prometheus-docs/prometheus-docs-dev"] == {
        "refused": 0.75,
        "found": 1.0,
        "met": True,
    }
    assert judged["chunks_over_model_max==0"] == {"over": {}, "met": True}
    docs = report["quality"]["prometheus-docs"]["prometheus-docs-dev"]["lookup_knowledge"]
    docs |= {"hit@1": 0.94, "answerable_found_true": 0.94, "chunks_over_model_max": 3}
    report["quality"]["mixed"]["runbooks-alerts-dev"]["lookup_knowledge"]["right_doc_in_pack"] = 0.9
    judged = targets(report)
    assert not judged["docs_hit@1>=best_stock+0.1_and>=0.8"]["met"]  # 0.94 < 0.85 + 0.10
    assert judged["right_doc_in_pack>=0.95_every_set"] == {"below": {"mixed/runbooks-alerts-dev": 0.9}, "met": False}
    assert not judged["refused>=0.75_found>=0.95_prometheus-docs/prometheus-docs-dev"]["met"]  # found 0.94
    assert judged["chunks_over_model_max==0"] == {"over": {"prometheus-docs": 3}, "met": False}
    low = copy.deepcopy(report)
    low["quality"]["prometheus-docs"]["prometheus-docs-dev"] = _systems(0.79, 0.6)
    assert not targets(low)["docs_hit@1>=best_stock+0.1_and>=0.8"]["met"]  # above stock + 0.10, below 0.80
    # The paraphrases' refusals are judged over the runbooks only (their unanswerable questions were written for them).
    report["quality"]["runbooks"]["runbooks-paraphrase-dev"] = _systems(0.7, 0.4, 0.875)
    report["quality"]["mixed"]["runbooks-paraphrase-dev"] = _systems(0.7, 0.4, 0.5)
    judged = targets(report)
    assert judged["refused>=0.75_found>=0.95_runbooks/runbooks-paraphrase-dev"]["met"]
    assert not any(name.startswith("refused>=") and "mixed/" in name for name in judged)


def test_a_filter_that_excluded_every_expected_document_fails_its_target():
    assert targets(REPORT)["filter_excluded_every_expected==0"] == {"excluded": {}, "met": True}
    report = copy.deepcopy(REPORT)
    report["quality"]["mixed"]["runbooks-alerts-dev"]["lookup_knowledge"]["filter_excluded_all_expected"] = 3
    judged = targets(report)["filter_excluded_every_expected==0"]
    assert judged == {"excluded": {"mixed/runbooks-alerts-dev": 3}, "met": False}


def test_found_curve_and_excluded_filters_are_in_the_report(tmp_path):
    report = copy.deepcopy(REPORT)
    ours = report["quality"]["runbooks"]["runbooks-alerts-instances"]["lookup_knowledge"]
    ours["filter_excluded_all_expected"] = 2
    ours["right_doc_in_pack"] = 0.96
    ours["chunks_over_model_max"] = 0
    ours["found_curve"] = [
        {"evidence_threshold": 0.38, "answerable_found_true": 1.0, "no_answer_found_false": 0.2},
        {"evidence_threshold": 0.42, "answerable_found_true": 0.95, "no_answer_found_false": 0.5},
    ]
    write_report({**report, "targets": targets(report)}, tmp_path)
    md = (tmp_path / "bench.md").read_text(encoding="utf-8")
    assert "| setting | golden set | 0.38 | **0.42** |" in md  # the default threshold marked
    assert "| runbooks | runbooks-alerts-instances | 1.00 / 0.20 | 0.95 / 0.50 |" in md
    assert "| runbooks-alerts-instances | lookup_knowledge |" in md
    excluded = [line for line in md.splitlines() if line.startswith("| runbooks-alerts-instances |")]
    # ours, then a stock retriever: filter excluded, right doc in pack, chunks over the model's maximum
    assert excluded[0].endswith("| 2 | 0.96 | 0 |") and excluded[1].endswith("| n/a | n/a | n/a |")


def test_right_doc_in_pack_counts_answerable_cases_only(tmp_path):
    import json as _json

    from kb_retrieval.bench.quality import SystemScores, read_cases

    golden = tmp_path / "g.jsonl"
    rows = [
        {"case_id": "a", "query": "q", "expected_docs": ["d.md"]},
        {"case_id": "b", "query": "q", "expected_docs": ["e.md"], "acceptable_docs": ["f.md"]},
        {"case_id": "c", "query": "q", "expected_docs": []},
    ]
    golden.write_text("\n".join(_json.dumps(r) for r in rows), encoding="utf-8")
    a, b, c = read_cases(golden)
    scores = SystemScores()
    scores.add_pack(a, ["x.md", "d.md"])
    scores.add_pack(b, ["e2.md"])
    scores.add_pack(c, ["x.md"])
    assert scores.summary()["right_doc_in_pack"] == 0.5


def test_relevance_calibration_table_and_target(tmp_path):
    report = copy.deepcopy(REPORT)
    ours = report["quality"]["runbooks"]["runbooks-alerts-instances"]["lookup_knowledge"]
    ours["relevance_calibration"] = {
        "high": {"lookups": 10, "right": 8, "precision": 0.8},
        "none": {"lookups": 2, "right": 0, "precision": 0.0},
    }
    ours["calibration"] = {"source": "measured", "evidenceThreshold": 0.4927, "relevanceHigh": 0.6531}
    judged = targets(report)["relevance_high_right>=0.9"]
    assert judged == {"below": {"runbooks/runbooks-alerts-instances": 0.8}, "met": False}
    write_report({**report, "targets": targets(report)}, tmp_path)
    md = (tmp_path / "bench.md").read_text(encoding="utf-8")
    assert "| setting | golden set | high | medium | low | none | found threshold | high from | thresholds from |" in md
    assert (
        "| runbooks | runbooks-alerts-instances | 8/10 (0.80) | - | - | 0/2 (0.00) | 0.493 | 0.653 | measured |" in md
    )


def test_calibration_table_counts_levels_and_right_first_documents(tmp_path):
    import json as _json

    from kb_retrieval.bench.quality import SystemScores, read_cases

    golden = tmp_path / "g.jsonl"
    rows = [
        {"case_id": "a", "query": "q", "expected_docs": ["d.md"]},
        {"case_id": "b", "query": "q", "expected_docs": ["e.md"], "acceptable_docs": ["f.md"]},
        {"case_id": "c", "query": "q", "expected_docs": []},
    ]
    golden.write_text("\n".join(_json.dumps(r) for r in rows), encoding="utf-8")
    a, b, c = read_cases(golden)
    scores = SystemScores()
    scores.add_level(a, "high", "d.md")
    scores.add_level(b, "high", "x.md")
    scores.add_level(c, "medium", "x.md")  # an unanswerable case found is wrong
    assert scores.summary()["relevance_calibration"] == {
        "high": {"lookups": 2, "right": 1, "precision": 0.5},
        "medium": {"lookups": 1, "right": 0, "precision": 0.0},
    }


def _serving(scaling: float, p99: float, errors: int = 0) -> dict:
    best = {
        f"{w}x{n}": {"clients": n, "rps": 10.0 * w, "p50_ms": 100.0, "p99_ms": p99 if w == 2 else 150.0}
        for w in (1, 2)
        for n in (1, 4, 16)
    }
    return {
        "workers": [1, 2],
        "clients": [1, 4, 16],
        "requests_per_run": 160,
        "rounds": 2,
        "best": best,
        "scaling_2_over_1": {"1": 1.0, "4": 1.5, "16": scaling},
        "errors": errors,
    }


def test_serve_target_reads_scaling_at_16_clients_the_tail_and_errors():
    name = "serve_2_workers>=1.7x_1_at_16_clients_p99<=3x_p50_no_errors"
    met = targets({"speed": {"serve_throughput": _serving(1.8, 250.0)}})[name]
    assert met == {"scaling": 1.8, "p99_over_p50": 2.5, "errors": 0, "met": True}
    assert not targets({"speed": {"serve_throughput": _serving(1.6, 250.0)}})[name]["met"]
    assert not targets({"speed": {"serve_throughput": _serving(1.8, 301.0)}})[name]["met"]
    assert not targets({"speed": {"serve_throughput": _serving(1.8, 250.0, errors=1)}})[name]["met"]
    assert name not in targets(REPORT)  # not measured: not judged


def test_serve_figures_are_in_the_summary_per_level():
    text = summary_markdown({"speed": {"serve_throughput": _serving(1.8, 250.0)}})
    assert "1 worker: 1 client 10.0 req/s p50 100.0 / p99 150.0 ms" in text
    assert "2 workers: 1 client 20.0 req/s p50 100.0 / p99 250.0 ms, 4 clients 20.0 req/s" in text
    assert "2 workers over 1: 1.0x at 1 clients, 1.5x at 4 clients, 1.8x at 16 clients; 0 errors." in text
    assert "160 lookups per level from Python threads" in text and "CPU a request" not in text  # an older report


def test_serve_summary_names_wrk_and_the_cpu_split_at_the_most_clients():
    figures = _serving(1.8, 250.0)
    figures.update(generator="wrk", seconds_per_run=4.0, requests_per_run=None)
    for key, best in figures["best"].items():
        best.update(server_cpu_ms=9.0 if key.startswith("2x") else 11.0, generator_cpu_ms=0.1, cores_busy=1.5)
    text = summary_markdown({"speed": {"serve_throughput": figures}})
    assert "(4 s of wrk per level, one connection a request," in text
    assert (
        "CPU a request at 16 clients: 1 worker: server 11.0 ms, generator 0.1 ms (1.5 cores busy); 2 workers: "
        "server 9.0 ms, generator 0.1 ms (1.5 cores busy)." in text
    )


def test_ingest_against_the_stock_torch_embedding_is_judged_and_summarised():
    """Issue 39: a whole ``kb-retrieval ingest`` over the stock path's embedding alone, at most 0.58; a report
    without the stock figure (an older run) judges the floor only."""
    measured = copy.deepcopy(REPORT)
    measured["speed"]["ingest_throughput"].update(
        runs=3,
        cli_ingest_wall_s=12.0,
        ingest_beyond_embedding_seconds=0.7,
        stock_chunks=500,
        stock_embed_model="HuggingFaceEmbedding (embed_batch_size 32)",
        stock_torch_embedding_seconds=30.0,
        stock_ratio=0.4,
    )
    judged = targets(measured)
    expected = {"ratio": 0.4, "ingest_s": 12.0, "stock_s": 30.0, "met": True}
    assert judged["ingest<=0.58x_stock_torch_embedding"] == expected
    measured["speed"]["ingest_throughput"]["stock_ratio"] = 0.6
    assert not targets(measured)["ingest<=0.58x_stock_torch_embedding"]["met"]
    assert "takes 12.0 s" in summary_markdown(measured) and "ratio 0.6." in summary_markdown(measured)
    assert "ingest<=0.58x_stock_torch_embedding" not in targets(REPORT)
