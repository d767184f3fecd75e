"""Fast encoders: the bundled embedding model exported to ONNX (fp32 or int8) and run with onnxruntime.

Size: over 400 lines, one file format: the ONNX export with its checks, and the encoders that read it; the
export is the part to move out if it grows.

A lookup's query embedding through torch (sentence-transformers) costs several times what the same model costs as an
ONNX graph, int8 most of all. The export happens once, on first use, into the model cache folder
(``KB_MODEL_CACHE_DIR``) and is verified against the torch model before it is used. Passages are embedded at ingest
by the fp32 export (:func:`passage_encoder`), which matches the model to within float rounding (cosine >= 0.9999):
the vectors a collection holds are the model's, whichever ran. The int8 one (cosine ~0.99) embeds queries only.

Example:
    >>> from kb_retrieval.config import KBSettings
    >>> encoder = query_encoder(KBSettings(), embed_model=None)  # doctest: +SKIP
    >>> len(encoder.get_query_embedding("disk full on node-3"))  # doctest: +SKIP
    384
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from pydantic import Field, PrivateAttr

from kb_retrieval.atomic import atomic_path, atomic_write
from kb_retrieval.indexing.embeddings import (
    BUNDLED_MODEL,
    bundled_model_path,
    load_embed_model,
    max_seq_length,
    normalise,
    quiet_model_loading,
)

if TYPE_CHECKING:
    from kb_retrieval.config import KBSettings

logger = logging.getLogger(__name__)
#: Said before the one-time export, so the first lookup's wait (export, quantisation, check) is explained.
EXPORT_NOTICE = (
    "exporting the query encoder to ONNX (%s) into %s: once per model and cache folder; later lookups reuse it"
)

# Part of every cached file name: bump it when the exported graph changes, so no stale export is reused.
# 2: attention, GELU and layer norms fused by onnxruntime's transformer optimizer, attention quantised too.
EXPORT_VERSION = 2
FP32_MIN_COSINE = 0.9999
INT8_MIN_COSINE = 0.98
# Two intra-op threads, spinning only while a query runs (see _session). Alert texts (~56 tokens) on this 2-core
# machine, in a lookup: 5.4-6.4 ms nearly idle (never spinning 6.4-6.5, one thread 7.2-7.3); with other processes
# loading the cores a pool left spinning between calls took 13-23 ms where one thread took 7-11.
DEFAULT_THREADS = min(2, os.cpu_count() or 1)
_INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
_PRECISION_KEY = "kb_retrieval.precision"
# Fixed probes for the export check: short, typical, punctuation/unicode, and one past the 256-token truncation.
_PROBE_TEXTS = (
    "disk full",
    "How do I fix KubePodCrashLooping on a node with high memory pressure?",
    "Redis used_memory > maxmemory; eviction policy = noeviction (Größe: 5 GiB) ✓",
    "Reloading an Alertmanager configuration has failed. " * 40,
)


class OnnxExportError(RuntimeError):
    """The ONNX export could not be written or does not reproduce the torch model."""


def export_onnx(
    model_dir: str | Path, out_path: str | Path, *, quantized: bool, min_cosine: float | None = None
) -> Path:
    """Export the sentence embedding (mean pooling + L2 norm inside the graph) to ``out_path``, verified.

    The graph's attention, GELU and layer norms are fused into onnxruntime's own operators (its transformer
    optimizer; 320 operators a query become 64): a query of 30 word pieces spends more in the small shape operators
    of an unfused attention than in its matrix products. ``quantized`` then applies dynamic int8 quantisation to the
    MatMul and fused attention weights (per channel): quantising the embeddings or using reduce_range/QUInt8 was
    measured to lose far more accuracy. The result is checked against the torch model on fixed probe texts (cosine
    >= ``min_cosine``, by default 0.9999 for fp32, 0.98 for int8), and only then moved to ``out_path`` atomically, so
    a crash or failed check never leaves a file under that name.
    """
    import onnx

    out = Path(out_path)
    precision = "int8" if quantized else "fp32"
    min_cos = min_cosine if min_cosine is not None else (INT8_MIN_COSINE if quantized else FP32_MIN_COSINE)
    with contextlib.ExitStack() as writing:
        try:
            # 0644, not the owner's only: a shared cache folder's other users read the export too.
            temp = writing.enter_context(atomic_path(out, mode=0o644))
        except OSError as exc:
            raise OnnxExportError(
                f"cannot write the ONNX export into {out.parent} ({exc}); set KB_MODEL_CACHE_DIR"
            ) from exc
        reference = _export_fp32(Path(model_dir), temp)
        with _quiet_quantizer():
            _fuse(temp, Path(model_dir))
        model = onnx.load(str(temp))
        if not any(node.op_type == "Attention" for node in model.graph.node):
            # onnxruntime 1.20.0's optimizer leaves this export's attention unfused (measured; 1.32.0 fuses all six
            # layers): the file is sound, each query slower. Said, not hidden.
            logger.warning("the ONNX export's attention is not fused (%s): queries run slower", _versions())
        # The precision travels inside the file, so the encoder knows how to run it without trusting its name.
        onnx.helper.set_model_props(model, {_PRECISION_KEY: precision, "kb_retrieval.export": str(EXPORT_VERSION)})
        if quantized:
            with _quiet_quantizer():
                from onnxruntime.quantization import QuantType, quantize_dynamic

                quantize_dynamic(
                    model,
                    temp,
                    op_types_to_quantize=["MatMul", "Attention"],
                    per_channel=True,
                    weight_type=QuantType.QInt8,
                    # The fused operators are onnxruntime's own, outside ONNX shape inference: their outputs are fp32.
                    extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
                )
        else:
            onnx.save(model, str(temp))
        worst, probe = _worst_cosine(temp, Path(model_dir), reference)
        if worst < min_cos:
            raise OnnxExportError(
                f"ONNX {precision} export {out} does not reproduce the torch model: cosine {worst:.6f} < {min_cos} "
                f"on probe {probe[:60]!r}; the file was not written"
            )
    return out


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """Drop the quantiser's root-logger chatter (one line per layer, and advice that does not apply here), and undo
    the ``logging.basicConfig`` some onnxruntime modules run on import: the host application's logging is its own."""

    def keep(record: logging.LogRecord) -> bool:
        return "onnxruntime" not in record.pathname

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)
        root.handlers[:] = handlers
        root.setLevel(level)


