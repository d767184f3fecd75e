"""BM25 in this process with bm25s (``lexical_mode = in_process_bm25``: engines or collections without full-text
search), built in memory from the collection's rows.

Example:
    >>> index = LexicalIndex.build([("c1", "Redis memory high", "redis"), ("c2", "MySQL lag", "mysql")])
    >>> [hit.chunk_id for hit in index.search("redis maxmemory reached", 5)]
    ['c1']
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kb_retrieval.retrieval.bm25.analysis import bm25s_tokenizer, with_identifier_parts
from kb_retrieval.retrieval.bm25.scores import relative_to_best, top_k


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
        self.bm25s_tokenizer = tokenizer

    @classmethod
    def build(cls, rows: Iterable[tuple[str, str, str]]) -> LexicalIndex:
        """Index ``(chunk_id, text, category)`` rows."""
        import bm25s

        rows = list(rows)
        tokenizer = bm25s_tokenizer()
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
        tokenize = self.bm25s_tokenizer.tokenize  # type: ignore[attr-defined]
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
