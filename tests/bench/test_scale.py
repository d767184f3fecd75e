"""The bench's scale part: lookup latency as the collection grows, on Milvus Lite and on a Milvus server.

The figures themselves come from ``kb-retrieval bench --only scale`` (minutes, 100k chunks); these tests run the
same code at small sizes on real Milvus (Lite, the test session's server) and pin what the report says.
"""

from __future__ import annotations

import copy
import json

import pytest

from kb_retrieval.bench.run import PARTS, previous_figures, seconds_key
from kb_retrieval.bench.speed import latency_at_scale, server_scale, server_targets
from kb_retrieval.bench.summary import server_scale_markdown, summary_markdown
from kb_retrieval.bench.targets import targets
from kb_retrieval.cli import build_parser
from tests.conftest import SAMPLE_KB

QUERIES = ["RedisMemoryHigh on cache-01", "replica link down, master_link_status:down"]
POINT = {
    "p95_ms": 30.0,
    "search_p50_ms": 5.0,
    "raw_search_p50_ms": 2.0,
    "recall@20": 1.0,
    "index_version_p50_ms": 1.5,
    "lookup_build_s": 1.0,
    "index_wait_s": 0.0,
}
SERVER = {
    "server": "Milvus 2.3.5 standalone (PyPI milvus), started by the bench",
    "index": {"type": "HNSW", "params": {"M": 16, "efConstruction": 200}},
    "ingest": {"ingest_chunks_per_s": 20.0, "embed_seconds": 40.0, "ingest_seconds": 45.0},
    "filler_insert_rows_per_s": 5000.0,
    "filler_flush_seconds": 8.0,
    "sizes": [{**POINT, "chunks": 1000, "p50_ms": 20.0}, {**POINT, "chunks": 100000, "p50_ms": 39.0}],
}
LITE = [{**POINT, "chunks": 1000, "p50_ms": 30.0, "index_version_p50_ms": 0.7}]


def test_server_targets_are_judged_from_the_largest_and_smallest_size():
    report = {"speed": {"scale": LITE, "scale_server": SERVER}}
    judged = targets(report)
    assert judged["server_p50_100000_chunks<=1.5x_1000"] == {"ratio": 1.95, "met": False}
    assert judged["server_p95<=3x_p50"] == {"ratio": 1.5, "met": True}  # 30 ms over 20 ms at 1k
    assert judged["lite_p50_1000_chunks<=150ms"] == {"ms": 30.0, "met": True}
    assert not any(name.startswith("server_p50_1000_chunks") for name in judged)  # no stage figures recorded
    faster = copy.deepcopy(report)
    faster["speed"]["scale_server"]["sizes"][-1]["p50_ms"] = 29.0
    for size in faster["speed"]["scale_server"]["sizes"]:
        size["stage_mean_ms"] = {"embed": 6.0}
    judged = targets(faster)
    assert judged["server_p50_100000_chunks<=1.5x_1000"] == {"ratio": 1.45, "met": True}
    assert judged["server_p50_1000_chunks<=2x_embed+search"] == {"ratio": 2.5, "met": False}  # 20 / (6 + 2)
    assert not any(name.startswith("server_") for name in targets({"speed": {"scale": LITE}}))


def test_server_targets_are_issue_21_s_ratios():
    sizes = [
        {**point, "stage_mean_ms": {"embed": 6.0, "search": 4.0}, "raw_search_p50_ms": 4.0} for point in SERVER["sizes"]
    ]
    assert server_targets(sizes) == {
        "p50_over_embed_plus_search": {"1000": 2.0, "100000": 3.9},
        "p50_largest_over_smallest": 1.95,
        "p95_over_p50": {"1000": 1.5, "100000": 0.769},
    }
    assert server_targets([]) == {}


def test_summary_has_the_server_paragraph():
    text = server_scale_markdown(SERVER, LITE)
    assert text.startswith("On a Milvus server (Milvus 2.3.5 standalone (PyPI milvus), started by the bench, HNSW ")
    assert "M=16, efConstruction=200" in text and "1000 chunks 20.0/30.0 ms, 100000 chunks 39.0/30.0 ms" in text
    assert "index-version check p50: server 1.5 ms, Milvus Lite 0.7 ms" in text
    assert text in summary_markdown({"speed": {"scale": LITE, "scale_server": SERVER}})


def test_scale_is_a_part_of_its_own():
    assert PARTS == ("quality", "speed", "scale", "serve")
    assert build_parser("bench").parse_args(["bench", "--only", "scale"]).only == "scale"


def test_latency_at_scale_on_lite(tmp_path, embed_model):
    points = latency_at_scale(SAMPLE_KB / "redis", tmp_path / "lite", QUERIES, embed_model, sizes=(200, 400), log=str)
    assert [p["chunks"] for p in points] == [200, 400]
    for point in points:
        assert point["recall@20"] == 1.0  # FLAT: exact
        assert 0 < point["p50_ms"] <= point["p95_ms"] and point["index_version_p50_ms"] > 0


@pytest.mark.server
@pytest.mark.timeout(900)
def test_server_scale_on_the_test_server(milvus_server, tmp_path, embed_model):
    figures = server_scale(
        SAMPLE_KB / "redis", tmp_path / "server", QUERIES, embed_model, milvus_server.uri, sizes=(200, 2500), log=str
    )
    assert figures["index"] == {"type": "HNSW", "params": {"M": 16, "efConstruction": 200}}
    assert figures["ingest"]["chunks"] > 0 and figures["filler_insert_rows_per_s"] > 0
    assert [p["chunks"] for p in figures["sizes"]] == [200, 2500]
    for point in figures["sizes"]:
        assert point["recall@20"] >= 0.9 and 0 < point["p50_ms"] <= point["p95_ms"]
    assert set(figures["targets"]["p95_over_p50"]) == {"200", "2500"}


def test_a_partial_run_keeps_the_other_figures_in_full_run_order(tmp_path):
    previous = tmp_path / "bench.json"
    quality = {
        "runbooks": {"runbooks-alerts-unmapped": 1, "runbooks-alerts-dev": 2},
        "mixed": {"runbooks-alerts-dev": 3},
    }
    figures = {"quality": quality, "speed": {"scale": LITE}, "seconds_total": 900.0, "targets": {}}
    previous.write_text(json.dumps(figures, sort_keys=True), encoding="utf-8")
    kept = previous_figures(previous)
    assert list(kept["quality"]) == ["runbooks", "mixed"]  # SETTINGS order, not the file's sorted keys
    assert list(kept["quality"]["runbooks"]) == ["runbooks-alerts-dev", "runbooks-alerts-unmapped"]
    assert kept["speed"] == {"scale": LITE} and kept["seconds_total"] == 900.0 and "targets" not in kept
    assert seconds_key({"scale"}) == "seconds_scale" and seconds_key({"speed", "quality"}) == "seconds_quality+speed"
    assert seconds_key(set(PARTS)) == "seconds_total" and seconds_key({"serve"}) == "seconds_serve"
