"""The lexical signal, the document-focus boost and the id filter: logic pinned with small fakes."""

from __future__ import annotations

import pytest

from kb_retrieval.models import L0Hints, QueryTransform
from kb_retrieval.retrieval.bm25 import LexicalIndex, with_identifier_parts
from kb_retrieval.retrieval.dedupe import SourceDeduplicator
from kb_retrieval.retrieval.evidence import build_evidence_blocks
from kb_retrieval.retrieval.filters import in_expr
from kb_retrieval.retrieval.hybrid import LookupQuery
from kb_retrieval.retrieval.rerank import RuleReranker
from kb_retrieval.retrieval.stage import candidate_node, stage_of
from tests.support.candidates import cand

pytestmark = pytest.mark.unit


def test_lexical_finds_exact_vocabulary_and_respects_category():
    index = LexicalIndex.build(
        [
            ("a", "Alertmanager has not found all other cluster members", "alertmanager"),
            ("b", "Prometheus remote write is behind", "prometheus"),
            ("c", "cluster members of etcd are down", "etcd"),
        ]
    )
    hits = index.search("has not found all other cluster members", 5)
    assert [h.chunk_id for h in hits][:2] == ["a", "c"] and hits[0].score == 1.0
    assert all(0 < h.score <= 1 for h in hits)
    assert [h.chunk_id for h in index.search("cluster members", 5, category="etcd")] == ["c"]
    assert index.search("zzz unknown words", 5) == [] and LexicalIndex.build([]).search("x", 3) == []


def with_hints(hints: L0Hints) -> LookupQuery:
    transform = QueryTransform(original_query="q", normalized_query="q", hints=hints, filter_reason="test")
    return LookupQuery(query_str="q", transform=transform)


def record_of(node):
    record = stage_of(node).rerank
    assert record is not None
    return record


def test_lexical_boost_ranks_but_does_not_make_evidence():
    nodes = [candidate_node(cand("a", "a.md", 0.40), lexical_score=1.0), candidate_node(cand("b", "b.md", 0.45))]
    ranked = RuleReranker(lexical_weight=0.2).postprocess_nodes(nodes, query_bundle=with_hints(L0Hints()))
    assert [n.node.node_id for n in ranked] == ["a", "b"]  # 0.40 + 0.2 beats 0.45
    record = record_of(ranked[0])
    assert record.boosts == {"lexical": 0.2} and "lexical_bm25:1.000" in [str(r) for r in record.hit_reasons]
    assert record.evidence_score == pytest.approx(0.40)  # BM25 is relative: not evidence of an answer
    assert build_evidence_blocks(ranked[:1], evidence_threshold=0.42, max_blocks=5) == []  # a alone: no answer
    blocks = build_evidence_blocks(ranked, evidence_threshold=0.42, max_blocks=5, follow_ranking=False)
    assert [b.source for b in blocks] == ["b.md"]


def test_focus_prefers_the_document_about_the_query():
    focused = [cand(f"r{i}", "runbook.md", 0.60, chunk_count=4) for i in range(3)]
    catch_all = [cand("x1", "catch-all.md", 0.66, chunk_count=40)]
    nodes = [candidate_node(c) for c in focused + catch_all]
    ranked = RuleReranker().postprocess_nodes(nodes, query_str="q")
    kept = SourceDeduplicator(focus_weight=0.45).postprocess_nodes(ranked)
    assert [stage_of(node).candidate.source for node in kept] == ["runbook.md", "catch-all.md"]
    runbook, other = (record_of(n).boosts["doc_focus"] for n in kept)
    assert runbook == pytest.approx(0.45) and other == pytest.approx(0.45 * (1 / 42) / 0.5, abs=1e-6)
    assert stage_of(kept[0]).merged_chunks == 3
    assert [c.chunk_id for c in stage_of(kept[0]).sections] == ["r1", "r2"]
    without = SourceDeduplicator().postprocess_nodes([candidate_node(c) for c in focused + catch_all])
    assert stage_of(without[0]).candidate.source == "catch-all.md"


def test_in_expr_escapes_every_value():
    assert in_expr("id", ["a", 'b" or id != "']) == 'id in ["a", "b\\" or id != \\""]'
    with pytest.raises(ValueError):
        in_expr("id or 1", ["a"])


