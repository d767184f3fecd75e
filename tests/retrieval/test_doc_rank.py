"""The document ranker: one linear model over document similarities and the rule reranker's boosts, pinned with
in-memory vectors (the real vectors, written by ingest and read from Milvus, are in tests/indexing/test_doc_vectors.py
and the whole pipeline in tests/test_engine.py)."""

from __future__ import annotations

import numpy as np
import pytest

from kb_retrieval.indexing.doc_vectors import DocumentVectors
from kb_retrieval.indexing.static_embed import StaticEmbedder
from kb_retrieval.models import L0Hints, QueryTransform
from kb_retrieval.retrieval.doc_rank import SIGNALS, DocumentRanker, interleave_by_content, l0_signal
from kb_retrieval.retrieval.evidence import build_evidence_blocks
from kb_retrieval.retrieval.hybrid import LookupQuery
from kb_retrieval.retrieval.rerank import RuleReranker
from kb_retrieval.retrieval.stage import candidate_node, stage_of
from kb_retrieval.scoring_profile import BUILT_IN_PROFILE
from tests.support.candidates import cand

pytestmark = pytest.mark.unit

E1, E2, E3 = np.eye(3, dtype=np.float32)


def vectors(**by_source: tuple[np.ndarray, np.ndarray, np.ndarray]) -> DocumentVectors:
    return DocumentVectors({source.replace("_", "/") + ".md": np.stack(v) for source, v in by_source.items()})


def query(embedding: list[float]) -> LookupQuery:
    transform = QueryTransform(original_query="q", normalized_query="q", hints=L0Hints(), filter_reason="test")
    return LookupQuery(query_str="q", embedding=embedding, transform=transform)


def reranked(*candidates, q: LookupQuery):
    return RuleReranker(lexical_weight=0.2).postprocess_nodes([candidate_node(c) for c in candidates], query_bundle=q)


def test_the_document_that_matches_as_a_whole_comes_first():
    # b's best chunk is closer, but a's title, summary and text are about the query.
    q = query([1.0, 0.0, 0.0])
    nodes = reranked(cand("a1", "k/a.md", 0.50), cand("b1", "k/b.md", 0.60), q=q)
    assert [stage_of(n).candidate.source for n in nodes] == ["k/b.md", "k/a.md"]
    ranker = DocumentRanker(vectors=vectors(k_a=(E1, E1, E1), k_b=(E2, E2, E3)))
    ranked = ranker.postprocess_nodes(nodes, query_bundle=q)
    assert [stage_of(n).candidate.source for n in ranked] == ["k/a.md", "k/b.md"]
    record = stage_of(ranked[0]).rerank
    assert record is not None
    weights = BUILT_IN_PROFILE
    assert record.ranking == pytest.approx(
        {"doc_title": weights.rank_title, "doc_summary": weights.rank_summary, "doc_text": weights.rank_text}
    )
    assert ranked[0].score == pytest.approx(sum(record.ranking.values()))
    assert "l1_document:title 1.000 summary 1.000 text 1.000" in [str(r) for r in record.hit_reasons]


class TableStatic(StaticEmbedder):
    """A static model that knows a few texts' vectors (the real one is in tests/indexing/test_static_embed.py)."""

    def __init__(self, by_text: dict[str, np.ndarray]) -> None:
        self.by_text = by_text

    @property
    def dim(self) -> int:
        return 3

    def embed(self, texts):
        return np.stack([self.by_text[t] for t in texts])


def test_the_static_model_s_opinion_breaks_a_tie():
    q = query([1.0, 0.0, 0.0])  # its text is "q"
    nodes = reranked(cand("b1", "k/b.md", 0.5), cand("a1", "k/a.md", 0.5), q=q)
    same = (E2, E2, E2)
    both = DocumentVectors(
        {"k/a.md": np.stack(same), "k/b.md": np.stack(same)},
        static={"k/a.md": E1, "k/b.md": E2},
        static_model=TableStatic({"q": E1}),
    )
    ranked = DocumentRanker(vectors=both).postprocess_nodes(nodes, query_bundle=q)
    assert [stage_of(n).candidate.source for n in ranked] == ["k/a.md", "k/b.md"]
    top, other = (stage_of(n).rerank for n in ranked)
    assert top is not None and other is not None
    assert top.ranking["doc_static"] == pytest.approx(BUILT_IN_PROFILE.rank_static_summary)
    assert "doc_static" not in other.ranking  # similarity 0: nothing to record
    assert "l1_document:title 0.000 summary 0.000 text 0.000 static 1.000" in [str(r) for r in top.hit_reasons]


