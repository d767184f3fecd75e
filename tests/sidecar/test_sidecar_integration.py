"""The real sidecar: LlamaIndex's stock VectorIndexRetriever over MilvusVectorStore, on the sample KB in Milvus Lite."""

from __future__ import annotations

import pytest
from sidecar_fakes import stable

from kb_retrieval.engine import KnowledgeLookup
from sidecar.comparison import lookup_with_sidecar, sidecar_run
from sidecar.runner import SidecarRunner
from tests.support.kb import ALERT

pytestmark = pytest.mark.timeout(300)


def test_stock_sidecar_answers_and_leaves_the_main_result_unchanged(sample_settings, embed_model, sample_lookup):
    expected = stable(sample_lookup.lookup_ranked(ALERT)[0].to_json_dict())
    # No model given, as sample_lookup: queries through the same (ONNX) encoder, so the main results compare.
    lookup = KnowledgeLookup(sample_settings.model_copy(update={"sidecar_enabled": True}))
    try:
        detail = lookup_with_sidecar(lookup, ALERT)  # the sidecar created by the core from KBSettings.sidecar.factory
        result, ranking, run = detail.result, detail.ranking, sidecar_run(detail.sidecar)
        details = lookup.traces.rows()[-1].retrieval_details
    finally:
        lookup.close()

    assert run.status == "ok", run.reason
    assert stable(result.to_json_dict()) == expected  # the sidecar changed nothing in the main result
    assert ranking and ranking[0].source == "redis/memory-usage-high.md"

    # comparable results: one per source, ranked, labelled with the path and the collection metric's semantics
    assert run.chunk_count == sample_settings.retrieval.top_k
    sources = [r.source for r in run.results]
    assert sources[0] == "redis/memory-usage-high.md"
    assert len(sources) == len(set(sources)) and [r.rank for r in run.results] == list(range(1, len(sources) + 1))
    assert {(r.path, r.score_label) for r in run.results} == {("sidecar:vectorstore", "cosine_similarity")}
    scores = [r.score for r in run.results]
    assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 1  # COSINE: similarity, best first
    top = run.results[0]
    assert top.title == "Redis memory usage high" and top.category == "redis" and top.breadcrumb
    assert top.content_preview and len(top.content_preview) <= 160 and top.chunk_id is None

    entry = details["sidecar"]
    assert entry["status"] == "ok" and entry["elapsed_ms"] > 0
    assert [c["source"] for c in entry["top_candidates"]] == sources[:5]


def test_sidecar_over_a_missing_collection_is_unavailable(sample_settings, embed_model):
    settings = sample_settings.model_copy(update={"collection": "no_such_collection", "sidecar_timeout_s": 30.0})
    run = SidecarRunner(settings, embed_model).run(ALERT)
    assert run.status == "unavailable"
    assert "cannot initialise" in (run.reason or "") and "no_such_collection" in (run.reason or "")
    assert run.results == []
