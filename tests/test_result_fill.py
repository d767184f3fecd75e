"""The blocks the ranking adds below the threshold (``evidence_fills_by_ranking``) reach the context pack, but found,
relevance and the completeness hint read what they read with the setting off: a fill is context, not evidence."""

from __future__ import annotations

import pytest

from kb_retrieval.models import LookupResult, QueryTransform, RetrievalAttempt
from kb_retrieval.result import assemble_result
from kb_retrieval.retrieval.attempts import AttemptResult, L1Outcome
from kb_retrieval.retrieval.context_pack import pack_context
from kb_retrieval.retrieval.evidence import build_evidence_blocks, is_ranking_fill
from kb_retrieval.retrieval.stage import candidate_node
from kb_retrieval.scoring_profile import BUILT_IN_PROFILE
from tests.support.candidates import cand

pytestmark = pytest.mark.unit

THRESHOLD = 0.55
TRANSFORM = QueryTransform(original_query="q", normalized_query="q", filter_reason="test")


def _ranked():
    """d0 answers by an exact identifier at a low similarity; d1 and d2, ranked below it, are under the threshold,
    d1 at a similarity that would make relevance medium were it counted (0.50 >= relevance_medium 0.45)."""
    return [
        candidate_node(cand("c0", "d0.md", 0.30), exact_terms=["ENOTFOUND"]),
        candidate_node(cand("c1", "d1.md", 0.50)),
        candidate_node(cand("c2", "d2.md", 0.20)),
    ]


def _result(fill: bool, budget: int) -> LookupResult:
    nodes = _ranked()
    blocks = build_evidence_blocks(nodes, evidence_threshold=THRESHOLD, max_blocks=5, fill_by_ranking=fill)
    trace = RetrievalAttempt(attempt=1, filtered=False, query="q", outcome="ok")
    l1 = L1Outcome(attempts=[AttemptResult(trace=trace, nodes=nodes, blocks=blocks)])
    pack = pack_context(blocks, budget_tokens=budget)
    return assemble_result(TRANSFORM, l1, pack, scoring=BUILT_IN_PROFILE, l1_enabled=True, stage_ms={})


def test_fills_reach_the_pack_but_not_found_relevance_or_completeness():
    off, on = _result(False, 10_000), _result(True, 10_000)
    assert [b.source for b in off.evidence_blocks] == ["d0.md"]
    assert [b.source for b in on.evidence_blocks] == ["d0.md", "d1.md", "d2.md"]
    assert [is_ranking_fill(b) for b in on.evidence_blocks] == [False, True, True]
    assert on.context_pack.summary.included_sources == ["d0.md", "d1.md", "d2.md"]
    assert on.found and off.found
    assert off.relevance_level == on.relevance_level == "low"  # d1's 0.50 is not evidence: not medium
    assert off.completeness_hint == on.completeness_hint
    assert on.completeness_hint.startswith("single_source:")  # one document answers; the others are context


def test_a_budget_that_leaves_out_only_fills_did_not_cut_evidence():
    whole = _result(False, 10_000).context_pack.summary.used_tokens
    on = _result(True, whole + 12)  # room for d0 only (12 tokens of content at least): the fills no longer fit
    assert on.context_pack.summary.included_sources == ["d0.md"]
    assert on.context_pack.summary.omitted_sources == ["d1.md", "d2.md"]
    assert on.completeness_hint.startswith("single_source:")


def test_without_evidence_the_fill_adds_nothing():
    nodes = [candidate_node(cand("c0", "d0.md", 0.50)), candidate_node(cand("c1", "d1.md", 0.40))]
    assert build_evidence_blocks(nodes, evidence_threshold=THRESHOLD, max_blocks=5) == []
