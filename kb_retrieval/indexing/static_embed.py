"""A second embedding model, static: WordLlama's ``l2_supercat`` token table (256 dims), for ranking documents.

The document ranker's similarities all come from one bi-encoder (all-MiniLM-L6-v2), and where sibling runbooks are a
few hundredths apart under it ("receive" vs "transmit" errors, client vs server certificate) a second opinion from a
model trained differently separates some of them. A static model is cheap enough to ask for every lookup: a text's
vector is the mean of its word pieces' vectors (a table lookup, ~0.1 ms for a query), here one per document from the
same summary text as its summary vector (:mod:`kb_retrieval.indexing.doc_vectors`).

The table and tokenizer are data files of the PyPI package ``wordllama`` (MIT), read from where it is installed;
nothing is downloaded. The package itself is not imported: its loader looks for the tokenizer under a folder name
the wheel does not use and then fetches it from the Hugging Face hub, and importing it configures the root logger.
This module computes what ``WordLlamaInference.embed(texts, norm=True)`` computes (tested against it).

A mean of word pieces weighs every word alike, so in a knowledge base about Prometheus the word "Prometheus" pulls
"Getting started with Prometheus" towards every question that names it. :meth:`StaticEmbedder.embed_weighted` sums
word vectors weighted by how rare each word is in the knowledge base (:class:`TermWeights`, its inverse document
frequency): the classic weighted average of word vectors, which a static model allows and a transformer does not.

Example:
    >>> model = load_static_embedder()  # doctest: +SKIP
    >>> model.embed(["network interface transmit errors"]).shape  # doctest: +SKIP
    (1, 256)
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from kb_retrieval.atomic import atomic_write
from kb_retrieval.knowledge.text import words

#: Names the static model in row hashes and traces; a change rewrites every document's vectors.
STATIC_MODEL = "wordllama:l2_supercat_256"
STATIC_DIM = 256
_PACKAGE = "wordllama"
_WEIGHTS = Path("weights") / "l2_supercat_256.safetensors"
_TOKENIZER = Path("tokenizers") / "l2_supercat_tokenizer_config.json"
_TENSOR = "embedding.weight"
#: Word vectors kept per embedder (a query's words are mostly seen before); past this the cache starts again.
_WORD_CACHE_LIMIT = 200_000
#: The SentencePiece word mark: the tokenizer's normaliser turns every space (and the text's start) into it.
_MARK = "\u2581"
#: Part of the name of the note keeping :func:`_words_tokenise_alone`'s answer: bump it when the check changes.
_WORDS_ALONE_CHECK = 1


class StaticModelMissingError(RuntimeError):
    """The static model's files are not installed."""