def test_the_weighted_title_breaks_a_tie_on_the_word_the_documents_do_not_all_share():
    q = query([1.0, 0.0, 0.0])  # its text is "q"
    nodes = reranked(cand("b1", "k/b.md", 0.5), cand("a1", "k/a.md", 0.5), q=q)
    same = np.stack((E2, E2, E2))
    model = TableStatic({"q": E1, "acme": E1, "alpha": E1, "beta": E2})
    both = DocumentVectors(
        {"k/a.md": same, "k/b.md": same},
        static={"k/a.md": E3, "k/b.md": E3},
        static_model=model,
        titles={"k/a.md": "Acme alpha", "k/b.md": "Acme beta"},
        terms={"k/a.md": "acme alpha", "k/b.md": "acme beta"},
    )
    assert both.term_weights is not None and both.term_weights("acme") < both.term_weights("alpha")
    ranked = DocumentRanker(vectors=both).postprocess_nodes(nodes, query_bundle=q)
    assert [stage_of(n).candidate.source for n in ranked] == ["k/a.md", "k/b.md"]
    top, other = (stage_of(n).rerank for n in ranked)
    assert top is not None and other is not None
    # "Acme" is in both titles and weighs less than "alpha": a's title is nearer E1 than b's.
    assert top.ranking["doc_static_title"] > other.ranking["doc_static_title"] > 0
    assert top.ranking["doc_static_title"] <= BUILT_IN_PROFILE.rank_static_title
    assert any("weighted title" in str(r) for r in top.hit_reasons)


def test_boosts_count_with_their_ranking_weights():
    q = query([1.0, 0.0, 0.0])
    a, b = cand("a1", "k/a.md", 0.5), cand("b1", "k/b.md", 0.5)
    nodes = [candidate_node(a, lexical_score=1.0), candidate_node(b)]
    nodes = RuleReranker(lexical_weight=0.2).postprocess_nodes(nodes, query_bundle=q)
    same = (E2, E2, E2)
    ranker = DocumentRanker(
        weights={**BUILT_IN_PROFILE.ranking_weights(), "lexical": 3.0}, vectors=vectors(k_a=same, k_b=same)
    )
    ranked = ranker.postprocess_nodes(nodes, query_bundle=q)
    top = stage_of(ranked[0])
    assert top.candidate.source == "k/a.md" and top.rerank is not None
    assert top.rerank.ranking["lexical"] == pytest.approx(0.6)  # 3.0 x the 0.2 boost
    assert "chunk" not in top.rerank.ranking  # rank_chunk is 0 by default: not recorded


def test_every_ranking_weight_names_a_signal_the_ranker_records():
    # The ranker multiplies the weights of SIGNALS only: a weight of another name would count for nothing.
    assert tuple(BUILT_IN_PROFILE.ranking_weights()) == SIGNALS
    q = query([1.0, 0.0, 0.0])
    nodes = RuleReranker(lexical_weight=0.2).postprocess_nodes(
        [candidate_node(cand("a1", "k/a.md", 0.5), lexical_score=1.0)], query_bundle=q
    )
    ranker = DocumentRanker(weights=dict.fromkeys(SIGNALS, 1.0), vectors=vectors(k_a=(E1, E1, E1)))
    top = stage_of(ranker.postprocess_nodes(nodes, query_bundle=q)[0]).rerank
    assert top is not None and {"doc_title", "chunk", "lexical"} <= set(top.ranking) <= set(SIGNALS)


