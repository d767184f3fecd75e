"""The in-process BM25 category filter compares categories exactly (issue 14 item 7)."""

from __future__ import annotations

import pytest

from kb_retrieval.retrieval.bm25 import LexicalIndex

pytestmark = pytest.mark.unit

ROWS = [
    ("r1", "redis memory usage above maxmemory", "redis"),
    ("r2", "redis replication broken", "redis"),
    ("m1", "mysql memory usage high", "mysql"),
    ("n1", "memory usage of a NUL-suffixed category", "redis\x00"),
]


@pytest.mark.parametrize(
    ("category", "expected"),
    [
        ("redis", {"r1"}),
        ("redis\x00", {"n1"}),  # NumPy string comparison would drop the NUL and match "redis" instead
        ("redis\x00\x00", set()),
        ("Redis", set()),
        ("redis ", set()),
        ("", set()),
        ("mysql", {"m1"}),
    ],
)
def test_category_filter_is_exact(category: str, expected: set[str]) -> None:
    index = LexicalIndex.build(ROWS)
    hits = index.search("memory usage", 10, category=category)
    assert {hit.chunk_id for hit in hits} == expected


def test_no_category_searches_everything() -> None:
    hits = LexicalIndex.build(ROWS).search("memory usage", 10)
    assert {hit.chunk_id for hit in hits} == {"r1", "m1", "n1"}