class StaticEmbedder:
    """Normalised mean of a text's token vectors (special tokens left out; a text without tokens is a zero row)."""

    def __init__(self, table: np.ndarray, tokenizer: Tokenizer, *, words_alone: bool | None = None) -> None:
        """``words_alone``: :func:`_words_tokenise_alone`'s answer for ``tokenizer`` when already known (a note in
        the model cache folder, :func:`load_static_embedder`); None: checked here."""
        self.table = np.ascontiguousarray(table, dtype=np.float32)
        self.tokenizer = tokenizer
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self._piecewise = _words_tokenise_alone(self.tokenizer) if words_alone is None else words_alone
        self._piece_ids: dict[str, list[int]] = {}

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """An (n, dim) float32 array of unit rows."""
        if len(texts) == 1:  # a lookup's query: its words' pieces, mostly seen before
            if not (ids := self.token_ids(texts[0])):
                return np.zeros((1, self.dim), dtype=np.float32)
            # The mean as ``mean(axis=0)`` computes it (a float32 sum, divided by the count), without its Python.
            return unit_rows((np.add.reduce(self._pieces(ids), axis=0) / len(ids))[np.newaxis, :])
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, encoding in enumerate(self.tokenizer.encode_batch(list(texts), add_special_tokens=False)):
            if encoding.ids:
                out[row] = self._pieces(encoding.ids).mean(axis=0)
        return unit_rows(out)

    def _pieces(self, ids: list[int]) -> np.ndarray:
        """The table's rows of ``ids``; an id past the table takes its last row ("clip")."""
        return np.take(self.table, ids, axis=0, mode="clip")

    def token_ids(self, text: str) -> list[int]:
        """``text``'s token ids (no special tokens), as one ``encode`` of the whole text gives them.

        Word by word when :meth:`_piecewise_plan` allows, each distinct word encoded once per embedder and cached: a
        query's words recur across lookups, and the BPE of a whole query costs more than the rest of its vector.
        """
        if (pieces := self._piecewise_plan(text)) is None:
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        cache = self._piece_ids
        if len(cache) > _WORD_CACHE_LIMIT:
            cache.clear()
        ids: list[int] = []
        for piece in pieces:
            if (known := cache.get(piece)) is None:
                known = cache[piece] = self.tokenizer.encode(piece, add_special_tokens=False).ids
            ids += known
        return ids

    def _piecewise_plan(self, text: str) -> list[str] | None:
        """``text``'s words, split on single spaces, when their tokens put end to end are the whole text's; None
        when they might not be (then the whole text is encoded).

        They are when the tokenizer marks each space as a word start and no merge crosses a mark
        (:func:`_words_tokenise_alone`, checked once) and every word stands alone: no empty word (two spaces in a
        row, a leading or trailing space, where runs of marks would merge) and no mark typed in the text itself.
        """
        if not self._piecewise or _MARK in text:
            return None
        pieces = text.split(" ")
        return None if len(pieces) < 2 or "" in pieces else pieces

    def embed_weighted(self, texts: Sequence[str], weight: Callable[[str], float]) -> np.ndarray:
        """An (n, dim) float32 array of unit rows: each text's words (:func:`~kb_retrieval.knowledge.text.words`,
        repeats counted), every word's own vector (the normalised mean of its word pieces) times ``weight(word)``,
        summed."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            counts = Counter(words(text))
            if counts:
                distinct = sorted(counts)
                vectors = self._word_vectors(distinct)
                out[row] = np.asarray([counts[w] * weight(w) for w in distinct], dtype=np.float32) @ vectors
        return unit_rows(out)

    def _word_vectors(self, words: Sequence[str]) -> np.ndarray:
        cache: dict[str, np.ndarray] = self.__dict__.setdefault("_word_cache", {})
        if missing := [w for w in words if w not in cache]:
            if len(cache) + len(missing) > _WORD_CACHE_LIMIT:
                cache.clear()
            cache.update(zip(missing, self.embed(missing), strict=True))
        return np.stack([cache[w] for w in words])


def unit_rows(rows: np.ndarray) -> np.ndarray:
    """``rows`` (2-D float32) each divided by its L2 norm, a zero row left zero: bit for bit what dividing by
    ``np.linalg.norm(rows, axis=1, keepdims=True)`` gives (the same sum of squares and square root, called without
    ``norm``'s Python; a lookup normalises its static query vectors four times).

    Example:
        >>> unit_rows(np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)).tolist()
        [[0.6000000238418579, 0.800000011920929], [0.0, 0.0]]
    """
    norms = np.sqrt(np.add.reduce(rows * rows, axis=1, keepdims=True))
    return rows / np.where(norms == 0, 1.0, norms)


def _words_tokenise_alone(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` encodes words joined by single spaces as the words one by one, end to end.

    True for a SentencePiece-style BPE (WordLlama's): its normaliser marks every word start with ``\u2581``, and when
    no token holds the mark past its first character, other than a run of marks (indentation), no merge joins one
    word to the next. Checked on the vocabulary, then confirmed on a probe text.
    """
    if any(_MARK in token[1:] and token.strip(_MARK) for token in tokenizer.get_vocab()):
        return False
    probe = ["kube", "pod", "CrashLooping", "p99", "latency", "(5m)", "über", "etcd_server"]
    whole = tokenizer.encode(" ".join(probe), add_special_tokens=False).ids
    return whole == [i for word in probe for i in tokenizer.encode(word, add_special_tokens=False).ids]


