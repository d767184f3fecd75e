"""found and relevance calibrated per knowledge base: the background distribution, the thresholds taken from it, and
relevance high. Pinned with small fakes, then on the sample KB with the real model and Milvus Lite."""

from __future__ import annotations

import numpy as np
import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.models import Candidate, EvidenceBlock
from kb_retrieval.result import relevance
from kb_retrieval.retrieval.calibration import (
    MIN_SAMPLES,
    QUANTILES,
    Background,
    Calibration,
    background,
    best_similarity,
    calibrate,
    lexical_lead,
    measure,
    pseudo_query,
    topical_sections,
)
from kb_retrieval.retrieval.stage import candidate_node
from tests.support.candidates import cand

SETTINGS = KBSettings(state_dir="/nonexistent-calibration-test")


def _row(i: int, source: str, breadcrumb: str, content: str) -> dict:
    return {"id": f"c{i}", "source": source, "content": content, "metadata": {"breadcrumb": breadcrumb}}


@pytest.mark.unit
def test_the_best_similarity_is_the_best_candidate_s_rounded_as_a_block_s():
    nodes = [
        candidate_node(cand(i, f"{i}.md", similarity)) for i, similarity in (("a", 0.3), ("b", 0.70000049), ("c", 0.1))
    ]
    assert best_similarity(nodes) == 0.7 == round(0.70000049, 6)
    assert best_similarity([]) == 0.0


@pytest.mark.unit
def test_pseudo_queries_are_heading_and_first_sentence_without_markup():
    assert pseudo_query("Guide > Retention", "Keeps **15 days** by default. Set a flag.") == (
        "Retention: Keeps 15 days by default."
    )
    assert pseudo_query("", "`rate()` works on counters only. More.") == "rate() works on counters only."


@pytest.mark.unit
def test_topical_sections_leave_out_headings_other_documents_share():
    rows = [
        _row(0, "a.md", "A > Mitigation", "Restart the pod and check the logs again."),
        _row(1, "b.md", "B > Mitigation", "Scale the deployment up and watch it."),
        _row(2, "a.md", "A > Disk pressure", "The node evicts pods when the disk is full."),
        _row(3, "a.md", "A > Disk pressure", "A second chunk of the same section, not a second query."),
    ]
    assert topical_sections(rows, SETTINGS) == [(2, "Disk pressure: The node evicts pods when the disk is full.")]


@pytest.mark.unit
def test_the_background_is_the_best_similarity_outside_the_query_s_own_document():
    chunks = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    sources = ["a.md", "a.md", "b.md"]
    queries = np.array([[1.0, 0.0], [0.0, 1.0]])
    # query 0 is a.md's: its own chunks (1.0, 0.8) do not count, b.md's reaches 0.0; query 1 is b.md's: 0.6
    assert background(queries, chunks, sources, own=[0, 2]).tolist() == pytest.approx([0.0, 0.6])


@pytest.mark.unit
def test_thresholds_rise_to_the_background_and_never_below_the_settings():
    low = Background(50, (0.30, 0.35, 0.38, 0.50, 0.52, 0.60, 0.70), "measured")
    high = Background(50, (0.40, 0.49, 0.53, 0.63, 0.65, 0.73, 0.79), "measured")
    assert len(low.quantiles) == len(QUANTILES)
    on_low, on_high = calibrate(low, SETTINGS), calibrate(high, SETTINGS)
    assert (on_low.evidence_threshold, on_low.relevance_high) == (SETTINGS.evidence.evidence_threshold, 0.6)
    assert (on_high.evidence_threshold, on_high.relevance_high) == (0.49, 0.65)
    assert on_high.source == "measured" and on_high.as_trace()["background"]["q20"] == 0.49
    off = calibrate(high, SETTINGS.model_copy(update={"calibrate_thresholds": False}))
    assert (off.source, off.evidence_threshold) == ("settings", SETTINGS.evidence.evidence_threshold)
    assert "calibrate_thresholds is off" in off.reason


