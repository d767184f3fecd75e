"""The ONNX query encoder against the real torch model, and its cache of exported files."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from llama_index.core.embeddings import MockEmbedding
from pydantic import ValidationError

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing import onnx_query
from kb_retrieval.indexing.embeddings import BUNDLED_MODEL, bundled_model_path
from kb_retrieval.indexing.onnx_query import (
    EXPORT_VERSION,
    OnnxExportError,
    OnnxQueryEmbedding,
    export_onnx,
    onnx_model_file,
    query_encoder,
)

# ~180 tokens on one topic, then ~420 on another: a model that kept more (or fewer) than 256 tokens would drift.
LONG = (
    "Symptom: the kubelet reports DiskPressure and evicts pods; the image filesystem is above the hard threshold. "
    * 9
    + "Appendix: PostgreSQL streaming replication fell behind because WAL segments were recycled before the "
    "standby fetched them; raise wal_keep_size and check the replication slot. " * 12
)
TEXTS = [
    "x",
    "OOM",
    "disk full",
    "redis latency",
    "KubePodCrashLooping",
    "How do I fix KubePodCrashLooping on a node with high memory pressure?",
    "Reloading an Alertmanager configuration has failed. Configuration has failed to load for {{ $labels.pod }}.",
    "mysql replication lag Seconds_Behind_Source keeps growing after failover",
    "Why is etcd reporting 'database space exceeded' and how do I defragment it safely?",
    "p99 latency of the checkout API doubled after the 14:05 deploy; rollback?",
    "TLS certificate for ingress expires in 3 days",
    "Größe des Heaps überschritten — JVM GC pauses > 2 s ✓",
    "磁盘空间不足",
    "kafka consumer group lag, partition 7, broker-2 under-replicated",
    "   leading and trailing whitespace   ",
    "ERROR: connection refused (ECONNREFUSED) 10.0.3.17:5432",
    "node_filesystem_avail_bytes{mountpoint='/var/lib/docker'} / node_filesystem_size_bytes < 0.05",
    "What should on-call do first when PagerDuty fires PrometheusTargetMissing for a whole job?",
    LONG,
    LONG[:900] + " Mitigation: prune unused images and raise the eviction threshold.",
]


def cosines(a: np.ndarray | list, b: np.ndarray | list) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="module")
def fp32_file(cache_dir: Path) -> Path:
    return onnx_model_file(cache_dir, quantized=False)


@pytest.fixture(scope="module")
def int8_file(cache_dir: Path) -> Path:
    return onnx_model_file(cache_dir, quantized=True)


@pytest.fixture(scope="module")
def fp32(fp32_file: Path) -> OnnxQueryEmbedding:
    return OnnxQueryEmbedding(fp32_file, embed_batch_size=8)


@pytest.fixture(scope="module")
def int8(int8_file: Path) -> OnnxQueryEmbedding:
    return OnnxQueryEmbedding(int8_file, embed_batch_size=8)


@pytest.fixture(scope="module")
def torch_vectors(embed_model) -> np.ndarray:
    return np.array([embed_model.get_query_embedding(text) for text in TEXTS])


def test_texts_include_one_past_the_truncation(fp32: OnnxQueryEmbedding) -> None:
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(Path(bundled_model_path()) / "tokenizer.json"))
    raw.no_truncation()
    raw.no_padding()
    lengths = [len(raw.encode(text).ids) for text in TEXTS]
    assert max(lengths) > 300 and min(lengths) <= 3
    # Tokens past 256 are cut, as in sentence-transformers: appending to the long text changes nothing.
    assert cosines(fp32.get_query_embedding(LONG), fp32.get_query_embedding(LONG + " kernel panic")) > 0.999999


def test_fp32_matches_torch(fp32: OnnxQueryEmbedding, torch_vectors: np.ndarray) -> None:
    vectors = np.array([fp32.get_query_embedding(text) for text in TEXTS])
    assert vectors.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert cosines(vectors, torch_vectors).min() >= 0.9999


def test_int8_close_to_torch(int8: OnnxQueryEmbedding, torch_vectors: np.ndarray) -> None:
    vectors = np.array([int8.get_query_embedding(text) for text in TEXTS])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    found = cosines(vectors, torch_vectors)
    assert found.min() >= 0.98
    assert found.mean() >= 0.99
    assert found.min() < 0.99999  # it really is the quantised graph, not the fp32 one


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_padded_batch_equals_single_queries(precision: str, request: pytest.FixtureRequest) -> None:
    encoder: OnnxQueryEmbedding = request.getfixturevalue(precision)
    # fp32: runs of 8 texts sorted by length, each padded to its longest; a wrong mask or order shows here.
    batch = encoder.get_text_embedding_batch(TEXTS)
    single = [encoder.get_query_embedding(text) for text in TEXTS]
    assert cosines(batch, single).min() > 0.99999
    if precision == "int8":  # each text runs alone, so its vector never depends on its neighbours
        assert batch == single
    assert encoder.get_text_embedding(TEXTS[3]) == encoder.get_query_embedding(TEXTS[3])


def test_async_and_threads_agree_with_sync(int8: OnnxQueryEmbedding) -> None:
    expected = [int8.get_query_embedding(text) for text in TEXTS]
    assert asyncio.run(int8.aget_query_embedding(TEXTS[5])) == expected[5]
    assert asyncio.run(int8.aget_text_embedding_batch(TEXTS[:4])) == expected[:4]
    with ThreadPoolExecutor(max_workers=4) as pool:
        concurrent = list(pool.map(int8.get_query_embedding, TEXTS * 3))
    assert concurrent == expected * 3


def test_file_name_carries_precision_version_and_model_hash(fp32_file: Path, int8_file: Path) -> None:
    digest = hashlib.sha256((Path(bundled_model_path()) / "model.safetensors").read_bytes()).hexdigest()[:16]
    for path, precision in ((fp32_file, "fp32"), (int8_file, "int8")):
        assert precision in path.name and f"e{EXPORT_VERSION}" in path.name and digest in path.name
    assert int8_file.stat().st_size < fp32_file.stat().st_size


def test_exports_run_fused_transformer_operators(fp32_file: Path, int8_file: Path) -> None:
    """The attention of each of the six layers is one fused operator (quantised in the int8 file), not the ~40
    shape and arithmetic operators an unfused export traces to (685 operators in the unfused fp32 file): what makes
    a short query fast."""
    from importlib import metadata

    import onnx
    from packaging.version import Version

    if Version(metadata.version("onnxruntime")) < Version("1.32"):  # older optimizers: said, not assumed (issue 38)
        ops = [node.op_type for node in onnx.load(str(fp32_file)).graph.node]
        assert ops.count("Attention") in (0, 6)
        pytest.skip("attention fused with onnxruntime 1.32 (tested); older releases warn when they do not fuse it")
    for path, attention in ((fp32_file, "Attention"), (int8_file, "QAttention")):
        ops = [node.op_type for node in onnx.load(str(path)).graph.node]
        assert ops.count(attention) == 6, (path.name, sorted(set(ops)))
        assert ops.count("SkipLayerNormalization") == 12 and len(ops) < 200, (path.name, len(ops))


def test_cached_file_is_reused(cache_dir: Path, int8_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = int8_file.stat()

    def no_export(*args: object, **kwargs: object) -> Path:
        raise AssertionError("exported again although the cached file is sound")

    monkeypatch.setattr(onnx_query, "export_onnx", no_export)
    again = onnx_model_file(cache_dir, quantized=True)
    after = again.stat()
    assert again == int8_file and (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # No temp files left beside: the exports and the note of the weights' digest only.
    assert {p.suffix for p in cache_dir.iterdir()} == {".onnx", ".sha256"}
    assert not [p.name for p in cache_dir.iterdir() if p.name.startswith(".")]


def test_corrupt_cache_file_is_exported_again(
    tmp_path: Path,
    fp32_file: Path,
    fp32: OnnxQueryEmbedding,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    corrupt = tmp_path / fp32_file.name
    corrupt.write_bytes(b"not an onnx model")
    exports: list[tuple[Path, bool]] = []

    def copying_export(model_dir: Path, out_path: Path, *, quantized: bool) -> Path:
        # Stands in for a real export (covered by the fixtures) to keep this test fast.
        exports.append((Path(out_path), quantized))
        shutil.copyfile(fp32_file, out_path)
        return Path(out_path)

    monkeypatch.setattr(onnx_query, "export_onnx", copying_export)
    with caplog.at_level(logging.WARNING, logger=onnx_query.__name__):
        path = onnx_model_file(tmp_path, quantized=False)
    assert path == corrupt and exports == [(corrupt, False)]
    assert "does not load" in caplog.text
    assert OnnxQueryEmbedding(path).get_query_embedding(TEXTS[6]) == fp32.get_query_embedding(TEXTS[6])
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".onnx", ".sha256"]  # the export and the digest note


def test_a_graph_that_does_not_reproduce_the_model_is_not_written(
    tmp_path: Path, fp32_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def wrong_export(model_dir: Path, out_path: Path) -> np.ndarray:
        # A small fake to skip the slow torch export: a valid graph, checked against vectors it cannot reproduce.
        shutil.copyfile(fp32_file, out_path)
        return np.eye(4, 384, k=7)

    monkeypatch.setattr(onnx_query, "_export_fp32", wrong_export)
    out = tmp_path / "model.onnx"
    with pytest.raises(OnnxExportError, match="does not reproduce") as raised:
        export_onnx(bundled_model_path(), out, quantized=False)
    assert str(out) in str(raised.value)
    assert list(tmp_path.iterdir()) == []  # neither the final name nor a temp file


def test_unwritable_cache_dir_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(OnnxExportError, match="KB_MODEL_CACHE_DIR") as raised:
        onnx_model_file(blocker / "cache", quantized=True)
    assert str(blocker / "cache") in str(raised.value)


def test_query_encoder_uses_the_onnx_export_of_the_bundled_model(cache_dir: Path, int8_file: Path, embed_model) -> None:
    settings = KBSettings(model_cache_dir=cache_dir)
    encoder = query_encoder(settings, None)
    assert isinstance(encoder, OnnxQueryEmbedding) and Path(encoder.model_file) == int8_file
    assert "int8" in encoder.model_name and BUNDLED_MODEL in encoder.model_name
    assert query_encoder(settings, None) is encoder  # one encoder per file in the process
    fp32 = query_encoder(KBSettings(model_cache_dir=cache_dir, query_encoder="onnx"), None)
    assert isinstance(fp32, OnnxQueryEmbedding) and "fp32" in fp32.model_name
    # A model the caller gives is used as given, the bundled one's HuggingFaceEmbedding included (issue 24).
    assert query_encoder(settings, embed_model) is embed_model


def test_query_encoder_keeps_the_model_when_asked_or_not_bundled(cache_dir: Path, embed_model) -> None:
    assert query_encoder(KBSettings(model_cache_dir=cache_dir, query_encoder="model"), embed_model) is embed_model
    own = MockEmbedding(embed_dim=384)
    assert query_encoder(KBSettings(model_cache_dir=cache_dir), own) is own
    other = KBSettings(model_cache_dir=cache_dir, embed_model=str(cache_dir))
    assert query_encoder(other, embed_model) is embed_model


def test_query_encoder_falls_back_when_the_export_fails(
    tmp_path: Path, embed_model, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_export(*args: object, **kwargs: object) -> Path:
        raise RuntimeError("exporter exploded")

    monkeypatch.setattr(onnx_query, "export_onnx", broken_export)
    with caplog.at_level(logging.WARNING, logger=onnx_query.__name__):
        fallback = query_encoder(KBSettings(model_cache_dir=tmp_path / "empty"), None)  # the bundled model itself
    assert type(fallback).__name__ == "HuggingFaceEmbedding" and fallback.model_name == embed_model.model_name
    assert "exporter exploded" in caplog.text
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=onnx_query.__name__):
        fallback = query_encoder(KBSettings(model_cache_dir=blocker / "cache"), None)
    assert type(fallback).__name__ == "HuggingFaceEmbedding" and str(blocker / "cache") in caplog.text


def test_model_cache_dir_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KB_MODEL_CACHE_DIR", raising=False)
    monkeypatch.delenv("KB_QUERY_ENCODER", raising=False)
    assert KBSettings().embedding.query_encoder == "onnx-int8"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert KBSettings().resolved_model_cache_dir() == tmp_path / "kb-retrieval"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert KBSettings().resolved_model_cache_dir() == Path.home() / ".cache" / "kb-retrieval"
    monkeypatch.setenv("KB_MODEL_CACHE_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("KB_QUERY_ENCODER", "onnx")
    settings = KBSettings()
    assert settings.resolved_model_cache_dir() == tmp_path / "models" and settings.embedding.query_encoder == "onnx"
    assert KBSettings(query_encoder="model").embedding.query_encoder == "model"
    with pytest.raises(ValidationError):
        KBSettings(query_encoder="torch")


def test_an_export_that_fails_falls_back_to_the_model_and_names_the_versions(tmp_path: Path, caplog) -> None:
    """The export depends on the torch / onnx / onnxruntime releases installed (issue 38): when it cannot be built the
    lookup still embeds its queries (with the model itself), and the warning says which releases were there."""
    from importlib import metadata

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="kb_retrieval.indexing.onnx_query"):
        encoder = query_encoder(KBSettings(model_cache_dir=blocker / "cache", embed_batch_size=8), None)
    assert not isinstance(encoder, OnnxQueryEmbedding) and len(encoder.get_query_embedding("disk full")) == 384
    (warning,) = [r.getMessage() for r in caplog.records if "ONNX query encoder unavailable" in r.getMessage()]
    for name in ("torch", "onnx", "onnxruntime"):
        assert f"{name} {metadata.version(name)}" in warning


def test_the_weights_digest_is_remembered_by_path_size_and_mtime(tmp_path: Path) -> None:
    """The export's file name names the weights' hash; a later process reads it from the cache folder instead of
    hashing 90 MB again, and weights changed in place (another mtime) are hashed anew."""
    from kb_retrieval.indexing.onnx_query import _file_name

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    weights = model_dir / "model.safetensors"
    weights.write_bytes(b"weights one")
    cache = tmp_path / "cache"
    first = _file_name(model_dir, False, cache)
    assert hashlib.sha256(b"weights one").hexdigest()[:16] in first
    (note,) = cache.glob("weights-*.sha256")
    note.write_text("0" * 64)  # what a later process reads: no hashing
    assert _file_name(model_dir, False, cache) == f"query-encoder-fp32-e{EXPORT_VERSION}-{'0' * 16}.onnx"
    weights.write_bytes(b"weights two")
    os.utime(weights, ns=(1, 1))
    assert hashlib.sha256(b"weights two").hexdigest()[:16] in _file_name(model_dir, False, cache)


def test_threads_asking_for_the_shared_encoder_at_once_load_it_once(
    fp32_file: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookup loads its query encoder on a thread of its own while Milvus opens: a second caller meanwhile waits
    for that load and gets the same encoder, never a second session."""
    opened: list[Path] = []
    real_open = onnx_query._open_model

    def counted(*args: object) -> tuple[Path, object]:
        opened.append(fp32_file)
        time.sleep(0.2)  # long enough for every thread to ask while the first one loads
        return real_open(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(onnx_query, "_open_model", counted)
    onnx_query._load_shared_encoder.cache_clear()  # an encoder an earlier test loaded would answer without a load
    settings = KBSettings(query_encoder="onnx", model_cache_dir=cache_dir)
    with ThreadPoolExecutor(max_workers=3) as pool:
        encoders = list(pool.map(lambda _: query_encoder(settings), range(3)))
    assert len(opened) == 1 and encoders[0] is encoders[1] is encoders[2]
