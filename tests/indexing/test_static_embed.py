"""The static model (WordLlama's l2_supercat table, from the installed package's files): what WordLlama computes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from kb_retrieval.indexing import static_embed
from kb_retrieval.indexing.static_embed import (
    STATIC_DIM,
    StaticModelMissingError,
    TermWeights,
    load_static_embedder,
    static_model_files,
    unit_rows,
)
from kb_retrieval.knowledge.text import words

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


def test_weighted_embedding_sums_word_vectors_by_weight():
    model = load_static_embedder()
    weights = {"disk": 2.0, "full": 0.5}
    got = model.embed_weighted(["Disk full, disk!", ""], lambda word: weights[word])
    disk, full = model.embed(["disk", "full"])
    expected = 2 * 2.0 * disk + 0.5 * full  # "disk" twice
    assert np.allclose(got[0], expected / np.linalg.norm(expected), atol=1e-6)
    assert not got[1].any()  # no words: a zero row


def test_term_weights_are_rarity_among_documents():
    weights = TermWeights([["a", "b"], ["a", "c", "c"], ["a"]])
    assert weights("b") == pytest.approx(math.log(4 / 1.5))
    assert 0 < weights("a") < weights("b") == weights("c") < weights("never-seen")
    assert words("KubeQuota_almost-full 93%") == ["kubequota", "almost", "full", "93"]


def test_a_word_every_document_shares_stops_deciding_which_title_a_question_is_about():
    titles = {
        "Getting started with Prometheus": "install run prometheus scrape targets",
        "Comparison to alternatives": "prometheus graphite influxdb storage",
        "Pushing metrics": "prometheus pushgateway batch jobs",
        "Alerting": "prometheus alertmanager alerts rules",
    }
    model = load_static_embedder()
    weights = TermWeights(words(f"{title} {text}") for title, text in titles.items())
    question = "How does Prometheus compare against other monitoring systems?"
    plain = model.embed(list(titles)) @ model.embed([question])[0]
    weighted = model.embed_weighted(list(titles), weights) @ model.embed_weighted([question], weights)[0]
    assert list(titles)[int(np.argmax(plain))] == "Getting started with Prometheus"  # the shared word decides
    assert list(titles)[int(np.argmax(weighted))] == "Comparison to alternatives"


def _committed_queries() -> list[str]:
    """Every query of the repository's golden sets, and each line of the bundled sample knowledge base."""
    from tests.conftest import REPO, SAMPLE_KB

    queries = [json.loads(line)["query"] for path in sorted((REPO / "golden").glob("*.jsonl")) for line in path.open()]
    lines = [line for path in sorted(SAMPLE_KB.rglob("*.md")) for line in path.read_text().splitlines()]
    return queries + lines


def test_a_query_tokenised_word_by_word_gets_the_whole_query_s_tokens():
    model = load_static_embedder()
    texts = [*_committed_queries(), "KubePodCrashLooping on  node-1 ", "\u2581already marked", "one", "", "a\tb c"]
    split = 0
    for text in texts:
        split += model._piecewise_plan(text) is not None
        assert model.token_ids(text) == model.tokenizer.encode(text, add_special_tokens=False).ids, text
    assert split > len(texts) // 2  # the plan is taken, not skipped: most texts went word by word
    assert np.array_equal(model.embed([texts[0]]), model.embed([texts[0], texts[1]])[:1])


def test_where_words_alone_could_tokenise_otherwise_the_whole_query_is_encoded():
    model = load_static_embedder()
    assert model._piecewise_plan("etcd has no leader") == ["etcd", "has", "no", "leader"]
    for text in ("etcd  has no leader", " etcd has", "etcd has ", "etcd \u2581has", "etcd"):
        assert model._piecewise_plan(text) is None, text
    # Runs of the word mark are tokens of their own: two spaces do not tokenise as the two words around them.
    encode = model.tokenizer.encode
    assert encode("etcd  has", add_special_tokens=False).ids != [
        *encode("etcd", add_special_tokens=False).ids,
        *encode("has", add_special_tokens=False).ids,
    ]
    merging = Tokenizer.from_str(model.tokenizer.to_str())
    merging.add_tokens(["d\u2581h"])  # a token across a word mark: words alone would tokenise otherwise
    assert static_embed._words_tokenise_alone(model.tokenizer)
    assert not static_embed._words_tokenise_alone(merging)