@pytest.mark.unit
def test_a_kb_with_too_few_topical_sections_keeps_the_settings():
    rows = [_row(i, f"d{i}.md", f"D > Topic {i}", "One sentence about the topic here.") for i in range(MIN_SAMPLES - 1)]

    def embed(texts: list[str]) -> np.ndarray:
        raise AssertionError("nothing to embed below the minimum")

    measured = measure(rows, np.eye(len(rows)), SETTINGS, embed)
    assert measured.quantiles == () and f"< {MIN_SAMPLES}" in measured.reason
    used = calibrate(measured, SETTINGS)
    assert used.source == "settings" and used.evidence_threshold == SETTINGS.evidence.evidence_threshold


def _block(source: str, similarity: float) -> EvidenceBlock:
    return EvidenceBlock(source=source, content="x", retrieval_layer="L1", score=1.0, similarity=similarity)


@pytest.mark.unit
def test_relevance_high_needs_the_first_document_to_hold_the_best_section():
    calibration = Calibration("measured", "test", 0.5, 0.65, 0.5)
    scoring = SETTINGS.scoring
    assert relevance([_block("a.md", 0.7), _block("b.md", 0.6)], scoring, calibration) == "high"
    assert relevance([_block("a.md", 0.6), _block("b.md", 0.7)], scoring, calibration) == "medium"
    assert relevance([_block("a.md", 0.62)], scoring, calibration) == "medium"  # under the KB's cut-off
    assert relevance([_block("a.md", 0.62)], scoring) == "high"  # the settings' 0.6
    assert relevance([_block("a.md", 0.4)], scoring, calibration) == "low"
    assert relevance([], scoring, calibration) == "none"


def _chunk(source: str, lexical: float | None, exact: tuple[str, ...] = (), similarity: float = 0.5):
    from kb_retrieval.retrieval.stage import candidate_node

    candidate = Candidate(
        chunk_id=f"{source}#{lexical}",
        source=source,
        content="x",
        score=0.5,
        score_label="cosine_similarity",
        path="memory",
        similarity=similarity,
    )
    return candidate_node(candidate, lexical_score=lexical, exact_terms=list(exact))


@pytest.mark.unit
def test_the_lexical_search_agrees_when_the_first_document_s_section_is_its_best_hit():
    # one node per document (after dedupe): its best-matching section with that section's relative BM25 score
    nodes = [_chunk("a.md", 1.0), _chunk("b.md", 0.9), _chunk("c.md", None, ("kube_x",))]
    assert lexical_lead(nodes, "a.md")
    assert not lexical_lead(nodes, "b.md")  # another section is the query's best BM25 hit
    assert lexical_lead(nodes, "c.md")  # a rare identifier of the query is lexical evidence of its own
    assert not lexical_lead(nodes, "d.md")
    assert lexical_lead([_chunk("a.md", None), _chunk("b.md", None)], "b.md")  # lexical search off


@pytest.mark.unit
def test_relevance_high_needs_the_lexical_search_to_agree():
    calibration = Calibration("measured", "test", 0.5, 0.65, 0.5)
    blocks = [_block("a.md", 0.7), _block("b.md", 0.6)]
    scoring = SETTINGS.scoring
    assert relevance(blocks, scoring, calibration, [_chunk("a.md", 1.0), _chunk("b.md", 0.5)]) == "high"
    assert relevance(blocks, scoring, calibration, [_chunk("a.md", 0.8), _chunk("b.md", 1.0)]) == "medium"
    assert relevance(blocks, scoring, calibration, None) == "high"  # no nodes given: similarity and ranking only