def test_the_title_counts_once_in_the_l0_signal():
    # The L0 title hit and the title's terms both say the query names the title: with both, the L0 title's is left
    # out; alone, it counts, and so does every other L0 boost.
    others = {"l0_keyword": 0.1, "l0_entity": 0.02, "l0_category": 0.03, "breadcrumb": 0.04, "content": 0.05}
    assert l0_signal({"l0_title": 0.3, "title_terms": 0.2, **others}) == pytest.approx(0.24)
    assert l0_signal({"l0_title": 0.3, **others}) == pytest.approx(0.54)
    assert l0_signal({"l0_title": 0.3, "title_terms": 0.0}) == pytest.approx(0.3)
    assert l0_signal({"title_terms": 0.2, "lexical": 0.1, "doc_focus": 0.1, "exact_match": 1.0}) == 0.0


def test_ranking_leads_the_evidence_but_never_makes_a_lookup_find():
    q = query([1.0, 0.0, 0.0])
    ranker = DocumentRanker(vectors=vectors(k_a=(E1, E1, E1), k_b=(E2, E2, E2)))
    ranked = ranker.postprocess_nodes(reranked(cand("a1", "k/a.md", 0.30), cand("b1", "k/b.md", 0.60), q=q), q)
    assert stage_of(ranked[0]).candidate.source == "k/a.md"
    blocks = build_evidence_blocks(ranked, evidence_threshold=0.45, max_blocks=5)
    # b's chunk makes the lookup answer; a, ranked above it, leads what the agent receives.
    assert [b.source for b in blocks] == ["k/a.md", "k/b.md"]
    lead = "l1_rank:ranked 1, above the first evidence at rank 2 (evidence score 0.300 < 0.450)"
    assert blocks[0].hit_reasons[-1] == lead
    assert not any(r.startswith("l1_rank") for r in blocks[1].hit_reasons)
    strict = build_evidence_blocks(ranked, evidence_threshold=0.45, max_blocks=5, follow_ranking=False)
    assert [b.source for b in strict] == ["k/b.md"]
    # Neither chunk at the threshold: the ranking finds nothing.
    weak = ranker.postprocess_nodes(reranked(cand("a1", "k/a.md", 0.30), cand("b1", "k/b.md", 0.40), q=q), q)
    assert build_evidence_blocks(weak, evidence_threshold=0.45, max_blocks=5) == []


def _lexical_order(interleave: bool):
    # The ranking decided by BM25 alone (a, b, c, d, e); e's content (its text vector) is the query's, the others'
    # not.
    q = query([1.0, 0.0, 0.0])
    scores = {"a": 1.0, "b": 0.9, "c": 0.8, "d": 0.7, "e": 0.6}
    nodes = [candidate_node(cand(f"{k}1", f"k/{k}.md", 0.5), lexical_score=v) for k, v in scores.items()]
    nodes = RuleReranker(lexical_weight=0.2).postprocess_nodes(nodes, query_bundle=q)
    other = (E1, E1, E2)
    ranker = DocumentRanker(
        weights={"lexical": 1.0},
        vectors=vectors(k_a=other, k_b=other, k_c=other, k_d=other, k_e=(E2, E2, E1)),
        content_interleave=interleave,
    )
    return ranker.postprocess_nodes(nodes, query_bundle=q)


def test_from_the_fourth_place_the_ranking_alternates_with_the_documents_content():
    ranked = _lexical_order(interleave=True)
    assert [stage_of(n).candidate.source for n in ranked] == ["k/a.md", "k/b.md", "k/c.md", "k/e.md", "k/d.md"]
    # Scores stay the ranking's; the trace says who was placed where and why.
    assert [n.score for n in ranked] == pytest.approx([0.2, 0.18, 0.16, 0.12, 0.14])
    moved = {stage_of(n).candidate.source: [str(r) for r in stage_of(n).rerank.hit_reasons] for n in ranked[3:]}
    placed = "l1_document:placed 4, ranked 5: from the fourth place the ranking alternates with content (text 1.000)"
    assert placed in moved["k/e.md"]
    assert any(r.startswith("l1_document:placed 5, ranked 4") for r in moved["k/d.md"])
    plain = _lexical_order(interleave=False)
    assert [stage_of(n).candidate.source for n in plain] == ["k/a.md", "k/b.md", "k/c.md", "k/d.md", "k/e.md"]
    assert not any("placed" in str(r) for n in plain for r in stage_of(n).rerank.hit_reasons)