def test_the_tokenizer_check_is_kept_in_the_cache_folder_by_the_file_s_hash(tmp_path, monkeypatch):
    """The answer kept in the model cache folder is the check's own, read back without the check; another tokenizer
    file (a changed vocabulary) is checked anew, and so is a note that says nothing readable."""
    _, tokenizer_file = static_model_files()
    tokenizer_json = tokenizer_file.read_bytes()
    tokenizer = Tokenizer.from_buffer(tokenizer_json)
    computed = static_embed._words_tokenise_alone(tokenizer)
    cache = tmp_path / "cache"
    assert static_embed.words_tokenise_alone(tokenizer, tokenizer_json, cache) is computed
    (note,) = cache.iterdir()
    assert note.read_text() == str(computed).lower()

    checks: list[int] = []
    real_check = static_embed._words_tokenise_alone
    monkeypatch.setattr(static_embed, "_words_tokenise_alone", lambda t: checks.append(1) or real_check(t))
    assert static_embed.words_tokenise_alone(tokenizer, tokenizer_json, cache) is computed
    assert checks == []  # read from the note
    embedder = static_embed.StaticEmbedder(np.zeros((4, 2), np.float32), tokenizer, words_alone=computed)
    assert embedder._piecewise is computed and checks == []

    # A changed vocabulary: a token across a word mark, which words alone would tokenise otherwise.
    merging = Tokenizer.from_str(tokenizer.to_str())
    merging.add_tokens(["d\u2581h"])
    assert static_embed.words_tokenise_alone(merging, merging.to_str().encode(), cache) is False
    assert checks == [1] and len(list(cache.iterdir())) == 2

    note.write_text("garbled")
    assert static_embed.words_tokenise_alone(tokenizer, tokenizer_json, cache) is computed
    assert checks == [1, 1] and note.read_text() == str(computed).lower()
    assert static_embed.words_tokenise_alone(tokenizer, tokenizer_json, None) is computed and checks == [1, 1, 1]


def test_term_weights_are_worked_out_once_as_the_formula_gives_them():
    documents = [["a", "b"], ["a", "c", "c"], ["a"], ["d"]]
    weights = TermWeights(documents)
    for word, df in {"a": 3, "b": 1, "c": 1, "d": 1, "never-seen": 0}.items():
        assert weights(word) == math.log((len(documents) + 1) / (df + 0.5))  # exactly: the same float


@pytest.mark.unit
def test_unit_rows_is_the_division_by_numpy_s_norm_bit_for_bit():
    rng = np.random.default_rng(5)
    for shape in [(1, 256), (1, 384), (3, 384), (111, 256), (4, 7)]:
        rows = (rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
        rows[-1] = 0.0 if shape[0] > 1 else rows[-1]  # a zero row stays zero
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        assert unit_rows(rows).tobytes() == (rows / np.where(norms == 0, 1.0, norms)).tobytes()


def test_a_query_s_vector_is_the_normalised_mean_of_its_pieces_bit_for_bit():
    # The one-text path computes the mean and the norm without numpy's Python wrappers: the same floats as
    # ``mean(axis=0)`` and ``np.linalg.norm`` give (the document ranker's static similarities are rounded downstream).
    model = load_static_embedder()
    for text in [*_committed_queries()[:300], "one", "KubePodCrashLooping"]:
        ids = model.token_ids(text)
        if not ids:
            continue
        mean = np.take(model.table, ids, axis=0, mode="clip").mean(axis=0)[np.newaxis, :]
        expected = mean / np.linalg.norm(mean, axis=1, keepdims=True)
        assert model.embed([text]).tobytes() == expected.tobytes(), text