def test_identifiers_match_their_parts_and_stay_whole():
    text = "KubePersistentVolumeFillingUp on kube_pod_status_ready"
    assert with_identifier_parts(text) == f"{text}\nkube persistent volume filling up kube pod status ready"
    assert with_identifier_parts("plain words only, Title Case too") == "plain words only, Title Case too"
    index = LexicalIndex.build(
        [
            ("pv", "KubePersistentVolumeFillingUp\nCheck the claim", "kubernetes"),
            ("node", "NodeFilesystemSpaceFillingUp\nCheck the disk", "node"),
        ]
    )
    # The alert text spells the identifier's words apart; the runbook names it as one identifier.
    assert index.search("PersistentVolume is filling up", 5)[0].chunk_id == "pv"
    exact = index.search("KubePersistentVolumeFillingUp", 5)  # the whole identifier still counts on its own
    assert exact[0].chunk_id == "pv" and all(h.score < 0.5 for h in exact[1:])


def test_title_terms_boost_ranks_but_does_not_make_evidence():
    hints = L0Hints(title_coverage={"a.md": 0.8})
    nodes = [candidate_node(cand("a", "a.md", 0.40)), candidate_node(cand("b", "b.md", 0.50))]
    ranked = RuleReranker(boosts={"title_terms": 0.2}).postprocess_nodes(nodes, query_bundle=with_hints(hints))
    assert [n.node.node_id for n in ranked] == ["a", "b"]  # 0.40 + 0.2 x 0.8 beats 0.50
    record = record_of(ranked[0])
    assert record.boosts == {"title_terms": pytest.approx(0.16)}
    assert "l0_title_terms:0.80" in [str(r) for r in record.hit_reasons]
    assert record.evidence_score == pytest.approx(0.40)
    assert build_evidence_blocks(ranked[:1], evidence_threshold=0.42, max_blocks=5) == []  # a alone: no answer
    strict = build_evidence_blocks(ranked, evidence_threshold=0.42, max_blocks=5, follow_ranking=False)
    assert [b.source for b in strict] == ["b.md"]


def test_bm25_header_is_the_one_the_embedding_sees():
    from kb_retrieval.retrieval.bm25 import lexical_header

    # A runbook whose breadcrumb starts at its H1: the frontmatter title's words lead, as in the embedded text.
    assert lexical_header("Kube Persistent Volume Filling Up", "KubePersistentVolumeFillingUp > Diagnosis") == (
        "Kube Persistent Volume Filling Up > KubePersistentVolumeFillingUp > Diagnosis"
    )
    assert lexical_header("Redis memory usage high", "Redis memory usage high > Symptoms") == (
        "Redis memory usage high > Symptoms"
    )
    assert lexical_header(None, "A > B") == "A > B" and lexical_header("T", None) == "T"


def test_evidence_score_leaves_out_only_the_ranking_only_boosts():
    def categorised(chunk_id: str, similarity: float):
        return cand(chunk_id, f"{chunk_id}.md", similarity).model_copy(update={"category": "redis"})

    nodes = [
        candidate_node(categorised("both", 0.4123456), lexical_score=0.7),  # an evidence boost and a ranking-only one
        candidate_node(categorised("l0", 0.3333333)),  # an evidence boost alone: the evidence score is the score
        candidate_node(cand("none", "none.md", 0.2222222)),  # no boost: base, score and evidence score alike
    ]
    reranker = RuleReranker(lexical_weight=0.2)
    ranked = reranker.postprocess_nodes(nodes, query_bundle=with_hints(L0Hints(domains=["redis"])))
    by_id = {n.node.node_id: (n.score, record_of(n)) for n in ranked}
    category = reranker.boosts["l0_category"]
    score, both = by_id["both"]
    assert both.boosts == {"l0_category": category, "lexical": 0.14}
    assert score == round(0.4123456 + category + 0.14, 6)
    assert both.evidence_score == round(0.4123456 + category, 6) != score
    score, l0 = by_id["l0"]
    assert l0.evidence_score == score == round(0.3333333 + category, 6)
    score, none = by_id["none"]
    assert none.boosts == {} and none.evidence_score == none.base_score == score == round(0.2222222, 6)
