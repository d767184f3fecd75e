"""The query model is checked when a lookup is built: its dimension against the collection's vector field, its id
against the one ingest recorded in the meta collection (kb_retrieval.indexing.model_check)."""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.embeddings import MockEmbedding

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.embeddings import BUNDLED_MODEL
from kb_retrieval.indexing.index_version import meta_collection_name
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.indexing.ingest_record import MODEL_KEY, read_ingest_record
from kb_retrieval.indexing.milvus import connect
from kb_retrieval.indexing.model_check import EmbeddingMismatchError, model_id
from tests.conftest import SAMPLE_KB


class OtherModel(BaseEmbedding):
    """A 384-d model that is not the one the collection was embedded with (constant vectors: never searched)."""

    def _get_query_embedding(self, query: str) -> list[float]:
        return [1.0] + [0.0] * 383

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_query_embedding(text)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)


@pytest.fixture
def redis_kb(tmp_path, embed_model) -> KBSettings:
    settings = KBSettings(state_dir=tmp_path, vector_store_mode="sdk")
    ingest([SAMPLE_KB / "redis"], settings, embed_model=embed_model)
    return settings


@pytest.mark.unit
def test_model_ids() -> None:
    assert model_id(MockEmbedding(embed_dim=8)) == ""  # names no model
    assert model_id(OtherModel(model_name="org/other-384")) == "org/other-384"
    assert model_id(OtherModel(model_name=BUNDLED_MODEL)) == BUNDLED_MODEL


def test_the_bundled_models_id(embed_model: Any) -> None:
    assert model_id(embed_model) == BUNDLED_MODEL  # HuggingFaceEmbedding of the bundled folder


def test_ingest_records_the_model_the_roots_and_the_metadata_keys(redis_kb):
    record = read_ingest_record(connect(redis_kb), redis_kb)
    assert record.embed_model == BUNDLED_MODEL
    assert record.roots == (str((SAMPLE_KB / "redis").resolve()),)
    assert {"title", "kb", "severity", "position"} <= record.metadata_keys  # severity: a frontmatter key


def test_a_wrong_dimension_is_refused_at_construction(redis_kb):
    with pytest.raises(EmbeddingMismatchError) as raised:
        KnowledgeLookup(redis_kb, embed_model=MockEmbedding(embed_dim=128))
    message = str(raised.value)
    assert "128-d" in message and "384-d" in message and "kb_chunks" in message and "\n" not in message


def test_a_wrong_model_is_refused_at_construction(redis_kb):
    with pytest.raises(EmbeddingMismatchError) as raised:
        KnowledgeLookup(redis_kb, embed_model=OtherModel(model_name="org/other-384"))
    message = str(raised.value)
    assert BUNDLED_MODEL in message and "org/other-384" in message and "\n" not in message


def test_the_models_that_fit_are_accepted_and_used_as_given(redis_kb, embed_model):
    given = KnowledgeLookup(redis_kb, embed_model=embed_model)
    assert given.query_embed_model is embed_model and "embedding_check" not in given.features_off
    given.close()
    onnx = KnowledgeLookup(redis_kb)  # the ONNX export of the bundled model is that model
    assert type(onnx.query_embed_model).__name__ == "OnnxQueryEmbedding" and "embedding_check" not in onnx.features_off
    assert onnx.lookup("RedisMemoryHigh").found
    onnx.close()


def test_a_collection_without_a_recorded_model_is_accepted_with_a_note(redis_kb):
    client = connect(redis_kb)
    client.delete(meta_collection_name(redis_kb), ids=[MODEL_KEY])  # as an ingest before the record
    lookup = KnowledgeLookup(redis_kb, embed_model=OtherModel(model_name="org/other-384"))
    try:
        assert "no recorded model" in lookup.features_off["embedding_check"]
        notes = lookup.lookup("RedisMemoryHigh").query_transform.notes
        assert any("no recorded model" in n for n in notes)
    finally:
        lookup.close()
