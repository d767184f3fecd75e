"""The three vector-store paths and their score semantics, on Milvus Lite with the real model."""

from __future__ import annotations

import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.models import ScoreLabel
from kb_retrieval.retrieval.l1 import AutoPath, L1Retriever, SdkPath, VectorStorePath
from kb_retrieval.retrieval.l1.base import L1Search
from kb_retrieval.retrieval.stage import stage_of
from tests.conftest import SAMPLE_KB
from tests.support.kb import ingested

QUERY = "MySQL replica is many seconds behind the primary"


@pytest.fixture(scope="module")
def l2_settings(tmp_path_factory, embed_model) -> KBSettings:
    l2 = tmp_path_factory.mktemp("l2")
    return ingested([SAMPLE_KB / "mysql", SAMPLE_KB / "redis"], l2, embed_model, metric="L2", collection="kb_l2")


@pytest.mark.parametrize("mode", ["sdk", "vectorstore", "auto", "spring-ai"])
def test_each_mode_serves_and_says_which_path(sample_settings, embed_model, mode):
    """On the milvus plan (a search in Milvus per attempt) the mode picks the path; on Milvus Lite ``auto`` is the
    memory plan (tests/retrieval/test_memory_plan.py), so the plan is pinned here."""
    mode_setting = KBSettings(vector_store_mode=mode).retrieval.vector_store_mode
    lookup = KnowledgeLookup(
        sample_settings.model_copy(update={"vector_store_mode": mode_setting, "lookup_plan": "milvus"}),
        embed_model=embed_model,
    )
    result = lookup.lookup(QUERY)
    expected = "sdk" if mode == "sdk" else "vectorstore"
    assert result.retrieval_trace.path_served == expected
    assert result.evidence_blocks[0].source == "mysql/replication-lag.md"
    assert result.retrieval_trace.attempts[0].path_fallback_reason is None


def test_auto_on_milvus_lite_is_the_memory_plan(sample_settings, embed_model, sample_lookup):
    settings = sample_settings.model_copy(update={"vector_store_mode": "auto"})
    lookup = KnowledgeLookup(settings, embed_model=embed_model, client=sample_lookup.client)
    assert lookup.plan == "memory"
    result = lookup.lookup(QUERY)
    assert result.retrieval_trace.path_served == "memory"
    assert result.evidence_blocks[0].source == "mysql/replication-lag.md"


def test_paths_return_the_same_candidates(sample_settings, embed_model, sample_lookup):
    embedding = embed_query(embed_model, QUERY)
    sdk = SdkPath(sample_lookup.client, sample_settings).search(embedding, 10, None)
    store = VectorStorePath(sample_settings).search(embedding, 10, None)
    assert [c.chunk_id for c in sdk.candidates] == [c.chunk_id for c in store.candidates]
    for a, b in zip(sdk.candidates, store.candidates, strict=True):
        assert (a.path, b.path) == ("sdk", "vectorstore")
        assert a.score == pytest.approx(b.score, abs=1e-6) and a.score_label is b.score_label is ScoreLabel.COSINE
        assert (a.source, a.title, a.breadcrumb, a.category, a.content) == (
            b.source,
            b.title,
            b.breadcrumb,
            b.category,
            b.content,
        )


class Exploding:
    name = "vectorstore"

    def search(self, embedding, top_k, filter_expr, timeout=None) -> L1Search:
        raise ConnectionError("vectorstore down")


def test_auto_falls_back_to_sdk_and_says_why(sample_settings, embed_model, sample_lookup):
    path = AutoPath(Exploding(), SdkPath(sample_lookup.client, sample_settings))
    lookup = KnowledgeLookup(sample_settings, embed_model=embed_model, client=sample_lookup.client, path=path)
    result = lookup.lookup(QUERY)
    attempt = result.retrieval_trace.attempts[0]
    assert attempt.path == "sdk" and result.retrieval_trace.path_served == "sdk"
    assert attempt.path_fallback_reason == "vectorstore failed: ConnectionError: vectorstore down"
    assert result.found


def test_auto_falls_back_when_the_store_cannot_be_created(sample_settings, embed_model, sample_lookup):
    broken = VectorStorePath(
        sample_settings.model_copy(update={"milvus_uri": "http://127.0.0.1:9", "milvus_timeout_s": 2})
    )
    path = AutoPath(broken, SdkPath(sample_lookup.client, sample_settings))
    lookup = KnowledgeLookup(sample_settings, embed_model=embed_model, client=sample_lookup.client, path=path)
    result = lookup.lookup(QUERY)
    assert result.retrieval_trace.path_served == "sdk"
    assert result.retrieval_trace.attempts[0].path_fallback_reason.startswith("vectorstore failed:")


def test_vectorstore_mode_failure_is_an_attempt_error_not_an_exception(sample_settings, embed_model, sample_lookup):
    lookup = KnowledgeLookup(sample_settings, embed_model=embed_model, client=sample_lookup.client, path=Exploding())
    result = lookup.lookup(QUERY)
    assert result.found is False
    assert result.retrieval_trace.attempts[0].outcome == "error"
    assert "vectorstore down" in result.retrieval_trace.attempts[0].error


def test_l2_collection_keeps_distance_and_normalises_like_cosine(
    l2_settings, sample_settings, embed_model, sample_lookup
):
    embedding = embed_query(embed_model, QUERY)
    l2 = KnowledgeLookup(l2_settings, embed_model=embed_model)
    l2_hits = L1Retriever(l2.path, l2_settings, embed_model).search(embedding, top_k=5).candidates
    cos_hits = L1Retriever(sample_lookup.path, sample_settings, embed_model).search(embedding, top_k=5).candidates
    assert [c.score_label for c in l2_hits] == [ScoreLabel.L2] * 5
    raw = [c.score for c in l2_hits]
    assert raw == sorted(raw)  # distances: lower is better, Milvus order kept
    assert (l2_hits[0].source, cos_hits[0].source) == ("replication-lag.md", "mysql/replication-lag.md")
    assert l2_hits[0].similarity == pytest.approx(cos_hits[0].similarity, abs=1e-4)
    assert l2_hits[0].similarity == pytest.approx(1 - l2_hits[0].score / 2, abs=1e-6)
    result = l2.lookup(QUERY)  # thresholds work on the normalised similarity, not the raw distance
    assert result.found and result.evidence_blocks[0].source == "replication-lag.md"


def test_retriever_is_a_llamaindex_retriever(sample_settings, embed_model, sample_lookup):
    retriever = L1Retriever(sample_lookup.path, sample_settings, embed_model, category_filter="redis")
    nodes = retriever.retrieve("memory usage above maxmemory")
    assert nodes and all(stage_of(n).candidate.category == "redis" for n in nodes)
    assert all(0.0 <= n.score <= 1.0 for n in nodes)
    assert stage_of(nodes[0]).candidate.score_label.value == "cosine_similarity"
