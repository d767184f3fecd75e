"""BM25 in Milvus (``lexical_mode = milvus_bm25``): one ``hybrid_search`` call per L1 attempt on Milvus Lite, the
category filter on both requests, exact dense similarities, and the in-process fallback for older collections."""

from __future__ import annotations

import numpy as np
import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.indexing.milvus import engine_has_full_text, full_text_off
from kb_retrieval.retrieval.bm25 import analysed_text
from kb_retrieval.retrieval.l1.full_text import dense_score
from tests.conftest import SAMPLE_KB, SHARED
from tests.support.kb import ingested

QUERY = "MySQL replica is many seconds behind the primary"
#: Words of Redis runbooks: BM25 finds Redis chunks for it, unless a filter keeps them out.
REDIS_WORDS = "redis maxmemory evicted keys used_memory replication lag"


class CallCounter:
    """Wraps the Milvus client's read calls and records each one's name."""

    NAMES = ("search", "hybrid_search", "query", "get", "query_iterator")

    def __init__(self, client) -> None:
        self.calls: list[str] = []
        for name in self.NAMES:
            original = getattr(client, name)

            def counted(*args, _original=original, _name=name, **kwargs):
                self.calls.append(_name)
                return _original(*args, **kwargs)

            setattr(client, name, counted)


@pytest.fixture(scope="module")
def bm25_lookup(sample_settings, embed_model) -> KnowledgeLookup:
    # A long freshness interval: the index-version check (one small query every few seconds) stays out of the count.
    return KnowledgeLookup(sample_settings.model_copy(update={"freshness_check_s": 3600}), embed_model=embed_model)


def test_sample_collection_has_full_text_search(bm25_lookup):
    assert full_text_off(bm25_lookup.client, bm25_lookup.settings) is None
    assert bm25_lookup.lexical_mode == "milvus_bm25" and bm25_lookup.lexical is None  # nothing built in memory
    assert "milvus_bm25" not in bm25_lookup.features_off


@pytest.mark.parametrize(
    "query", [QUERY, "RedisMemoryHigh: memory above 90% of maxmemory on cache-01", "disk almost full on db host"]
)
def test_a_lookup_makes_one_milvus_call_per_attempt(bm25_lookup, query):
    # Warm: the evidence documents' sections (small-to-big, a query per document not yet cached) are in the cache.
    bm25_lookup.lookup(query)
    counter = CallCounter(bm25_lookup.client)
    result = bm25_lookup.lookup(query)
    attempts = result.retrieval_trace.attempts
    assert counter.calls == ["hybrid_search"] * len(attempts)
    assert all(a.lexical_mode == "milvus_bm25" for a in attempts)
    assert "search" in result.stage_ms and "lexical" not in result.stage_ms  # no in-process BM25 stage


def test_the_usual_lookup_is_one_call(bm25_lookup):
    bm25_lookup.lookup(QUERY)  # warm, as above
    counter = CallCounter(bm25_lookup.client)
    result = bm25_lookup.lookup(QUERY)
    assert result.retrieval_trace.attempts[0].milvus_calls == 1
    assert len(result.retrieval_trace.attempts) == 1 and counter.calls == ["hybrid_search"]
    assert result.found and result.evidence_blocks[0].source == "mysql/replication-lag.md"
    assert result.retrieval_trace.attempts[0].lexical_count > 0


def test_category_filter_applies_to_both_requests(bm25_lookup, embed_model):
    embedding = embed_query(embed_model, REDIS_WORDS)
    unfiltered = bm25_lookup.hybrid.search(embedding, REDIS_WORDS, None)
    by_id = {c.chunk_id: c for c in unfiltered.candidates}
    assert any(by_id[i].category == "redis" for i in unfiltered.lexical_scores if i in by_id)  # the hits exist

    filtered = bm25_lookup.hybrid.search(embedding, REDIS_WORDS, "mysql")
    assert filtered.lexical_mode == "milvus_bm25" and filtered.lexical_count > 0
    assert {c.category for c in filtered.candidates} == {"mysql"}
    assert set(filtered.lexical_scores) <= {c.chunk_id for c in filtered.candidates}
    # Relative to the best hit *under the filter*: the best mysql hit is 1.0.
    assert max(filtered.lexical_scores.values()) == 1.0


