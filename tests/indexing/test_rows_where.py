"""Reads of the rows a filter selects past Milvus' query window (a query returns at most the window, silently cut):
the rows, a document's sections and its text vector are whole however many rows the documents hold. On Milvus
Lite, with the window made small (a client whose queries return at most 4 rows, whatever limit is asked)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing import doc_vectors
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.indexing.milvus import connect, iter_rows, rows, rows_where
from kb_retrieval.knowledge.loader import load_knowledge_base
from kb_retrieval.retrieval.expand import SectionStore
from kb_retrieval.retrieval.filters import in_expr
from tests.support.kb import write_kb

WINDOW = 4


class Windowed:
    """A client whose queries return at most ``window`` rows (Milvus' query window, small); the rest is the client's."""

    def __init__(self, client: Any, window: int) -> None:
        self.client = client
        self.window = window

    def query(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return list(self.client.query(*args, **kwargs))[: self.window]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def _page(sections: int, thing: str) -> str:
    parts = [f"## Part {i}\n\nStep {i} restarts the {thing} pool and checks the queue depth." for i in range(sections)]
    return "# Long page\n\n" + "\n\n".join(parts)


@pytest.fixture
def ingested(tmp_path, embed_model, monkeypatch) -> tuple[KBSettings, Any, Any, list[Any]]:
    """Two documents of more chunks than the window, ingested: the settings, the real client, a windowed one over
    it, and the documents."""
    settings = KBSettings(state_dir=tmp_path / "state")
    kb = write_kb(tmp_path / "kb", {"long.md": _page(7, "worker"), "other.md": _page(5, "cache")})
    ingest([kb], settings, embed_model=embed_model)
    client = connect(settings)
    monkeypatch.setattr(rows, "QUERY_WINDOW", WINDOW)
    return settings, client, Windowed(client, WINDOW), load_knowledge_base(kb).documents


def test_every_row_a_filter_selects_past_the_window(ingested):
    settings, client, windowed, _ = ingested
    fields = settings.schema_fields
    expr = in_expr(fields.source_field, ["long.md", "other.md"])
    every = {r[fields.id_field] for r in iter_rows(client, settings, [fields.id_field, fields.source_field])}
    assert len(every) > 2 * WINDOW
    got = rows_where(windowed, settings, expr, [fields.id_field, fields.source_field], consistency_level="Strong")
    assert sorted(r[fields.id_field] for r in got) == sorted(every)
    one = rows_where(windowed, settings, in_expr(fields.source_field, ["other.md"]), [fields.source_field])
    assert len(one) > WINDOW and {r[fields.source_field] for r in one} == {"other.md"}


def test_a_documents_sections_are_whole_past_the_window(ingested):
    settings, client, windowed, docs = ingested
    doc = next(d for d in docs if d.source_id == "long.md")
    key = ("long.md", doc.content_hash)
    whole = SectionStore(client, settings).sections([key])[key]
    assert len(whole) > WINDOW
    assert SectionStore(windowed, settings).sections([key])[key] == whole


def test_a_documents_text_vector_is_the_mean_of_all_its_chunks_past_the_window(ingested):
    settings, client, windowed, docs = ingested
    whole = doc_vectors._chunk_means(client, settings, docs)
    got = doc_vectors._chunk_means(windowed, settings, docs)
    assert set(got) == set(whole) == {"long.md", "other.md"}
    for source, vector in whole.items():
        assert np.allclose(got[source], vector, atol=1e-6)
