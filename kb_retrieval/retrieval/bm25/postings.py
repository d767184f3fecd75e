"""BM25 over the analysed text the collection holds, scored as Milvus Lite scores it: the memory plan's mirror
(:mod:`kb_retrieval.retrieval.l1.memory`) answers as the Milvus call would."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import numpy as np

from kb_retrieval.retrieval.bm25.analysis import analyse

#: Milvus Lite's BM25 defaults (``milvus_lite.index.sparse_factory``; the collection's index sets no others).
BM25_K1 = 1.5
BM25_B = 0.75


class Bm25Postings:
    """BM25 over the analysed text of every row, scored as Milvus Lite scores it (float32, term by term).

    The postings are one array of rows and one of term-frequency factors, ordered by term then row (a term's are one
    slice): built with a few array operations rather than an array per term.
    """

    def __init__(self, texts: Iterable[str]) -> None:
        vocabulary: dict[str, int] = {}
        term_ids: list[int] = []
        rows: list[int] = []
        freqs: list[int] = []
        lengths: list[int] = []
        for row, text in enumerate(texts):
            counts = Counter(analyse(text or ""))
            lengths.append(sum(counts.values()))
            term_ids.extend(vocabulary.setdefault(term, len(vocabulary)) for term in counts)
            rows.extend([row] * len(counts))
            freqs.extend(counts.values())
        self.count = len(lengths)
        self._vocabulary = vocabulary
        order = np.argsort(np.asarray(term_ids, dtype=np.int64), kind="stable")  # by term, rows ascending within
        self._rows = np.asarray(rows, dtype=np.int64)[order]
        freq = np.asarray(freqs, dtype=np.float64)[order]
        self._starts = np.searchsorted(np.asarray(term_ids, dtype=np.int64)[order], np.arange(len(vocabulary) + 1))
        # Lite: every row counts in N and in the mean length, an empty one too. Its arithmetic is float32 (the
        # document lengths are a float32 array, and NumPy keeps a Python float beside a float32 in float32), in this
        # order of operations; so is this, so the scores are Lite's to the bit.
        dl = np.asarray(lengths, dtype=np.float32)
        avgdl = np.float32((float(sum(lengths)) / self.count if self.count else 0.0) or 1.0)
        k1, b, rest = np.float32(BM25_K1), np.float32(BM25_B), np.float32(1.0 - BM25_B)
        numerator = (freq * (BM25_K1 + 1.0)).astype(np.float32)
        self._weights = numerator / (freq.astype(np.float32) + k1 * (rest + b * dl[self._rows] / avgdl))

    def _accumulate(self, terms: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Every row's BM25 score for the analysed query ``terms`` and the number (in query order) of the first
        query term that reached it (``len(terms)`` for rows none reached); ``None`` when no term is known."""
        weights: dict[str, float] = {}
        for term in analyse(terms):
            weights[term] = weights.get(term, 0.0) + 1.0
        total = np.zeros(self.count, dtype=np.float32)
        slices: list[tuple[int, int]] = []
        n = self.count
        for term, weight in weights.items():
            term_id = self._vocabulary.get(term)
            if term_id is None:
                continue
            start, end = int(self._starts[term_id]), int(self._starts[term_id + 1])
            df = end - start
            idf = math.log((n - df + 0.5) / (df + 0.5) + 1.0)
            # Term by term, in query order: float32 sums in Lite's order of operations.
            total[self._rows[start:end]] += np.float32(idf) * self._weights[start:end] * np.float32(weight)
            slices.append((start, end))
        if not slices:
            return None
        first = np.full(self.count, len(slices), dtype=np.int32)
        for number in range(len(slices) - 1, -1, -1):  # the last write is the earliest term's
            start, end = slices[number]
            first[self._rows[start:end]] = number
        return total, first

    def scores(self, terms: str) -> tuple[np.ndarray, np.ndarray]:
        """Rows with a positive BM25 score for the analysed query ``terms``, and their scores, in the order a query
        term first reached them (Lite's order among equal scores: query term by term, rows ascending within)."""
        found = self._accumulate(terms)
        if found is None:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        total, first = found
        rows = np.flatnonzero(total > 0)
        rows = rows[np.lexsort((rows, first[rows]))]
        return rows, total[rows]

    def top(self, terms: str, k: int, within: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best rows by BM25 (positive scores only; ``within``: a mask of the rows allowed), best first,
        equal scores in the order of :meth:`scores`: what a stable sort of :meth:`scores` by score gives, from a
        partition rather than a sort of every row a term reached."""
        found = self._accumulate(terms) if k > 0 else None
        if found is None:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        total, first = found
        rows = np.flatnonzero(total > 0 if within is None else (total > 0) & within)
        values = total[rows]
        if len(rows) > k:  # every row scoring at least the k-th best (ties at the cut included), then ordered
            cut = np.partition(values, len(values) - k)[len(values) - k]
            rows = rows[values >= cut]
            values = total[rows]
        order = np.lexsort((rows, first[rows], -values))[:k]
        return rows[order], values[order]