def test_exact_identifier_chunks_come_in_the_same_call(bm25_lookup, embed_model):
    """A rare identifier's chunks are candidates with their dense similarity, from the one hybrid call, even when
    neither the dense nor the BM25 request returns them (top_k and lexical_top_k of 1)."""
    query = f"{QUERY}, resolver says ENOTFOUND"
    narrow = bm25_lookup.with_settings(top_k=1, lexical_top_k=1)
    exact_ids = {c for hit in narrow.exact.match(query) for c in hit.chunk_ids}
    assert exact_ids  # the DNS runbook's chunk that holds ENOTFOUND
    counter = CallCounter(narrow.client)
    embedding = embed_query(embed_model, query)
    found = narrow.hybrid.search(embedding, query, None)
    assert counter.calls == ["hybrid_search"] and found.milvus_calls == 1
    by_id = {c.chunk_id: c for c in found.candidates}
    assert found.candidates[0].chunk_id not in exact_ids  # the dense top 1 is a MySQL chunk ...
    assert not exact_ids & set(found.lexical_scores)  # ... BM25's top 1 too ...
    assert exact_ids <= set(by_id)  # ... and the identifier's chunks came all the same
    assert all(found.exact_terms[c] == ["ENOTFOUND"] for c in exact_ids)
    dense = {c.chunk_id: c for c in narrow.dense.search(embedding, None, ids=sorted(exact_ids)).candidates}
    for chunk_id in exact_ids:
        assert by_id[chunk_id].similarity == pytest.approx(dense[chunk_id].similarity, abs=1e-5)
    # The category filter applies to them too: the DNS runbook is not a MySQL document.
    filtered = narrow.hybrid.search(embedding, query, "mysql")
    assert filtered.milvus_calls == 1 and {c.category for c in filtered.candidates} == {"mysql"}


def test_in_process_mode_makes_a_second_call_only_for_lexical_or_identifier_candidates(bm25_lookup, embed_model):
    """The fallback on the same collection: a dense search, and, when BM25 or an exact identifier brings chunks, a
    read of them by key beside it (both named in the trace; tests/retrieval/test_hybrid_in_process.py)."""
    from kb_retrieval.retrieval.bm25 import LexicalIndex
    from kb_retrieval.retrieval.hybrid import HybridRetriever

    texts = [(c, f"{c} text", "") for c in ("a", "b")]
    fallback = HybridRetriever(
        bm25_lookup.dense, LexicalIndex.build(texts), bm25_lookup.settings, exact=bm25_lookup.exact
    )
    assert fallback.lexical_mode == "in_process_bm25"
    embedding = embed_query(embed_model, QUERY)
    fallback.dense.search(embedding, kept=fallback.kept)  # an earlier lookup: the dense hits' rows kept
    counter = CallCounter(bm25_lookup.client)
    found = fallback.search(embedding, QUERY, None)
    assert counter.calls == ["search"] and found.milvus_calls == 1 and found.lexical_mode == "in_process_bm25"
    query = "the checkout service logs getaddrinfo ENOTFOUND since the deploy"
    one = bm25_lookup.with_settings(top_k=1)  # the dense search alone misses some of the identifier's chunks
    narrow = HybridRetriever(one.dense, LexicalIndex.build(texts), one.settings, exact=bm25_lookup.exact)
    embedding = embed_query(embed_model, query)
    narrow.dense.search(embedding, kept=narrow.kept)
    counter.calls.clear()
    found = narrow.search(embedding, query, None)
    assert sorted(counter.calls) == ["query", "search"] and found.milvus_calls == 2 and found.lexical_added > 0


def test_hybrid_similarity_equals_the_dense_search(bm25_lookup, embed_model):
    embedding = embed_query(embed_model, QUERY)
    hybrid = bm25_lookup.hybrid.search(embedding, QUERY, None)
    assert hybrid.lexical_added > 0  # lexical-only hits are compared too
    dense = bm25_lookup.dense.search(embedding, None, ids=[c.chunk_id for c in hybrid.candidates])
    expected = {c.chunk_id: c for c in dense.candidates}
    assert set(expected) == {c.chunk_id for c in hybrid.candidates}
    for c in hybrid.candidates:
        assert c.score == pytest.approx(expected[c.chunk_id].score, abs=1e-5)
        assert c.similarity == pytest.approx(expected[c.chunk_id].similarity, abs=1e-5)
        assert c.score_label is expected[c.chunk_id].score_label


def test_hybrid_dense_candidates_are_the_dense_top_k(bm25_lookup, embed_model):
    """The dense part of the hybrid answer is what a dense search returns, in the same order."""
    embedding = embed_query(embed_model, QUERY)
    top_k = bm25_lookup.settings.retrieval.top_k
    hybrid = bm25_lookup.hybrid.search(embedding, QUERY, "mysql")
    dense = bm25_lookup.dense.search(embedding, "mysql")
    assert [c.chunk_id for c in hybrid.candidates[: len(dense.candidates)]] == [c.chunk_id for c in dense.candidates]
    assert len(dense.candidates) <= top_k


def test_l2_collection_similarity_equals_the_dense_search(tmp_path, embed_model):
    settings = ingested(
        [SAMPLE_KB / "mysql", SAMPLE_KB / "redis"],
        tmp_path,
        embed_model,
        metric="L2",
        collection="kb_l2",
        vector_store_mode="sdk",
    )
    lookup = KnowledgeLookup(settings, embed_model=embed_model)
    assert lookup.lexical_mode == "milvus_bm25"
    embedding = embed_query(embed_model, QUERY)
    hybrid = lookup.hybrid.search(embedding, QUERY, None)
    dense = {
        c.chunk_id: c
        for c in lookup.dense.search(embedding, None, ids=[c.chunk_id for c in hybrid.candidates]).candidates
    }
    for c in hybrid.candidates:
        assert c.score_label.value == "l2_distance"
        assert c.score == pytest.approx(dense[c.chunk_id].score, abs=1e-5)


