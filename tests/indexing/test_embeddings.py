"""Passages at ingest: batched by length and put back in order, embedded by the fp32 ONNX export (the model's
vectors), and a model given used as it is."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from pydantic import Field

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.doc_vectors import KINDS, VECTORS_FIELD, doc_vectors_collection_name, document_texts
from kb_retrieval.indexing.embeddings import BUNDLED_MODEL, embed_passages, embed_texts, word_piece_limit
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.indexing.milvus import connect, iter_rows
from kb_retrieval.indexing.model_check import model_id
from kb_retrieval.indexing.onnx_query import OnnxQueryEmbedding, passage_encoder
from kb_retrieval.knowledge.chunker import chunk_document
from kb_retrieval.knowledge.loader import load_knowledge_base
from tests.conftest import SAMPLE_KB


class Recording(BaseEmbedding):
    """A vector that depends on the text alone (the same text, the same vector), and every batch it was given."""

    dim: int = 8
    batches: list[list[str]] = Field(default_factory=list)

    def vector(self, text: str) -> list[float]:
        return np.random.default_rng(zlib.crc32(text.encode())).normal(size=self.dim).tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        self.batches.append(list(texts))
        return [self.vector(t) for t in texts]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._get_text_embeddings([text])[0]

    def _get_query_embedding(self, query: str) -> Embedding:
        return self.vector(query)

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return self.vector(query)


class Counted(Recording):
    """Says how many word pieces each text has (here: the reverse of its length), as the ONNX encoder does."""

    def token_counts(self, texts: list[str]) -> list[int]:
        return [1000 - len(t) for t in texts]


TEXTS = ["a" * n for n in (5, 1, 9, 3, 3, 12, 7, 1, 30, 2)] + ["bb", "ccc", "dddddd"]


@pytest.mark.unit
def test_sorted_batches_return_each_vector_in_input_order() -> None:
    model = Recording(embed_batch_size=100)
    in_order = embed_texts(model, TEXTS)  # one batch, as given
    model.batches.clear()
    sorted_ = embed_passages(model, TEXTS, 3)
    assert np.array_equal(sorted_, in_order)
    assert [len(b) for b in model.batches] == [3, 3, 3, 3, 1]
    seen = [len(t) for batch in model.batches for t in batch]
    assert seen == sorted(len(t) for t in TEXTS)  # every text once, shortest first
    assert embed_passages(model, [], 3).shape == (0, 0)


@pytest.mark.unit
def test_a_model_that_counts_its_word_pieces_is_sorted_by_them() -> None:
    model = Counted(embed_batch_size=100)
    vectors = embed_passages(model, TEXTS, 4)
    seen = [len(t) for batch in model.batches for t in batch]
    assert seen == sorted((len(t) for t in TEXTS), reverse=True)
    assert np.array_equal(vectors, embed_texts(Recording(), TEXTS))


@pytest.mark.unit
def test_progress_is_told_each_batch() -> None:
    told: list[int] = []
    embed_passages(Recording(), TEXTS, 5, told.append)
    assert told == [5, 5, 3]


@pytest.mark.unit
def test_a_given_model_is_used_as_given() -> None:
    given = Recording()
    assert passage_encoder(KBSettings(), given) is given
    assert passage_encoder(KBSettings(passage_encoder="model", embed_model="/nowhere/else"), given) is given


def test_ingest_embeds_with_the_model_given(tmp_path: Path) -> None:
    given = Recording(dim=384, embed_batch_size=1000)
    settings = KBSettings(state_dir=tmp_path / "state", embed_batch_size=16)
    summary = ingest([SAMPLE_KB], settings, embed_model=given)
    embedded = [t for batch in given.batches for t in batch]
    documents = load_knowledge_base(SAMPLE_KB).documents
    size, overlap = settings.chunking.chunk_tokens, settings.chunking.chunk_overlap
    limit = word_piece_limit(settings.embedding.embed_model)  # ingest caps chunks at the model's word pieces
    chunks = {c.embedding_text() for doc in documents for c in chunk_document(doc, size, overlap, limit)}
    titles = {document_texts(doc)[0] for doc in documents}
    assert summary.chunks_embedded == len(chunks) > 0
    assert chunks | titles <= set(embedded)
    assert max(len(b) for b in given.batches) == 16  # the setting's batch size, not the model's own


@pytest.fixture(scope="module")
def passages() -> list[str]:
    """Real texts ingest embeds: the sample KB's chunks, then its documents' titles and summaries."""
    documents = load_knowledge_base(SAMPLE_KB).documents
    chunks = [c.embedding_text() for doc in documents for c in chunk_document(doc, 220, 32)]
    return chunks + [text for doc in documents for text in document_texts(doc)]


@pytest.fixture(scope="module")
def encoder() -> BaseEmbedding:
    # The default model cache, as the CLI's ingest uses it (exported there once per machine).
    return passage_encoder(KBSettings(embed_batch_size=16))


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_the_passage_encoder_is_the_fp32_export_of_the_bundled_model(encoder: BaseEmbedding) -> None:
    assert isinstance(encoder, OnnxQueryEmbedding)
    assert "fp32" in encoder.model_name
    assert model_id(encoder) == BUNDLED_MODEL  # a collection it wrote is the bundled model's
    assert encoder.embed_batch_size == 16


def test_onnx_passages_are_the_torch_model_vectors(encoder: BaseEmbedding, embed_model, passages) -> None:
    onnx = embed_passages(encoder, passages, 16)
    torch = embed_texts(embed_model, passages)  # the torch path as ingest ran it before: document order, padded
    assert onnx.shape == torch.shape == (len(passages), 384)
    found = cosines(onnx, torch)
    assert found.min() >= 1 - 1e-4, f"worst cosine {found.min():.6f} on {passages[int(np.argmin(found))][:60]!r}"


def test_sorted_onnx_batches_equal_texts_run_alone(encoder: BaseEmbedding, passages) -> None:
    sample = passages[::7]
    alone = np.array([encoder.get_text_embedding(text) for text in sample])  # no padding at all
    np.testing.assert_allclose(embed_passages(encoder, sample, 16), alone, atol=2e-6)
    np.testing.assert_allclose(embed_texts(encoder, sample), alone, atol=2e-6)


def test_default_ingest_writes_the_torch_model_vectors(tmp_path: Path, sample_settings: KBSettings) -> None:
    """The CLI's path (no model given: the ONNX passage encoder) against the torch model's ingest of the same KB."""
    settings = KBSettings(state_dir=tmp_path / "state", vector_store_mode="sdk")
    ingest([SAMPLE_KB], settings)
    for collection, field, parts in (
        (settings.storage.collection, settings.schema_fields.vector_field, 1),
        (doc_vectors_collection_name(settings), VECTORS_FIELD, len(KINDS)),
    ):
        key = settings.schema_fields.id_field if parts == 1 else "source"
        found, expected = (
            {
                row[key]: np.asarray(row[field], dtype=np.float32)[: parts * 384].reshape(parts, 384)
                for row in iter_rows(connect(s), s, [key, field], collection=collection)
            }
            for s in (settings, sample_settings)
        )
        assert found.keys() == expected.keys() and found
        worst = min(cosines(found[k], expected[k]).min() for k in expected)
        assert worst >= 1 - 1e-4, f"{collection}: worst cosine {worst:.6f}"


@pytest.mark.unit
def test_a_query_skips_core_s_wrapper_only_when_nothing_would_hear_it() -> None:
    """``embed_query`` calls the model's own ``_get_query_embedding`` when core's ``get_query_embedding`` would only
    wrap it; with a span or event handler, a callback handler or an embeddings cache, core's method runs (and its
    span and events are sent). The vector is the same either way."""
    from llama_index.core.callbacks import CallbackManager, LlamaDebugHandler
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.instrumentation.events.embedding import EmbeddingStartEvent
    from llama_index.core.instrumentation.span_handlers import SimpleSpanHandler

    from kb_retrieval.indexing.embeddings import _query_embedder, embed_query

    class Heard(BaseEventHandler):
        events: list[str] = Field(default_factory=list)

        def handle(self, event: object, **kwargs: object) -> None:
            self.events.append(type(event).__name__)

    model = Recording()
    quiet = embed_query(model, "etcd has no leader")
    assert _query_embedder(model) == model._get_query_embedding
    root = get_dispatcher()
    heard, spans = Heard(), SimpleSpanHandler()
    root.add_event_handler(heard)
    root.add_span_handler(spans)
    try:
        assert _query_embedder(model) == model.get_query_embedding
        assert embed_query(model, "etcd has no leader") == quiet
    finally:
        root.event_handlers.remove(heard)
        root.span_handlers.remove(spans)
    assert heard.events.count(EmbeddingStartEvent.class_name()) == 1
    assert any("get_query_embedding" in span.id_ for span in spans.completed_spans)
    debug = LlamaDebugHandler()
    with_callbacks = Recording(callback_manager=CallbackManager([debug]))
    assert _query_embedder(with_callbacks) == with_callbacks.get_query_embedding
    assert embed_query(with_callbacks, "etcd has no leader") == quiet
    assert len(debug.get_event_pairs()) == 1
    assert _query_embedder(model) == model._get_query_embedding  # the handlers gone, quiet again


@pytest.mark.unit
def test_a_quiet_query_skips_the_span_on_the_model_s_own_method_too(monkeypatch) -> None:
    """Core's ``DispatcherSpanMixin`` puts a span on the model's own ``_get_query_embedding`` (an implementation of
    an abstract method): with no handler, ``embed_query`` draws no span id (a ``uuid4``) at all; a span handler
    where the model's module's spans go still gets the span, and the vector is the same."""
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.span_handlers import SimpleSpanHandler
    from llama_index_instrumentation import dispatcher as core_dispatcher

    from kb_retrieval.indexing.embeddings import embed_query

    model = Recording()
    assert hasattr(type(model)._get_query_embedding, "__wrapped__")  # the mixin's span is there to skip
    drawn: list[int] = []
    real_uuid4 = core_dispatcher.uuid.uuid4
    monkeypatch.setattr(core_dispatcher.uuid, "uuid4", lambda: (drawn.append(1), real_uuid4())[1])
    quiet = embed_query(model, "etcd has no leader")
    assert drawn == []
    own = get_dispatcher(Recording.__module__)
    spans = SimpleSpanHandler()
    own.add_span_handler(spans)
    try:
        assert embed_query(model, "etcd has no leader") == quiet
    finally:
        own.span_handlers.remove(spans)
    assert [s.id_.split("-")[0] for s in spans.completed_spans] == ["Recording._get_query_embedding"]