def test_interleaving_keeps_the_first_three_and_every_document_once():
    ranked = [f"d{i}" for i in range(7)]
    content = {f"d{i}": i / 10 for i in range(7)}  # the content's order is the ranking's reversed
    assert interleave_by_content(ranked, content) == ["d0", "d1", "d2", "d6", "d3", "d5", "d4"]
    assert interleave_by_content(ranked, content, lead=1) == ["d0", "d6", "d1", "d5", "d2", "d4", "d3"]
    assert interleave_by_content(ranked[:3], content) == ranked[:3]
    assert interleave_by_content(ranked, {}) == ranked  # no content opinion: the ranking's order (ties by it)


@pytest.mark.parametrize("case", ["missing_vectors", "no_embedding", "no_vectors"])
def test_without_what_it_needs_the_order_is_left_alone(case):
    q = query([1.0, 0.0, 0.0]) if case != "no_embedding" else query([])
    nodes = reranked(cand("a1", "k/a.md", 0.50), cand("b1", "k/b.md", 0.60), q=q)
    before = [(n.node.node_id, n.score) for n in nodes]
    known = vectors(k_a=(E1, E1, E1)) if case == "missing_vectors" else vectors(k_a=(E1, E1, E1), k_b=(E2, E2, E2))
    ranker = DocumentRanker(vectors=None if case == "no_vectors" else known)
    ranked = ranker.postprocess_nodes(nodes, query_bundle=q)
    assert [(n.node.node_id, n.score) for n in ranked] == before
    assert all(not stage_of(n).rerank.ranking for n in ranked)  # type: ignore[union-attr]


def test_the_direction_every_document_shares_is_left_out_of_the_static_signal():
    # Every document's static vector is mostly E1 (the words of the knowledge base's domain) and differs from the
    # others along E2 or E3; the query says the domain too, and a little of what tells "b" apart.
    static, by_text = {}, {"q": np.array([0.99, 0.0, 0.14], dtype=np.float32)}
    for i in range(24):
        side = (E2, -E2, E3, -E3)[i % 4]
        static[f"k/d{i:02}.md"] = (E1 * 0.9 + side * (0.2 + 0.01 * (i // 4))).astype(np.float32)
    static["k/b.md"] = np.array([0.95, 0.0, 0.31], dtype=np.float32)
    static["k/a.md"] = np.array([1.0, 0.05, 0.0], dtype=np.float32)  # the domain's words alone
    same = np.stack((E2, E2, E2))
    built = {
        n: DocumentVectors(
            {s: same for s in static},
            static={s: v / np.linalg.norm(v) for s, v in static.items()},
            static_model=TableStatic(by_text),
            common_min_documents=n,
        )
        for n in (0, 20, 100)
    }
    # Kept (0: never; 100: fewer documents than that), "a" is nearer the query than "b" by the shared direction.
    for n in (0, 100):
        sims = built[n].similarities([0.0, 1.0, 0.0], ["k/a.md", "k/b.md"], "q")
        assert built[n].static_common is None and sims["k/a.md"][3] > sims["k/b.md"][3]
    removed = built[20]
    assert removed.static_common is not None and abs(float(removed.static_common @ E1)) > 0.95
    sims = removed.similarities([0.0, 1.0, 0.0], ["k/a.md", "k/b.md"], "q")
    assert sims["k/b.md"][3] > 0.99 > 0.5 > sims["k/a.md"][3]


def test_common_direction_is_the_rows_shared_direction_and_without_it_rows_stay_unit():
    from kb_retrieval.indexing.doc_vectors import common_direction, without_direction

    rows = np.array([[-3.0, 1.0, 0.0], [-3.0, -1.0, 0.0], [-3.0, 0.0, 1.0], [-3.0, 0.0, -1.0]], dtype=np.float32)
    direction = common_direction(rows)
    assert direction == pytest.approx([-1.0, 0.0, 0.0], abs=1e-6)  # signed like the rows, not like the SVD
    rest = without_direction(np.vstack([rows, np.zeros(3, np.float32), [[-1.0, 0.0, 0.0]]]), direction)
    assert rest[:4] @ direction == pytest.approx([0.0] * 4, abs=1e-6)
    assert np.linalg.norm(rest[:4], axis=1) == pytest.approx([1.0] * 4)
    assert rest[4:].tolist() == [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]  # zero rows, and one along it alone, are zero
