"""The BM25 analysis, one for every place BM25 runs: identifiers split into their words, lower case, English
stopwords dropped, Snowball English stems (:func:`analysed_text`, what ingest writes and a lookup sends), and the
terms Milvus Lite's standard analyser makes of that analysed text (:func:`analyse`, the memory plan's postings).

Example:
    >>> analysed_text("KubePodCrashLooping: the pods are restarting")
    'kubepodcrashloop pod restart kube pod crash loop'
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from kb_retrieval.knowledge.text import split_camel

_TOKEN_PATTERN = r"(?u)\b\w\w+\b"
_IDENTIFIER = re.compile(r"\b(?=\w*[a-z][A-Z]|\w*_\w)\w+\b")  # CamelCase or snake_case


def bm25s_tokenizer() -> Any:
    """bm25s' tokenizer doing the BM25 analysis (a fresh tokenizer: its vocabulary grows with what it reads)."""
    import Stemmer
    from bm25s.tokenization import Tokenizer

    logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its logger to DEBUG on import
    return Tokenizer(stemmer=Stemmer.Stemmer("english"), stopwords="en", splitter=_TOKEN_PATTERN)


#: bm25s' English stopwords (``bm25s.stopwords.STOPWORDS_EN``, NLTK's short list), which :func:`bm25s_tokenizer` uses;
#: kept here so that :func:`analysed_text` runs without importing bm25s (numba and scipy: ~0.6 s a process). Not the
#: L0 and rare-term list (:data:`kb_retrieval.retrieval.l0_hints.QUESTION_STOPWORDS`: says why they differ).
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
    a lookup sends as its BM25 request. The same analysis as :func:`bm25s_tokenizer`'s (lower case, words of 2+
    characters, stopwords dropped, Snowball English stems, in text order), without bm25s (pinned by a test against
    it).

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
    """What BM25 indexes for a chunk, in every place: its header (:func:`lexical_header`) and its content."""
    return f"{lexical_header(title, breadcrumb)}\n{content}"


#: Milvus Lite's standard analyser (``milvus_lite.analyzer.standard``): word characters, lower-cased, no stop words.
_WORD = re.compile(r"\w+")


def analyse(text: str) -> list[str]:
    """The terms Milvus Lite's standard analyser makes of ``text``.

    Example:
        >>> analyse("Redis memori_high: 95%")
        ['redis', 'memori_high', '95']
    """
    return _WORD.findall(text.lower())