def words_tokenise_alone(tokenizer: Tokenizer, tokenizer_json: bytes, cache_dir: Path | None) -> bool:
    """:func:`_words_tokenise_alone` of ``tokenizer`` (parsed from ``tokenizer_json``, its file's bytes), kept in
    ``cache_dir``.

    The check reads the whole vocabulary (32k tokens, ~35 ms), which every process that loads the static model paid
    (a CLI lookup at every start); its answer depends only on the tokenizer file, so it is kept in a note named by
    the file's SHA-256 (~2 ms to hash): another vocabulary, normaliser or merge list is another note, checked anew.
    A note that cannot be read or written is only a cache (the check runs); ``cache_dir`` None: always checked.
    """
    if cache_dir is None:
        return _words_tokenise_alone(tokenizer)
    digest = hashlib.sha256(tokenizer_json).hexdigest()[:16]
    note = cache_dir / f"static-words-alone-c{_WORDS_ALONE_CHECK}-{digest}.txt"
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if (said := note.read_text(encoding="ascii").strip()) in ("true", "false"):
            return said == "true"
    answer = _words_tokenise_alone(tokenizer)
    with contextlib.suppress(OSError):
        cache_dir.mkdir(parents=True, exist_ok=True)
        # 0644 as the ONNX exports beside it: a shared cache folder's other users read it too.
        with atomic_write(note, encoding="ascii", file_mode=0o644) as handle:
            handle.write("true" if answer else "false")
    return answer


class TermWeights:
    """How rare each word is in a knowledge base: ``log((N + 1) / (df + 0.5))`` for a word in ``df`` of its ``N``
    documents (a word it never uses weighs most; none weighs 0 or less).

    Example:
        >>> weights = TermWeights([["prometheus", "overview"], ["prometheus", "pushing"]])
        >>> weights("prometheus") < weights("pushing") < weights("unseen")
        True
    """

    def __init__(self, documents: Iterable[Iterable[str]]) -> None:
        self.df: Counter[str] = Counter()
        self.documents = 0
        for terms in documents:
            self.df.update(set(terms))
            self.documents += 1
        # Every weight worked out once (a lookup asks one per query word): the known words', and the unseen one.
        self._weights = {word: self._weight(df) for word, df in self.df.items()}
        self._unseen = self._weight(0)

    def _weight(self, df: int) -> float:
        return math.log((self.documents + 1) / (df + 0.5))

    def __call__(self, word: str) -> float:
        return self._weights.get(word, self._unseen)


def static_model_files() -> tuple[Path, Path]:
    """(weights, tokenizer) of the installed ``wordllama`` package, without importing it."""
    spec = importlib.util.find_spec(_PACKAGE)
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in map(Path, roots):
        weights, tokenizer = root / _WEIGHTS, root / _TOKENIZER
        if weights.is_file() and tokenizer.is_file():
            return weights, tokenizer
    raise StaticModelMissingError(
        f"the static model {STATIC_MODEL} needs the package '{_PACKAGE}' with {_WEIGHTS} and {_TOKENIZER} "
        f"(pip install wordllama); searched: {roots or 'not installed'}"
    )


@lru_cache(maxsize=4)
def load_static_embedder(cache_dir: Path | None = None) -> StaticEmbedder:
    """The static model, loaded once per process and ``cache_dir`` (~16 MB of float16 table read into float32).

    ``cache_dir``: the model cache folder (``KBSettings.resolved_model_cache_dir()``), where the tokenizer check's
    answer is kept (:func:`words_tokenise_alone`); None: checked at every load."""
    weights, tokenizer_file = static_model_files()
    # Read once: the bytes parsed are the bytes hashed to name the check's note.
    tokenizer_json = tokenizer_file.read_bytes()
    tokenizer = Tokenizer.from_buffer(tokenizer_json)
    words_alone = words_tokenise_alone(tokenizer, tokenizer_json, cache_dir)
    return StaticEmbedder(load_file(str(weights))[_TENSOR], tokenizer, words_alone=words_alone)