def test_collection_without_full_text_falls_back_and_says_so(tmp_path, embed_model):
    # A collection made before full-text search (no analysed text field, no BM25 function).
    ingested([SAMPLE_KB / "mysql"], tmp_path, embed_model, vector_store_mode="sdk", lexical_text_field="")
    lookup = KnowledgeLookup(KBSettings(state_dir=tmp_path, vector_store_mode="sdk"), embed_model=embed_model)
    assert lookup.lexical_mode == "in_process_bm25" and lookup.lexical is not None
    assert "has no BM25 function" in lookup.features_off["milvus_bm25"]
    result = lookup.lookup(QUERY)
    assert result.found and result.evidence_blocks[0].source == "replication-lag.md"
    assert result.retrieval_trace.attempts[0].lexical_mode == "in_process_bm25"
    assert any(note.startswith("milvus_bm25 off: ") for note in result.query_transform.notes)
    # Ingest into it again keeps working (rows without the analysed text field).
    again = ingest(
        [SAMPLE_KB / "mysql"], KBSettings(state_dir=tmp_path, vector_store_mode="sdk"), embed_model=embed_model
    )
    assert again.chunks_embedded == 0


def test_a_row_without_analysed_text_is_written_on_lite(tmp_path, embed_model):
    """Another writer's row (no analysed text) goes in on Lite, found by the dense request, never by BM25."""
    settings = ingested([SAMPLE_KB / "mysql"], tmp_path, embed_model, vector_store_mode="sdk")
    lookup = KnowledgeLookup(settings, embed_model=embed_model)
    embedding = embed_query(embed_model, QUERY)
    row = {
        settings.schema_fields.id_field: "other-writer-1",
        settings.schema_fields.content_field: QUERY,
        settings.schema_fields.vector_field: embedding,
        settings.schema_fields.metadata_field: {"title": "other"},
        settings.schema_fields.category_field: "other",
        settings.schema_fields.source_field: "other.md",
    }
    lookup.client.insert(settings.storage.collection, [row])
    found = lookup.hybrid.search(embedding, QUERY, None)
    assert found.candidates[0].chunk_id == "other-writer-1" and "other-writer-1" not in found.lexical_scores
    lookup.close()


def test_lexical_off_is_named(sample_settings, embed_model):
    lookup = KnowledgeLookup(sample_settings.model_copy(update={"lexical_enabled": False}), embed_model=embed_model)
    assert lookup.lexical_mode == "off"
    assert lookup.lookup(QUERY).retrieval_trace.attempts[0].lexical_mode == "off"


@pytest.mark.unit
def test_dense_score_matches_each_metric():
    q = np.asarray([0.6, 0.8], dtype=np.float32)
    assert dense_score(q, [0.6, 0.8], "COSINE") == pytest.approx(1.0)
    assert dense_score(q, [1.2, 1.6], "COSINE") == pytest.approx(1.0)  # cosine ignores length
    assert dense_score(q, [1.2, 1.6], "IP") == pytest.approx(2.0)
    assert dense_score(q, [0.0, 0.0], "L2") == pytest.approx(1.0)  # squared distance
    assert dense_score(q, [0.6, 0.8], "L2") == pytest.approx(0.0)


@pytest.mark.unit
def test_analysed_text_splits_identifiers_and_stems():
    assert analysed_text("KubePersistentVolumeFillingUp") == "kubepersistentvolumefillingup kube persist volum fill up"
    assert analysed_text("the and of") == ""


def test_analysed_text_is_the_bm25s_tokenizers_analysis():
    """``analysed_text`` runs without bm25s (its import costs ~0.6 s a process); every text of the sample KB and of
    the public corpora is analysed as the bm25s tokenizer that in-process BM25 uses analyses it, with its stopwords."""
    from bm25s.stopwords import STOPWORDS_EN as BM25S_STOPWORDS

    from kb_retrieval.retrieval.bm25.analysis import STOPWORDS_EN, bm25s_tokenizer, with_identifier_parts

    assert frozenset(BM25S_STOPWORDS) == STOPWORDS_EN
    roots = [SAMPLE_KB, *(SHARED / "corpora" / name for name in ("runbooks", "prometheus-docs"))]
    texts = [p.read_text(encoding="utf-8", errors="replace") for root in roots for p in sorted(root.rglob("*.md"))]
    texts += ["", "the and of", "ÜBER Größe naïve café", "KubePodCrashLooping: the pods are restarting", "a_b x9 __"]
    assert len(texts) > 200
    for text in texts:
        tokens = bm25s_tokenizer().tokenize(
            [with_identifier_parts(text)], update_vocab=True, return_as="string", show_progress=False
        )
        assert analysed_text(text) == " ".join(t for t in tokens[0] if t), text[:80]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("version", "expected"), [("v2.3.5", False), ("v2.4.9", False), ("v2.5.4", True), ("2.6.0", True), ("dev", False)]
)
def test_a_server_has_full_text_search_from_2_5(version, expected):
    class Server:
        def get_server_version(self) -> str:
            return version

    assert engine_has_full_text(Server(), lite=False) is expected  # type: ignore[arg-type]
