"""The BM25 scores every place reports: the best ``k`` of an array, and scores relative to the query's best hit
(the ``lexical_score`` of a candidate, in process or in Milvus)."""

from __future__ import annotations

import numpy as np


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
