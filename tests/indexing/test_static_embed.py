"""The static model (WordLlama's l2_supercat table, from the installed package's files): what WordLlama computes."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from kb_retrieval.indexing import static_embed
from kb_retrieval.indexing.static_embed import (
    STATIC_DIM,
    StaticModelMissingError,
    load_static_embedder,
    static_model_files,
)

TEXTS = [
    "network interface transmit errors",
    "ip -s link shows the outgoing error count climbing on the main interface",
    "KubeQuotaAlmostFull: Cluster reaches to the allowed limits for given namespace.",
]


def test_vectors_are_wordllama_s_own():
    from wordllama.inference import WordLlamaInference

    weights, tokenizer = static_model_files()
    reference = WordLlamaInference(load_file(str(weights))["embedding.weight"], Tokenizer.from_file(str(tokenizer)))
    ours = load_static_embedder().embed(TEXTS)
    assert ours.shape == (3, STATIC_DIM) and ours.dtype == np.float32
    assert np.allclose(ours, reference.embed(TEXTS, norm=True), atol=1e-6)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_a_text_without_tokens_is_a_zero_row():
    out = load_static_embedder().embed(["", "disk full"])
    assert not out[0].any() and out[1].any()


def test_related_texts_are_closer_than_unrelated_ones():
    a, b, c = load_static_embedder().embed(
        ["kubelet client certificate expires soon", "the kubelet cert expires in two days", "redis memory is full"]
    )
    assert a @ b > a @ c + 0.2


def test_a_missing_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(static_embed.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(StaticModelMissingError, match=r"needs the package 'wordllama'.*not installed"):
        static_model_files()
