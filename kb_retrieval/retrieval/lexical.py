"""A lexical signal beside the dense one: BM25 over the same chunks that are in Milvus.

Alert texts and runbooks share exact vocabulary (metric names, component names, "has not found all other cluster
members") that a small sentence-embedding model blurs. BM25 finds those chunks; Milvus still gives each its dense
similarity, so every candidate carries one comparable similarity.

Two places run BM25, with one analysis (:func:`analysed_text`: identifiers split into their words, lower case,
English stopwords dropped, Snowball English stems):

- **In Milvus** (``lexical_mode = milvus_bm25``, Milvus Lite 3.2 and Milvus >= 2.5): ingest writes the analysed text
  of each chunk (:func:`lexical_document`) into a VARCHAR field with Milvus' analyser on and a BM25 ``Function``
  into a sparse field; a lookup sends the analysed query as the BM25 request of its one ``hybrid_search`` call. The
  analysis is ours, not the engine's: Milvus Lite 3.2.2 ignores analyser filters (no stemming, no stopwords,
  measured), and its standard tokenizer leaves our already analysed words as they are, so both engines index the
  same terms.
- **In process** (``lexical_mode = in_process_bm25``, the fallback for engines without full-text search, e.g. the
  Milvus 2.3 server, and for collections made before it): :class:`LexicalIndex`, built in memory from the
  collection's rows when a lookup object is created and after another process's ingest; the lexical hits get their
  dense similarity from their vectors, read from Milvus by key beside the dense search and then kept
  (:mod:`kb_retrieval.retrieval.hybrid`).

Example:
    >>> index = LexicalIndex.build([("c1", "Redis memory high", "redis"), ("c2", "MySQL lag", "mysql")])
    >>> [hit.chunk_id for hit in index.search("redis maxmemory reached", 5)]
    ['c1']
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kb_retrieval.knowledge.text import split_camel

_TOKEN_PATTERN = r"(?u)\b\w\w+\b"
_IDENTIFIER = re.compile(r"\b(?=\w*[a-z][A-Z]|\w*_\w)\w+\b")  # CamelCase or snake_case


def _tokenizer() -> Any:
    """The BM25 analysis both places share (a fresh tokenizer: its vocabulary grows with what it reads)."""
    import Stemmer
    from bm25s.tokenization import Tokenizer

    logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its logger to DEBUG on import
    return Tokenizer(stemmer=Stemmer.Stemmer("english"), stopwords="en", splitter=_TOKEN_PATTERN)


#: bm25s' English stopwords (``bm25s.stopwords.STOPWORDS_EN``, NLTK's short list), which :func:`_tokenizer` uses;
#: kept here so that :func:`analysed_text` runs without importing bm25s (numba and scipy: ~0.6 s a process).
STOPWORDS_EN = frozenset(
    {
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "if",
        "in",
        "into",
        "is",
        "it",
        "no",
        "not",
        "of",
        "on",
        "or",
        "such",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "will",
        "with",
    }
)
_WORDS = re.compile(_TOKEN_PATTERN).findall
_STEMMERS = threading.local()  # PyStemmer objects are not thread-safe: one per thread


def stem(word: str) -> str:
    """The English (Snowball) stem of a lower-cased word, as the BM25 analysis makes it."""
    stemmer = getattr(_STEMMERS, "stemmer", None)
    if stemmer is None:
        import Stemmer

        stemmer = _STEMMERS.stemmer = Stemmer.Stemmer("english")
    return str(stemmer.stemWord(word))


def analysed_text(text: str) -> str:
    """The words BM25 indexes for ``text``, space-separated: what ingest writes into the analysed field and what
    a lookup sends as its BM25 request. The same analysis as :func:`_tokenizer`'s (lower case, words of 2+ characters,
    stopwords dropped, Snowball English stems, in text order), without bm25s (pinned by a test against it).

    Example:
        >>> analysed_text("KubePodCrashLooping: the pods are restarting")
        'kubepodcrashloop pod restart kube pod crash loop'
    """
    words = _WORDS(with_identifier_parts(text).lower())
    return " ".join(s for word in words if word not in STOPWORDS_EN and (s := stem(word)))


def with_identifier_parts(text: str) -> str:
    """``text`` followed by the parts of its identifiers, so ``KubePersistentVolumeFillingUp`` also matches
    "persistent volume filling up" and ``kube_pod_status_ready`` matches "pod status" (the whole stays a term)."""
    parts = [" ".join(split_camel(piece)) for match in _IDENTIFIER.finditer(text) for piece in match.group().split("_")]
    return f"{text}\n{' '.join(parts)}" if parts else text


def lexical_header(title: str | None, breadcrumb: str | None) -> str:
    """The header BM25 indexes before a chunk's text: the one the embedding sees (``Chunk.embedding_text``), the
    title leading a breadcrumb that does not start with it (a runbook titled "Kube Persistent Volume Filling Up" whose
    breadcrumb starts at its H1 "KubePersistentVolumeFillingUp")."""
    crumb = breadcrumb or ""
    if title and not crumb.startswith(title):
        return f"{title} > {crumb}" if crumb else title
    return crumb


def lexical_document(title: str | None, breadcrumb: str | None, content: str) -> str:
    """What BM25 indexes for a chunk, in both places: its header (:func:`lexical_header`) and its content."""
    return f"{lexical_header(title, breadcrumb)}\n{content}"


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` largest ``values``, largest first, equal values in position order: the same as
    ``np.argsort(-values, kind="stable")[:k]``, without sorting every value (at 100k chunks that sort took ~14 ms of a
    ~18 ms BM25 search; a partition and a sort of ``k`` take well under 1 ms).

    Example:
        >>> top_k(np.array([0.5, 2.0, 0.5, 1.0, 2.0]), 3).tolist()
        [1, 4, 3]
    """
    n = len(values)
    if k <= 0:
        return np.empty(0, dtype=np.intp)
    if k >= n:
        return np.argsort(-values, kind="stable")
    kth = np.partition(values, n - k)[n - k]  # the k-th largest value
    above = np.flatnonzero(values > kth)  # fewer than k
    ties = np.flatnonzero(values == kth)[: k - len(above)]  # the first of the equal ones, as a stable sort keeps
    chosen = np.sort(np.concatenate([above, ties]))
    return chosen[np.argsort(-values[chosen], kind="stable")]


