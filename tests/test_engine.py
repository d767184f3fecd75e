"""Every scenario of the lookup_knowledge spec (../shared/spec/000_*.txt), against Milvus Lite and the real model."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.l0_index import L0Entry
from kb_retrieval.models import EvidenceStatus
from kb_retrieval.retrieval.doc_rank import l0_signal
from kb_retrieval.retrieval.exact import ExactIdentifierIndex
from kb_retrieval.retrieval.l0_hints import L0HintProvider
from kb_retrieval.retrieval.l1.base import L1Search
from tests.support.kb import ALERT


def _lookup(settings: KBSettings, embed_model, **changes) -> KnowledgeLookup:
    return KnowledgeLookup(settings.model_copy(update=changes), embed_model=embed_model)


class EmptyPath:
    """A vector-store path on which L1 finds nothing (an empty or unrelated collection)."""

    name = "sdk"

    def search(self, embedding, top_k, filter_expr, timeout=None) -> L1Search:
        return L1Search(candidates=[], path="sdk")


def _empty_l1(settings: KBSettings, embed_model) -> KnowledgeLookup:
    return KnowledgeLookup(settings, embed_model=embed_model, path=EmptyPath())


def _details(lookup: KnowledgeLookup) -> dict:
    return lookup.traces.rows()[-1].retrieval_details


# --- L0 is a hint provider ----------------------------------------------------------------------------------


def test_l0_exposes_structured_hints(sample_lookup):
    result = sample_lookup.lookup("RedisMemoryHigh fired; INFO memory shows used_memory near maxmemory")
    hints = result.query_transform.hints
    assert "RedisMemoryHigh" in hints.matched_keywords
    assert hints.domains == ["redis"]
    assert "INFO memory" in hints.entities
    assert "redis/memory-usage-high.md" in hints.matched_sources


def test_title_match_is_a_hint(sample_lookup):
    result = sample_lookup.lookup("understanding linux load average on a busy box")
    assert "Understanding Linux load average" in result.query_transform.hints.matched_titles


def test_single_l0_match_still_runs_l1(sample_lookup):
    result = sample_lookup.lookup("MySQLTooManyConnections")
    assert result.query_transform.hints.matched_sources == ["mysql/too-many-connections.md"]
    attempts = result.retrieval_trace.attempts
    assert attempts and attempts[0].candidate_count > 0
    assert result.evidence_blocks[0].source == "mysql/too-many-connections.md"
    assert result.evidence_blocks[0].hit_reasons[0].startswith("l1_semantic:")


def test_l0_documents_never_become_evidence_when_l1_finds_nothing(sample_settings, embed_model):
    lookup = _empty_l1(sample_settings, embed_model)
    result = lookup.lookup(ALERT)
    assert result.query_transform.hints.matched_sources  # L0 did match documents
    assert result.found is False
    assert result.evidence_blocks == [] and result.context_pack.blocks == []
    details = _details(lookup)
    assert details["l0_hints"]["keywords"]  # hints may still be recorded
    assert details["evidence_blocks"] == []


def test_l1_disabled_by_configuration_returns_no_evidence_but_hints(sample_settings, embed_model):
    lookup = _lookup(sample_settings, embed_model, l1_enabled=False)
    result = lookup.lookup(ALERT)
    assert result.found is False and result.retrieval_trace.attempts == []
    assert "disabled" in result.message
    assert result.query_transform.hints.matched_keywords


# --- domain filter -------------------------------------------------------------------------------------------


def test_single_domain_becomes_category_filter(sample_lookup):
    result = sample_lookup.lookup(ALERT)
    first = result.retrieval_trace.attempts[0]
    assert result.query_transform.category_filter == "redis"
    assert first.filtered and first.filter_expr == 'category == "redis"'
    assert {b.category for b in result.evidence_blocks} == {"redis"}


def test_two_domains_mean_no_filter(sample_lookup):
    result = sample_lookup.lookup("KubeContainerOOMKilled and JvmMetaspaceHigh both firing for checkout")
    assert result.query_transform.hints.domains == ["jvm", "kubernetes"]
    assert result.query_transform.category_filter is None
    assert "ambiguous" in result.query_transform.filter_reason
    assert not result.retrieval_trace.attempts[0].filtered


def test_no_domain_means_no_filter(sample_lookup):
    result = sample_lookup.lookup("which garbage collector keeps pauses short for a latency sensitive service")
    assert result.query_transform.hints.domains == []
    assert result.query_transform.category_filter is None
    assert len(result.retrieval_trace.attempts) == 1


# --- persisted hints and layer ---------------------------------------------------------------------------------


def test_retrieval_details_persist_l0_hints_and_layer(sample_lookup):
    before = sample_lookup.traces.count()
    result = sample_lookup.lookup(ALERT)
    assert sample_lookup.traces.count() == before + 1
    row = sample_lookup.traces.rows()[-1]
    assert row.tool_name == "lookup_knowledge" and row.query == ALERT and row.found
    hints = row.retrieval_details["l0_hints"]
    assert hints["keywords"] == result.query_transform.hints.matched_keywords
    assert hints["domains"] == ["redis"] and "entities" in hints and "titles" in hints
    assert hints["title_coverage"] == result.query_transform.hints.title_coverage
    assert row.retrieval_layer == "L0+L1" == result.retrieval_layer


def test_layer_is_l1_without_hints(sample_lookup):
    result = sample_lookup.lookup("how do I keep stop-the-world pauses short for a latency sensitive java service")
    assert result.query_transform.hints.empty and result.found
    assert result.retrieval_layer == "L1"
    assert all(b.retrieval_layer == "L1" for b in result.evidence_blocks)


# --- evidence blocks ---------------------------------------------------------------------------------------------


def test_evidence_blocks_carry_source_metadata_and_reasons(sample_lookup):
    result = sample_lookup.lookup(ALERT)
    top = result.evidence_blocks[0]
    assert top.source == "redis/memory-usage-high.md"
    assert top.title == "Redis memory usage high"
    assert top.breadcrumb and top.breadcrumb.startswith("Redis memory usage high")
    assert top.retrieval_layer == "L0+L1"
    assert top.content.strip()
    assert "l0_keyword:RedisMemoryHigh" in top.hit_reasons


def test_result_json_uses_spec_names_and_no_legacy_fields(sample_lookup):
    data = sample_lookup.lookup(ALERT).to_json_dict()
    for key in ("found", "message", "evidenceBlocks", "contextPack", "retrievalTrace", "rerankTrace"):
        assert key in data
    assert data["relevanceLevel"] in {"high", "medium", "low"} and data["completenessHint"]
    assert "primary" not in data and "supplement" not in data
    assert {"source", "title", "breadcrumb", "retrievalLayer", "content", "hitReasons"} <= set(
        data["evidenceBlocks"][0]
    )


def test_agent_text_derives_from_evidence_and_pack(sample_lookup):
    from kb_retrieval.engine import agent_text

    result = sample_lookup.lookup(ALERT)
    text = agent_text(result)
    for block in result.context_pack.blocks:  # each packed block, fenced (issue 23 item 7)
        assert f"source: {block.source}" in text and f"---\n{block.content}\n" in text
    assert text == agent_text(result.model_copy(deep=True))  # deterministic: fixtures and reports stay stable


# --- dedupe and counts ---------------------------------------------------------------------------------------------


def test_one_block_per_source_with_merged_reasons(sample_lookup):
    result = sample_lookup.lookup("RedisMemoryHigh maxmemory eviction used_memory fragmentation")
    sources = [b.source for b in result.evidence_blocks]
    assert len(sources) == len(set(sources))
    attempt = result.retrieval_trace.attempts[result.retrieval_trace.selected_attempt - 1]
    assert attempt.candidate_count > len(sources)  # several chunks of one document collapsed


def test_counts_are_recorded(sample_lookup):
    result = sample_lookup.lookup(ALERT)
    details = _details(sample_lookup)
    assert details["candidate_count"] == result.retrieval_trace.candidate_count > 0
    assert details["final_count"] == len(result.evidence_blocks) > 0


def test_evidence_summaries_are_compact(sample_lookup):
    result = sample_lookup.lookup(ALERT)
    details = _details(sample_lookup)
    summaries = details["evidence_blocks"]
    assert [s["source"] for s in summaries] == [b.source for b in result.evidence_blocks]
    for summary in summaries:
        assert {"title", "retrieval_layer", "score", "hit_reasons"} <= set(summary)
        assert len(summary["content_preview"]) <= 160
        assert "content" not in summary
    longest = max(result.evidence_blocks, key=lambda b: len(b.content))
    assert longest.content not in json.dumps(details)


def test_evidence_lookup_persists_modular_keys(sample_lookup):
    sample_lookup.lookup(ALERT)
    details = _details(sample_lookup)
    for key in ("query_transform", "retrieval_trace", "context_pack_summary", "rerank_trace", "evidence_blocks"):
        assert key in details


# --- fallback --------------------------------------------------------------------------------------------------------


def test_filtered_success_uses_filtered_candidates_without_retry(sample_lookup):
    result = sample_lookup.lookup(ALERT)
    trace = result.retrieval_trace
    assert len(trace.attempts) == 1 and trace.attempts[0].outcome == "ok"
    assert trace.selected_attempt == 1 and trace.fallback_reason is None


def test_filtered_no_candidates_retries_unfiltered(sample_settings, embed_model, tmp_path):
    # An L0 entry in a category with no rows in Milvus: the filtered attempt finds nothing.
    settings = sample_settings.model_copy(update={"state_dir": tmp_path, "freshness_check_s": 3600})
    lookup = KnowledgeLookup(
        settings.model_copy(update={"milvus_uri": sample_settings.resolved_milvus_uri()}), embed_model=embed_model
    )
    index = lookup.l0.index.model_copy(deep=True)
    index.documents["ghost/ghost.md"] = L0Entry(
        kb="elsewhere", title="Ghost", category="ghost", keywords=["GhostAlert"]
    )
    lookup.state_holder.publish(dataclasses.replace(lookup.state, l0=L0HintProvider(index)))  # a state of its own
    result = lookup.lookup("GhostAlert: redis memory usage above maxmemory")
    trace = result.retrieval_trace
    assert trace.attempts[0].outcome == "no_candidates"
    assert trace.attempts[0].category_filter == "ghost" and not trace.attempts[1].filtered
    assert trace.fallback_reason == "filtered_vector_no_evidence"
    assert trace.selected_attempt == 2 and result.found
    details = _details(lookup)
    assert details["fallback_reason"] == "filtered_vector_no_evidence"
    assert details["retrieval_trace"]["selected_attempt"] == 2


def test_filtered_below_reference_retries_unfiltered(sample_settings, embed_model):
    lookup = _lookup(sample_settings, embed_model, reference_threshold=0.99)
    result = lookup.lookup(ALERT)
    trace = result.retrieval_trace
    assert trace.attempts[0].outcome == "low_quality" and trace.attempts[0].top_similarity < 0.99
    assert trace.fallback_reason == "filtered_vector_low_quality"
    assert trace.attempts[1].filtered is False and trace.attempts[1].query == result.query_transform.normalized_query
    assert trace.selected_attempt == 2
    assert _details(lookup)["fallback_reason"] == "filtered_vector_low_quality"


def test_a_lookup_looks_up_its_identifiers_once_for_both_attempts(sample_settings, embed_model, monkeypatch):
    # The scan answers the trace's unheld names and both attempts' exact-identifier candidates: a search that did
    # not get it from the lookup would look it up again. (Building a lookup may calibrate, scanning texts of its own.)
    lookup = _lookup(sample_settings, embed_model, reference_threshold=0.99)
    scans: list[str] = []
    real = ExactIdentifierIndex.identifiers
    monkeypatch.setattr(ExactIdentifierIndex, "identifiers", lambda self, q, m: scans.append(q) or real(self, q, m))
    result = lookup.lookup(f"{ALERT}, kube_pod_restart_budget_left is 0")
    assert [a.filtered for a in result.retrieval_trace.attempts] == [True, False]
    assert scans.count(result.query_transform.normalized_query) == 1, scans
    assert result.retrieval_trace.calibration["unheldIdentifiers"] == ["kube_pod_restart_budget_left"]


class HungPath:
    """A vector-store path whose server never answers: each call waits its whole timeout (or until the test ends),
    then fails."""

    name = "sdk"

    def __init__(self) -> None:
        self.timeouts: list[float] = []
        self.released = threading.Event()

    def search(self, embedding, top_k, filter_expr, timeout=None) -> L1Search:
        self.timeouts.append(timeout)
        self.released.wait(timeout or 0)
        raise TimeoutError("DEADLINE_EXCEEDED (fake)")


def test_one_deadline_bounds_the_whole_lookup(sample_settings, embed_model):
    # A deadline wide enough for the lookup's own work on a loaded machine (embedding, L0) to leave time for the
    # search: the check is structural (what each call was given, which attempts ran), not a measured duration.
    settings = sample_settings.model_copy(update={"lookup_timeout_s": 5.0, "milvus_search_timeout_s": 60.0})
    path = HungPath()
    lookup = KnowledgeLookup(settings, embed_model=embed_model, path=path)
    try:
        result = lookup.lookup(ALERT)  # filtered first: a retry would follow
    finally:
        path.released.set()
    # Not 2 attempts x 60 s: one attempt's requests (the dense search, and with BM25 in process the one for its
    # chunks: a search restricted to them on a path that cannot read by key, sent while the first is out), each given
    # at most what is left of the one deadline; the retry never starts.
    assert 1 <= len(path.timeouts) <= 2 and all(t <= 5.0 for t in path.timeouts), path.timeouts
    assert [a.outcome for a in result.retrieval_trace.attempts] == ["error", "skipped"]
    assert result.evidence_status is EvidenceStatus.UNAVAILABLE and not result.found
    assert _details(lookup)["retrieval_trace"]["attempts"][1]["outcome"] == "skipped"


def test_failed_searches_are_an_outage_not_an_empty_answer(sample_settings, embed_model):
    class DownPath:
        name = "sdk"

        def search(self, embedding, top_k, filter_expr, timeout=None) -> L1Search:
            raise ConnectionError("Fail connecting to server (fake)")

    lookup = KnowledgeLookup(sample_settings, embed_model=embed_model, path=DownPath())
    result = lookup.lookup(ALERT)
    assert result.evidence_status is EvidenceStatus.UNAVAILABLE and result.found is False
    assert result.message.startswith("The knowledge base could not be searched")
    assert lookup.traces.rows()[-1].evidence_status == "knowledge_base_unavailable"


def test_both_attempts_fail(sample_settings, embed_model):
    lookup = _empty_l1(sample_settings, embed_model)
    result = lookup.lookup(ALERT)
    # Searches that answer nothing from a collection whose L0 index holds documents are an outage (a server still
    # loading, issue 23), not an empty knowledge base: both attempts ran and failed.
    assert result.found is False and result.evidence_status is EvidenceStatus.UNAVAILABLE
    assert [a.filtered for a in result.retrieval_trace.attempts] == [True, False]
    assert "answered no candidates" in (result.retrieval_trace.attempts[-1].error or "")
    assert result.retrieval_trace.fallback_reason == "filtered_vector_no_evidence"
    assert result.relevance_level == "none" and result.completeness_hint == "no_evidence"
    assert result.evidence_blocks == [] and result.context_pack.text == ""
    details = _details(lookup)
    assert len(details["retrieval_trace"]["attempts"]) == 2
    assert details["evidence_blocks"] == []


def test_no_answer_question_is_not_found(sample_lookup):
    result = sample_lookup.lookup("How do I rebalance partitions of a Kafka consumer group?")
    assert result.found is False
    assert result.retrieval_trace.attempts  # the attempted path is still traced


# --- context pack and rerank trace ---------------------------------------------------------------------------


def test_context_pack_respects_budget_and_keeps_metadata(sample_settings, embed_model):
    lookup = _lookup(sample_settings, embed_model, context_budget_tokens=120)
    result = lookup.lookup("RedisMemoryHigh maxmemory eviction used_memory fragmentation")
    summary = result.context_pack.summary
    assert summary.used_tokens <= 120
    assert summary.truncated_sources or summary.omitted_sources
    assert sorted(summary.included_sources + summary.omitted_sources) == sorted(
        b.source for b in result.evidence_blocks
    )
    for block in result.context_pack.blocks:
        assert block.source and block.title


def test_rerank_trace_records_contributions(sample_lookup):
    result = sample_lookup.lookup(ALERT)
    entries = result.rerank_trace.entries
    assert [e.rank for e in entries] == list(range(1, len(entries) + 1))
    top = entries[0]
    assert top.source == result.evidence_blocks[0].source
    assert top.boosts.get("l0_keyword", 0) > 0
    # Documents are ranked as wholes: the weighted signals sum to the final score, the boosts among them.
    # (with the weights the knowledge base's fit left: on the sample KB it sets the identity weights to 0)
    weights = sample_lookup.pipeline.postprocessors[2].weights
    assert {k for k in ("doc_title", "doc_summary", "doc_text", "l0") if weights[k]} <= set(top.ranking)
    assert "doc_text" in top.ranking and "l0" in top.ranking
    assert top.ranking["l0"] == pytest.approx(sample_lookup.settings.scoring.rank_l0 * l0_signal(top.boosts), abs=1e-5)
    assert top.final_score == pytest.approx(sum(top.ranking.values()), abs=1e-5)
    assert any(r.startswith("l1_document:title ") for r in result.evidence_blocks[0].hit_reasons)
    # Off, the rule reranker's score ranks them: the best chunk's similarity plus its boosts.
    plain = sample_lookup.with_settings(document_ranking=False).lookup(ALERT).rerank_trace.entries[0]
    assert not plain.ranking
    assert plain.final_score == pytest.approx(plain.base_score + sum(plain.boosts.values()), abs=1e-5)


def test_empty_query_is_a_clear_error(sample_lookup):
    from kb_retrieval.retrieval.query_transform import EmptyQueryError

    with pytest.raises(EmptyQueryError, match="empty"):
        sample_lookup.lookup("  \n\t ")


def test_weak_candidates_everywhere_mean_no_evidence(sample_settings, embed_model):
    # Both attempts return candidates, none strong enough: no_evidence on the filtered one, then on the retry.
    lookup = _lookup(sample_settings, embed_model, evidence_threshold=1.0)
    result = lookup.lookup("RedisSentinelFailover")
    assert [a.outcome for a in result.retrieval_trace.attempts] == ["no_evidence", "no_evidence"]
    assert all(a.candidate_count > 0 for a in result.retrieval_trace.attempts)
    assert result.found is False and result.retrieval_trace.fallback_reason == "filtered_vector_no_evidence"


# --- beyond the spec: the lean query path and the lexical re-scoring knob -----------------------------------


def test_queries_go_through_the_onnx_export_by_default(sample_settings, embed_model):
    from kb_retrieval.indexing.onnx_query import OnnxQueryEmbedding

    # No model given: the ONNX export by default; a model given is used as given (issue 24).
    onnx = KnowledgeLookup(sample_settings)
    model = _lookup(sample_settings, embed_model, query_encoder="model")
    assert _lookup(sample_settings, embed_model).query_embed_model is embed_model
    try:
        assert isinstance(onnx.query_embed_model, OnnxQueryEmbedding) and "int8" in onnx.query_embed_model.model_name
        assert model.query_embed_model is embed_model
        fast, exact = onnx.lookup(ALERT), model.lookup(ALERT)
        assert fast.found and exact.found
        assert fast.evidence_blocks[0].source == exact.evidence_blocks[0].source
        assert fast.evidence_blocks[0].similarity == pytest.approx(exact.evidence_blocks[0].similarity, abs=0.03)
        assert fast.evidence_blocks[0].similarity != exact.evidence_blocks[0].similarity  # really another encoder
    finally:
        onnx.close()
        model.close()


def test_lexical_rescore_min_limits_the_second_search(sample_settings, embed_model):
    query = "replication lag seconds behind master on the replica"
    every = _lookup(sample_settings, embed_model)
    best_only = _lookup(sample_settings, embed_model, lexical_rescore_min=1.0)
    try:
        all_added = every.lookup(query).retrieval_trace.attempts[0].lexical_added
        best_added = best_only.lookup(query).retrieval_trace.attempts[0].lexical_added
        assert all_added > 1 and best_added <= 1  # only the best lexical hit (relative score 1.0) may be re-scored
    finally:
        every.close()
        best_only.close()


def test_stage_timings_cover_every_stage_including_the_trace_write(sample_lookup):
    result = sample_lookup.lookup(ALERT)
    assert {"query_transform", "embed", "search", "rerank", "pack", "assemble", "trace_write"} <= set(result.stage_ms)
    assert all(ms >= 0 for ms in result.stage_ms.values())
    assert "trace_write" not in _details(sample_lookup)["stage_ms"]  # written before its own write was timed


def test_title_term_coverage_is_an_l0_hint(sample_lookup):
    result = sample_lookup.lookup("which garbage collector keeps pauses short for a latency sensitive service")
    hints = result.query_transform.hints
    assert not hints.empty and list(hints.title_coverage) == ["jvm/choosing-garbage-collector.md"]
    top = result.evidence_blocks[0]
    assert top.source == "jvm/choosing-garbage-collector.md" and top.retrieval_layer == "L0+L1"
    assert any(r.startswith("l0_title_terms:") for r in top.hit_reasons) and result.retrieval_layer == "L0+L1"


@pytest.mark.unit
def test_the_state_build_pauses_the_collector_and_restores_it():
    import gc

    from kb_retrieval.state import _collector_paused

    was = gc.isenabled()
    try:
        for before in (True, False):
            (gc.enable if before else gc.disable)()
            with _collector_paused():
                assert not gc.isenabled()
            assert gc.isenabled() is before
        gc.enable()
        with pytest.raises(RuntimeError), _collector_paused():
            raise RuntimeError("a failed read")
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
