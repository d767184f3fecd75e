"""Where a document's sections come from: Milvus, or on the memory plan the mirror's rows, with the same sections."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.retrieval.expand import MirrorSectionStore, SectionStore
from kb_retrieval.retrieval.filters import in_expr
from kb_retrieval.retrieval.l1.memory import MemoryMirror


class QueryByList:
    """A client answering ``source in [...]`` queries over ``rows`` in their order (a Milvus query's), counting them."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.filters: list[str] = []

    def query(self, collection: str, *, filter: str, output_fields: list[str], **kwargs: Any) -> list[dict[str, Any]]:
        self.filters.append(filter)
        return [{f: row.get(f) for f in output_fields} for row in self.rows if f'"{row["source"]}"' in filter]


def _row(source: str, doc_hash: str, position: int | None, i: int) -> dict[str, Any]:
    meta: dict[str, Any] = {"doc_hash": doc_hash, "breadcrumb": f"{source} > s{position}", "title": source}
    if position is not None:
        meta["position"] = position
    return {"id": f"c{i}", "content": f"{source} {doc_hash} section {position}", "source": source, "category": "x",
            "metadata": meta}  # fmt: skip


def _rows() -> list[dict[str, Any]]:
    """Three documents, one of them in two versions (``redis.md`` h1 and h2, as a collection holds while an ingest
    replaces a document), one row without a position; in a shuffled order, so that sections are put in order."""
    rows = [("redis.md", "h1", p) for p in range(4)] + [("redis.md", "h2", p) for p in range(3)]
    rows += [("mysql.md", "m1", p) for p in range(5)] + [("mysql.md", "m1", None), ("linux.md", "l1", 0)]
    made = [_row(source, doc_hash, position, i) for i, (source, doc_hash, position) in enumerate(rows)]
    random.Random(7).shuffle(made)
    return made


def _mirror(settings: KBSettings, rows: list[dict[str, Any]]) -> MemoryMirror:
    return MemoryMirror(settings, rows, np.ones((len(rows), 2), dtype=np.float32), [])


@pytest.mark.unit
def test_the_mirror_gives_the_sections_milvus_gives(tmp_path):
    settings = KBSettings(state_dir=tmp_path, dim=2)
    rows = _rows()
    milvus = SectionStore(QueryByList(rows), settings)  # type: ignore[arg-type]
    client = QueryByList(rows)
    mirrored = SectionStore(client, settings).over(_mirror(settings, list(reversed(rows))))  # type: ignore[arg-type]
    assert isinstance(mirrored, MirrorSectionStore)
    keys = [("redis.md", "h2"), ("redis.md", "h1"), ("mysql.md", "m1"), ("linux.md", "l1"), ("absent.md", "a")]
    expected = milvus.sections(keys)
    assert set(expected) == set(keys[:4])  # every version asked for, nothing for a document the rows do not hold
    assert [s.position for s in expected[("redis.md", "h2")]] == [0, 1, 2]
    assert [s.position for s in expected[("mysql.md", "m1")]] == [0, 1, 2, 3, 4]  # the row without a position is none
    for one in ([k] for k in keys):
        assert mirrored.sections(one) == {k: v for k, v in expected.items() if k in one}
    assert mirrored.sections(keys) == expected
    # Read from the mirror: Milvus is asked only for what the mirror does not hold (here the absent document).
    assert client.filters == [in_expr("source", ["absent.md"])] * 2


@pytest.mark.unit
def test_milvus_gives_what_the_mirror_does_not_hold(tmp_path):
    """A candidate of a search only Milvus served may be of a version newer than the mirror: its sections come from
    Milvus; the mirror's documents still come from the mirror."""
    settings = KBSettings(state_dir=tmp_path, dim=2)
    rows = _rows()
    newer = [_row("redis.md", "h3", p, 100 + p) for p in range(2)]
    client = QueryByList(rows + newer)
    store = SectionStore(client, settings).over(_mirror(settings, rows))  # type: ignore[arg-type]
    found = store.sections([("redis.md", "h3"), ("linux.md", "l1")])
    assert [s.content for s in found[("redis.md", "h3")]] == ["redis.md h3 section 0", "redis.md h3 section 1"]
    assert [s.content for s in found[("linux.md", "l1")]] == ["linux.md l1 section 0"]
    assert client.filters == [in_expr("source", ["redis.md"])]


@pytest.mark.unit
def test_one_store_per_mirror_and_milvus_without_one(tmp_path):
    """The one place that decides: no mirror, the Milvus store itself; a mirror, the store reading it, the same for
    every pipeline over that mirror (its cache shared), another for a new mirror."""
    settings = KBSettings(state_dir=tmp_path, dim=2)
    rows = _rows()
    store = SectionStore(QueryByList(rows), settings)  # type: ignore[arg-type]
    first, second = _mirror(settings, rows), _mirror(settings, rows)
    assert store.over(None) is store
    assert store.over(first) is store.over(first) is not store
    assert store.over(second) is not store.over(first)
    assert isinstance(store.over(second), MirrorSectionStore) and store.over(second).mirror is second