def relative_to_best(scores: dict[str, float]) -> dict[str, float]:
    """BM25 scores relative to the best of them (1.0 for the best, six decimals; none without a positive best): the
    ``lexical_score`` every place BM25 runs reports, in process or in Milvus.

    Example:
        >>> relative_to_best({"c1": 4.0, "c2": 1.0})
        {'c1': 1.0, 'c2': 0.25}
    """
    best = max(scores.values(), default=0.0)
    return {chunk_id: round(score / best, 6) for chunk_id, score in scores.items()} if best > 0 else {}


@dataclass(frozen=True)
class LexicalHit:
    """One in-process BM25 hit."""

    chunk_id: str
    score: float  # BM25, normalised by the best score of the query: 1.0 for the best hit


class LexicalIndex:
    """BM25 (bm25s) over chunk texts; ``search`` is read-only and thread-safe."""

    def __init__(self, chunk_ids: list[str], categories: list[str], retriever: object, tokenizer: object) -> None:
        self.chunk_ids = chunk_ids
        # Positions per category, looked up by exact string equality: comparing a NumPy array with a string
        # drops the string's trailing NULs, so "redis\x00" would have matched "redis".
        positions: dict[str, list[int]] = {}
        for position, category in enumerate(categories):
            positions.setdefault(category, []).append(position)
        self._by_category = {key: np.asarray(value, dtype=np.int64) for key, value in positions.items()}
        self._retriever = retriever
        self._tokenizer = tokenizer

    @classmethod
    def build(cls, rows: Iterable[tuple[str, str, str]]) -> LexicalIndex:
        """Index ``(chunk_id, text, category)`` rows."""
        import bm25s

        rows = list(rows)
        tokenizer = _tokenizer()
        retriever = bm25s.BM25()
        if rows:
            ids = tokenizer.tokenize(
                [with_identifier_parts(row[1]) for row in rows],
                update_vocab=True,
                return_as="ids",
                show_progress=False,
            )
            retriever.index(ids, show_progress=False)
        return cls([r[0] for r in rows], [r[2] for r in rows], retriever, tokenizer)

    def __len__(self) -> int:
        return len(self.chunk_ids)

    def search(self, query: str, k: int, category: str | None = None) -> list[LexicalHit]:
        """Up to ``k`` chunks with a positive BM25 score, best first, optionally of one category only."""
        if not self.chunk_ids:
            return []
        tokenize = self._tokenizer.tokenize  # type: ignore[attr-defined]
        ids = tokenize([with_identifier_parts(query)], update_vocab=False, return_as="ids", show_progress=False)
        if not ids or not ids[0]:
            return []
        weights = self._retriever.get_scores(ids[0])  # type: ignore[attr-defined]
        if category is not None:
            kept = np.zeros_like(weights)
            positions = self._by_category.get(category)
            if positions is not None:
                kept[positions] = weights[positions]
            weights = kept
        scores = {self.chunk_ids[i]: float(weights[i]) for i in top_k(weights, k) if weights[i] > 0}
        return [LexicalHit(chunk_id, score) for chunk_id, score in relative_to_best(scores).items()]
