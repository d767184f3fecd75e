"""The in-process BM25 index's own parts (the analysis is pinned in tests/retrieval/test_lexical_and_focus.py)."""

from __future__ import annotations

import numpy as np
import pytest

from kb_retrieval.retrieval.bm25 import top_k


@pytest.mark.parametrize("seed", range(40))
def test_top_k_is_the_stable_sort_s_first_k(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    # Few distinct values (many ties, zeros among them, as BM25 weights of chunks without a query term) or many.
    values = rng.integers(0, 5, n).astype(np.float64) if seed % 2 else rng.standard_normal(n).astype(np.float32)
    for k in (0, 1, 2, 7, 20, n - 1, n, n + 5):
        assert top_k(values, k).tolist() == np.argsort(-values, kind="stable")[: max(k, 0)].tolist()


def test_top_k_of_all_equal_values_keeps_position_order():
    assert top_k(np.zeros(10), 4).tolist() == [0, 1, 2, 3]