@pytest.mark.unit
def test_relevance_high_needs_the_best_section_of_every_candidate_document():
    # the ranking left c.md below the evidence blocks (max_evidence_blocks), but its section matches the question
    # best: the ranking and the similarity disagree as much as if it were among the blocks
    calibration = Calibration("measured", "test", 0.5, 0.65, 0.5)
    blocks = [_block("a.md", 0.7), _block("b.md", 0.6)]
    scoring = SETTINGS.scoring
    nodes = [_chunk("a.md", 1.0, similarity=0.7), _chunk("b.md", 0.5, similarity=0.6)]
    assert relevance(blocks, scoring, calibration, nodes) == "high"
    assert relevance(blocks, scoring, calibration, [*nodes, _chunk("c.md", 0.4, similarity=0.75)]) == "medium"
    assert relevance(blocks, scoring, calibration, [*nodes, _chunk("c.md", 0.4, similarity=0.7)]) == "high"  # a tie


#: A sample-KB alert whose best section is in the expected runbook, while its pod name is the best BM25 hit of
#: another runbook's example (golden case aiops-k8s-004).
THROTTLING = (
    "CPUThrottlingHigh: 47% throttling of CPU in namespace payments for container api in pod "
    "payments-api-7d9f8b6c4-x2k8q."
)


def test_on_the_sample_kb_a_lexical_disagreement_keeps_relevance_below_high(sample_lookup):
    result = sample_lookup.lookup(THROTTLING)
    first, *others = result.evidence_blocks
    assert first.source == "kubernetes/resource-requests-and-limits.md"
    # the similarity and the ranking alone would call it high; the lexical search puts another runbook first
    assert relevance(result.evidence_blocks, sample_lookup.settings.scoring) == "high"
    assert "lexical_bm25:1.000" not in first.hit_reasons  # its best section is not the query's best BM25 hit
    assert any("lexical_bm25:1.000" in b.hit_reasons for b in others)
    assert result.relevance_level == "medium"
    agreeing = sample_lookup.lookup("pods keep restarting with CrashLoopBackOff")
    assert agreeing.relevance_level == "high"


@pytest.fixture(scope="module")
def memory_lookup(sample_settings):
    from kb_retrieval.engine import KnowledgeLookup

    lookup = KnowledgeLookup(sample_settings.model_copy(update={"vector_store_mode": "auto"}))  # the memory plan
    yield lookup
    lookup.close()


def test_the_sample_kb_measures_its_background_and_the_trace_says_so(memory_lookup):
    calibration = memory_lookup.pipeline.attempts.calibration
    assert calibration.source == "measured" and calibration.samples >= MIN_SAMPLES
    assert calibration.evidence_threshold >= memory_lookup.settings.evidence.evidence_threshold
    assert calibration.relevance_high >= memory_lookup.settings.scoring.relevance_high
    # measured once per state: a settings variant reuses it, and its own thresholds follow its settings
    variant = memory_lookup.with_settings(evidence_threshold=0.9)
    assert variant.pipeline.attempts.calibration.background == calibration.background
    assert variant.pipeline.attempts.calibration.evidence_threshold == 0.9
    result = memory_lookup.lookup("pods keep restarting with CrashLoopBackOff")
    assert result.retrieval_trace.calibration == calibration.as_trace()
    assert result.found and result.retrieval_trace.calibration["source"] == "measured"


def test_on_the_milvus_plan_the_settings_apply_and_the_trace_says_why(sample_lookup):
    calibration = sample_lookup.pipeline.attempts.calibration
    assert sample_lookup.pipeline.state.memory is None
    assert calibration.source == "settings" and "milvus plan" in calibration.reason
    assert calibration.evidence_threshold == sample_lookup.settings.evidence.evidence_threshold


def test_the_background_is_kept_per_index_version_and_read_back(memory_lookup, tmp_path):
    from kb_retrieval.retrieval import calibration as module

    state, settings = memory_lookup.pipeline.state, memory_lookup.settings.model_copy(update={"state_dir": tmp_path})
    kept = module.Background(30, (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7), "kept")
    module._write_cached(settings, module._cache_key(settings, state.index_version), kept)
    assert module._read_cached(settings, module._cache_key(settings, state.index_version)) == kept
    assert module._read_cached(settings, module._cache_key(settings, state.index_version + "-next")) is None
    off = settings.model_copy(update={"state_snapshots": False})
    assert module._read_cached(off, module._cache_key(off, state.index_version)) is None