def _fuse(path: Path, model_dir: Path) -> None:
    """Rewrite the graph at ``path`` with onnxruntime's fused transformer operators (Attention, BiasGelu,
    SkipLayerNormalization, EmbedLayerNormalization) in place. Same arithmetic: the export check still compares the
    result with the torch model. (Written back, not handed on in memory: the file it saves declares the operators'
    ``com.microsoft`` domain, which the quantiser's shape inference needs.)"""
    from onnxruntime.transformers import optimizer

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    fused = optimizer.optimize_model(
        str(path),
        model_type="bert",
        num_heads=int(config["num_attention_heads"]),
        hidden_size=int(config["hidden_size"]),
        opt_level=0,  # the fusions only; the session applies onnxruntime's general graph optimisations at load
    )
    fused.save_model_to_file(str(path))


def _export_fp32(model_dir: Path, out_path: Path) -> np.ndarray:
    """Write the fp32 graph and return the torch model's embeddings of the probe texts (the reference)."""
    import torch
    import transformers

    class _Pooled(torch.nn.Module):
        # Keyword arguments: BertModel's positional order changed in transformers 5.
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> torch.Tensor:
            hidden = self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    # eval() on the wrapper, not only the model: the exporter restores the wrapper's mode afterwards, and a
    # wrapper left in training mode would switch dropout on in the reference below.
    with quiet_model_loading():
        # The eager attention traces to the graph pattern the optimizer fuses (SDPA's does not).
        model = transformers.AutoModel.from_pretrained(
            str(model_dir), local_files_only=True, attn_implementation="eager"
        )
        wrapper = _Pooled(model).eval()
    tokenizer = _tokenizer(model_dir)
    # A padded batch as the example, so the traced graph takes the attention-mask path.
    example = {k: torch.from_numpy(v) for k, v in _encode(tokenizer, list(_PROBE_TEXTS[:2])).items()}
    axes = {name: {0: "batch", 1: "tokens"} for name in _INPUT_NAMES}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and legacy-exporter warnings, expected for this graph
        torch.onnx.export(
            wrapper,
            tuple(example[name] for name in _INPUT_NAMES),
            str(out_path),
            input_names=list(_INPUT_NAMES),
            output_names=["embedding"],
            dynamic_axes={**axes, "embedding": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
        references = [
            wrapper(**{k: torch.from_numpy(v) for k, v in _encode(tokenizer, [text]).items()})[0].numpy()
            for text in _PROBE_TEXTS
        ]
    return np.stack(references)


def _worst_cosine(path: Path, model_dir: Path, reference: np.ndarray) -> tuple[float, str]:
    """Lowest cosine between the ONNX file's probe embeddings (one by one and as a padded batch) and the reference."""
    encoder = OnnxQueryEmbedding(path, model_dir=model_dir, threads=DEFAULT_THREADS)
    single = np.array([encoder.get_query_embedding(text) for text in _PROBE_TEXTS])
    batch = np.array(encoder.get_text_embedding_batch(list(_PROBE_TEXTS)))
    cosines = np.minimum((single * reference).sum(1), (batch * reference).sum(1))
    worst = int(np.argmin(cosines))
    return float(cosines[worst]), _PROBE_TEXTS[worst]


def onnx_model_file(cache_dir: str | Path, *, quantized: bool, model_dir: str | Path | None = None) -> Path:
    """The cached ONNX export of the model (the bundled one by default), exported on first use.

    The file name carries the precision, ``EXPORT_VERSION`` and the model weights' hash, so a different model or
    exporter never reuses a stale file; a cached file that onnxruntime cannot load is exported again, once.
    """
    return _open_model(Path(cache_dir), Path(model_dir or bundled_model_path()), quantized, DEFAULT_THREADS)[0]


def _open_model(cache_dir: Path, model_dir: Path, quantized: bool, threads: int) -> tuple[Path, Any]:
    """The cached file and an onnxruntime session on it (loading the session is the check that the file is sound)."""
    path = cache_dir / _file_name(model_dir, quantized, cache_dir)
    if path.is_file():
        try:
            return path, _session(path, threads)
        except Exception as exc:  # onnxruntime raises its own exception types for a corrupt file
            logger.warning("cached ONNX model %s does not load (%s); exporting it again", path, exc)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OnnxExportError(
            f"model cache folder {cache_dir} cannot be created ({exc}); set KB_MODEL_CACHE_DIR to a writable folder"
        ) from exc
    if not os.access(cache_dir, os.W_OK):
        raise OnnxExportError(f"model cache folder {cache_dir} is not writable; set KB_MODEL_CACHE_DIR")
    logger.warning(EXPORT_NOTICE, "int8" if quantized else "fp32", cache_dir)
    export_onnx(model_dir, path, quantized=quantized)
    return path, _session(path, threads)


def _file_name(model_dir: Path, quantized: bool, cache_dir: Path | None = None) -> str:
    weights = model_dir / "model.safetensors"
    digest = _weights_digest(weights, cache_dir)
    return f"query-encoder-{'int8' if quantized else 'fp32'}-e{EXPORT_VERSION}-{digest[:16]}.onnx"


def _weights_digest(weights: Path, cache_dir: Path | None) -> str:
    """The weights' SHA-256, remembered in ``cache_dir`` under their path, size and mtime: hashing the bundled
    model's 90 MB took ~0.15 s of every process that opened an encoder (a CLI lookup, an ingest). A file replaced in
    place gets another size or mtime, so another note; a note that cannot be read or written is only a cache."""
    stat = weights.stat()
    resolved = str(weights.resolve())
    if cache_dir is None:
        return _sha256(resolved, stat.st_size, stat.st_mtime_ns)
    key = hashlib.sha256(f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    note = cache_dir / f"weights-{key}.sha256"
    with contextlib.suppress(OSError, UnicodeDecodeError):
        digest = note.read_text(encoding="ascii").strip()
        if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
            return digest
    digest = _sha256(resolved, stat.st_size, stat.st_mtime_ns)
    with contextlib.suppress(OSError):
        cache_dir.mkdir(parents=True, exist_ok=True)
        # 0644 as the exports: a shared cache folder's other users read it too.
        with atomic_write(note, encoding="ascii", file_mode=0o644) as handle:
            handle.write(digest)
    return digest


@lru_cache(maxsize=8)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """Hash of the weights; size and mtime are part of the cache key, so a replaced file is hashed again."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # The pool's threads spin between the operators of one query (waking a sleeping thread per operator costs ~1 ms
    # a query) but stop when the query is done: a thread spinning between queries takes a core from the rest of the
    # lookup (Milvus, the trace writer) and from other processes.
    options.add_session_config_entry("session.force_spinning_stop", "1")
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def _tokenizer(model_dir: Path) -> Any:
    """The model's fast tokenizer, truncating like sentence-transformers and padding a batch to its longest text."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    # tokenizer.json ships with truncation and fixed padding at 128; the model is used at max_seq_length (256).
    tokenizer.enable_truncation(max_length=max_seq_length(model_dir))
    tokenizer.enable_padding(pad_id=0, pad_type_id=0, pad_token="[PAD]")
    return tokenizer


def _encode(tokenizer: Any, texts: list[str]) -> dict[str, np.ndarray]:
    encodings = [tokenizer.encode(texts[0])] if len(texts) == 1 else tokenizer.encode_batch(texts)
    ids = np.array([e.ids for e in encodings], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


class OnnxQueryEmbedding(BaseEmbedding):
    """The ONNX export of a sentence-transformers model (mean pooling, normalised) as a LlamaIndex embedding: of
    queries, and (the fp32 export) of passages at ingest.

    Texts of a batch run as one padded batch, except with the int8 export: its dynamic quantisation scales each
    run's activations by their range over the whole batch, so a text's vector would depend on its neighbours
    (cosine ~0.97 to its own single-text vector); there each text runs alone. Thread-safe without a lock:
    onnxruntime's ``run`` and the tokenizer's ``encode_batch`` may be called concurrently.
    """

    model_file: str = Field(description="The ONNX file that is run.")
    thread_safe: ClassVar[bool] = True  # onnxruntime sessions run concurrently; embed_query takes no lock
    threads: int = Field(default=DEFAULT_THREADS, gt=0, description="onnxruntime intra-op threads per call.")
    _session: Any = PrivateAttr()
    _tokenizer: Any = PrivateAttr()
    _inputs: tuple[str, ...] = PrivateAttr()
    _batched: bool = PrivateAttr()

    def __init__(
        self,
        model_file: str | Path,
        *,
        model_dir: str | Path | None = None,
        threads: int = DEFAULT_THREADS,
        session: Any = None,
        **kwargs: Any,
    ) -> None:
        """``model_dir`` holds the tokenizer (the bundled model by default); ``session`` reuses a loaded one."""
        folder = Path(model_dir or bundled_model_path())
        session = session if session is not None else _session(Path(model_file), threads)
        precision = session.get_modelmeta().custom_metadata_map.get(_PRECISION_KEY, "")
        label = BUNDLED_MODEL if _same_dir(folder, bundled_model_path()) else str(folder)
        kwargs.setdefault("model_name", " ".join(filter(None, ("ONNX", precision, "export of", label))))
        kwargs.update(model_file=str(model_file), threads=threads)
        super().__init__(**kwargs)
        self._session = session
        self._tokenizer = _tokenizer(folder)
        self._inputs = tuple(i.name for i in session.get_inputs())
        self._batched = precision != "int8"

    @classmethod
    def class_name(cls) -> str:
        return "OnnxQueryEmbedding"

    def _embed(self, texts: Sequence[str]) -> list[list[float]]:
        feed = _encode(self._tokenizer, list(texts))  # padded to the longest; each run slices off what it needs
        if len(texts) == 1:  # a query: nothing to pad, sort or slice
            (out,) = self._session.run(["embedding"], {name: feed[name] for name in self._inputs})
            return [normalise(out)[0].tolist()]
        lengths = feed["attention_mask"].sum(axis=1)
        # Texts of similar length run together, so a short text is not padded to a long neighbour's length.
        order = np.argsort(lengths, kind="stable")
        size = self.embed_batch_size if self._batched else 1
        vectors: list[list[float]] = [[] for _ in texts]
        for start in range(0, len(texts), size):
            rows = order[start : start + size]
            width = int(lengths[rows].max())
            (out,) = self._session.run(["embedding"], {name: feed[name][rows, :width] for name in self._inputs})
            for row, vector in zip(rows, normalise(out).tolist(), strict=True):
                vectors[row] = vector
        return vectors

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """The word pieces of each text as the model reads it (cut at its maximum length): what a batch pads to."""
        return [sum(e.attention_mask) for e in self._tokenizer.encode_batch(list(texts))]

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._embed([query])[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._embed([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self._embed(texts) if texts else []

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return self._get_query_embedding(query)

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return self._get_text_embedding(text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self._get_text_embeddings(texts)


def query_encoder(settings: KBSettings, embed_model: BaseEmbedding | None = None) -> BaseEmbedding:
    """What a lookup embeds queries with: a model given is used as it is (a user's ``HuggingFaceEmbedding`` of the
    bundled folder included); without one, the ONNX export of the bundled model when configured, else the model.

    If the ONNX encoder cannot be built, a warning says why and the embedding model is used, so the lookup still
    works (only slower).
    """
    if embed_model is not None:
        return embed_model
    if settings.embedding.query_encoder != "model" and settings.embedding.embed_model == BUNDLED_MODEL:
        try:
            return _shared_encoder(
                str(settings.resolved_model_cache_dir().absolute()),
                settings.embedding.query_encoder == "onnx-int8",
                DEFAULT_THREADS,
            )
        except Exception as exc:
            # The export and the session depend on the torch / onnx / onnxruntime releases installed: say which.
            logger.warning(
                "ONNX query encoder unavailable, embedding queries with the model itself: %s (%s)", exc, _versions()
            )
    return load_embed_model(settings.embedding.embed_model, settings.embedding.embed_batch_size)


def passage_encoder(settings: KBSettings, embed_model: BaseEmbedding | None = None) -> BaseEmbedding:
    """What ingest embeds passages with: a model given is used as it is; without one, the fp32 ONNX export of the
    bundled model on ``embed_threads`` threads (``passage_encoder="onnx"``, the default), else the model itself.

    Both run batches of ``embed_batch_size`` texts. If the ONNX encoder cannot be built, a warning says why and the
    model is used: the same vectors, only slower.
    """
    if embed_model is not None:
        return embed_model
    if settings.embedding.passage_encoder == "onnx" and settings.embedding.embed_model == BUNDLED_MODEL:
        try:
            return _shared_passage_encoder(
                str(settings.resolved_model_cache_dir().absolute()),
                settings.embedding.embed_threads or os.cpu_count() or 1,
                settings.embedding.embed_batch_size,
            )
        except Exception as exc:
            logger.warning("ONNX passage encoder unavailable, embedding passages with the model itself: %s", exc)
    return load_embed_model(settings.embedding.embed_model, settings.embedding.embed_batch_size)


@lru_cache(maxsize=4)
def _shared_passage_encoder(cache_dir: str, threads: int, batch_size: int) -> OnnxQueryEmbedding:
    """One fp32 passage encoder per cached file, thread count and batch size in the process."""
    model_dir = Path(bundled_model_path())
    path, session = _open_model(Path(cache_dir), model_dir, False, threads)
    return OnnxQueryEmbedding(path, model_dir=model_dir, threads=threads, session=session, embed_batch_size=batch_size)


def _versions() -> str:
    """The installed releases the ONNX export depends on, e.g. ``torch 2.13.0, onnx 1.23.2, onnxruntime 1.32.0``."""
    from importlib import metadata

    found = []
    for name in ("torch", "onnx", "onnxruntime"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    return ", ".join(found)


def _shared_encoder(cache_dir: str, quantized: bool, threads: int) -> OnnxQueryEmbedding:
    """One encoder per cached file and thread count in the process (the file follows from folder and precision);
    a caller that asks while another thread loads it waits for that load instead of starting a second one."""
    with _loading:
        return _load_shared_encoder(cache_dir, quantized, threads)


_loading = threading.Lock()


@lru_cache(maxsize=8)
def _load_shared_encoder(cache_dir: str, quantized: bool, threads: int) -> OnnxQueryEmbedding:
    model_dir = Path(bundled_model_path())
    path, session = _open_model(Path(cache_dir), model_dir, quantized, threads)
    return OnnxQueryEmbedding(path, model_dir=model_dir, threads=threads, session=session)


def _same_dir(a: str | Path, b: str | Path) -> bool:
    return bool(a) and os.path.realpath(a) == os.path.realpath(b)
