"""Evidence blocks: which ranked nodes the agent receives (the threshold decides whether, the ranking the order)."""

from __future__ import annotations

import pytest

from kb_retrieval.retrieval.evidence import build_evidence_blocks, is_ranking_fill
from kb_retrieval.retrieval.stage import candidate_node
from tests.support.candidates import cand

pytestmark = pytest.mark.unit


def nodes(*similarities: float, exact: int | None = None):
    """Ranked nodes d0, d1, ... in this order, each judged on its similarity (no rerank record)."""
    out = []
    for i, similarity in enumerate(similarities):
        stage = {"exact_terms": ["ENOTFOUND"]} if i == exact else {}
        out.append(candidate_node(cand(f"c{i}", f"d{i}.md", similarity), **stage))
    return out


def sources(blocks) -> list[str]:
    return [b.source for b in blocks]


def test_nodes_ranked_above_the_first_evidence_lead_and_the_rest_must_pass():
    """The setting off (``fill_by_ranking=False``): after the first evidence, only nodes at the threshold."""
    ranked = nodes(0.30, 0.35, 0.50, 0.20, 0.45)
    blocks = build_evidence_blocks(ranked, evidence_threshold=0.42, max_blocks=5, fill_by_ranking=False)
    assert sources(blocks) == ["d0.md", "d1.md", "d2.md", "d4.md"]  # d3, below the first evidence, is left out
    assert [any(r.startswith("l1_rank:") for r in b.hit_reasons) for b in blocks] == [True, True, False, False]
    lead = "l1_rank:ranked 2, above the first evidence at rank 3 (evidence score 0.350 < 0.420)"
    assert lead in blocks[1].hit_reasons


def test_the_cap_keeps_one_block_at_the_threshold():
    ranked = nodes(0.30, 0.31, 0.32, 0.50, 0.45)
    assert sources(build_evidence_blocks(ranked, evidence_threshold=0.42, max_blocks=2)) == ["d0.md", "d3.md"]
    assert sources(build_evidence_blocks(ranked, evidence_threshold=0.42, max_blocks=1)) == ["d3.md"]


def test_without_evidence_nothing_leads():
    for fill in (True, False):
        assert (
            build_evidence_blocks(nodes(0.41, 0.30), evidence_threshold=0.42, max_blocks=5, fill_by_ranking=fill) == []
        )
        assert build_evidence_blocks([], evidence_threshold=0.42, max_blocks=5, fill_by_ranking=fill) == []


def test_once_a_node_is_evidence_the_blocks_follow_the_ranking():
    ranked = nodes(0.30, 0.50, 0.20, 0.45, 0.10, 0.44)
    blocks = build_evidence_blocks(ranked, evidence_threshold=0.42, max_blocks=5)
    assert sources(blocks) == ["d0.md", "d1.md", "d2.md", "d3.md", "d4.md"]  # rank order; d5, at the threshold, 6th
    assert [is_ranking_fill(b) for b in blocks] == [False, False, True, False, True]
    assert blocks[0].hit_reasons[-1] == (
        "l1_rank:ranked 1, above the first evidence at rank 2 (evidence score 0.300 < 0.420)"
    )
    assert blocks[2].hit_reasons[-1] == (
        "l1_rank:ranked 3, below the first evidence at rank 2 (evidence score 0.200 < 0.420)"
    )
    assert not any(r.startswith("l1_rank:") for b in (blocks[1], blocks[3]) for r in b.hit_reasons)
    # The setting off: today's list, the nodes at the threshold after the first evidence (d5 among them).
    off = build_evidence_blocks(ranked, evidence_threshold=0.42, max_blocks=5, fill_by_ranking=False)
    assert sources(off) == ["d0.md", "d1.md", "d3.md", "d5.md"] and not any(is_ranking_fill(b) for b in off)


def test_the_fill_keeps_one_block_at_the_threshold_and_stops_at_the_cap():
    ranked = nodes(0.30, 0.31, 0.32, 0.50, 0.20)
    assert sources(build_evidence_blocks(ranked, evidence_threshold=0.42, max_blocks=2)) == ["d0.md", "d3.md"]
    ranked = nodes(0.50, 0.30, 0.20, 0.10)
    assert sources(build_evidence_blocks(ranked, evidence_threshold=0.42, max_blocks=3)) == ["d0.md", "d1.md", "d2.md"]


def test_without_the_lead_the_fill_starts_at_the_first_evidence():
    ranked = nodes(0.30, 0.50, 0.20)
    blocks = build_evidence_blocks(ranked, evidence_threshold=0.42, max_blocks=5, follow_ranking=False)
    assert sources(blocks) == ["d1.md", "d2.md"] and is_ranking_fill(blocks[1])


def test_an_exact_identifier_is_evidence_of_its_own():
    ranked = nodes(0.30, 0.20, 0.25, exact=1)
    blocks = build_evidence_blocks(ranked, evidence_threshold=0.42, max_blocks=5)
    assert sources(blocks) == ["d0.md", "d1.md", "d2.md"]  # d1 answers: the lookup has evidence, d2 follows it
    assert not any(r.startswith("l1_rank:") for r in blocks[1].hit_reasons)
    assert [is_ranking_fill(b) for b in blocks] == [False, False, True]
    off = build_evidence_blocks(ranked, evidence_threshold=0.42, max_blocks=5, fill_by_ranking=False)
    assert sources(off) == ["d0.md", "d1.md"]


def test_strict_mode_keeps_only_nodes_at_the_threshold():
    ranked = nodes(0.30, 0.50, 0.20, 0.45)
    strict = build_evidence_blocks(
        ranked, evidence_threshold=0.42, max_blocks=5, follow_ranking=False, fill_by_ranking=False
    )
    assert sources(strict) == ["d1.md", "d3.md"]
