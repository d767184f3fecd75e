"""Pseudo-queries: a section's first sentence without the words naming its document, in a fixed order (the ranking
fit's form); a section's heading and first sentence (the calibration's form)."""

from __future__ import annotations

import pytest

from kb_retrieval.indexing.pseudo_queries import SectionRow, first_sentence, heading_query, pseudo_queries, query_text
from kb_retrieval.retrieval import calibration

pytestmark = pytest.mark.unit


def _row(chunk: str, source: str, crumb: list[str], content: str, position: int = 1) -> SectionRow:
    return SectionRow(chunk, source, crumb[0], crumb, position, content)


def test_first_sentence_skips_code_and_keeps_link_text() -> None:
    text = "```\nrm -rf /\n```\nSee [the retention guide](x.md) for old blocks. More follows."
    assert first_sentence(text) == "See the retention guide for old blocks."


def test_words_naming_the_document_are_left_out() -> None:
    row = _row("c", "disk.md", ["Disk Full", "Mitigation"], "Free the disk by deleting old snapshots first.")
    assert query_text(row) == "Free the by deleting old snapshots first."
    assert query_text(row, with_heading=True).startswith("Mitigation ")


def test_too_short_and_opening_sections_give_none() -> None:
    rows = [
        _row("a", "a.md", ["A title"], "An opening section with plenty of words here."),
        _row("b", "b.md", ["B", "Impact"], "None at all."),
    ]
    assert pseudo_queries(rows) == []


def test_one_query_per_section_from_its_first_chunk_in_a_fixed_order() -> None:
    rows = [
        _row("x2", "x.md", ["X", "Why"], "A later chunk of the same section, long enough.", position=2),
        _row("x1", "x.md", ["X", "Why"], "The first chunk says why this happens at all.", position=1),
        _row("y1", "y.md", ["Y", "How"], "Restart the scraper and check its targets again."),
    ]
    first = pseudo_queries(rows)
    assert sorted(q.chunk_id for q in first) == ["x1", "y1"]
    assert pseudo_queries(list(reversed(rows))) == first
    assert len(pseudo_queries(rows, limit=1)) == 1


def test_the_calibration_form_asks_the_heading_and_is_the_one_calibration_uses() -> None:
    assert heading_query("Guide > Retention", "Keeps **15 days** by default. Set a flag.") == (
        "Retention: Keeps 15 days by default."
    )
    assert heading_query("Guide > Flags", "Usage: run it - then stop.") == "Flags: Usage:"
    assert heading_query("", "x" * 300 + ". Next.") == "x" * 200
    assert calibration.pseudo_query is heading_query


def test_two_chunks_at_a_sections_first_position_give_the_smaller_id_in_any_order() -> None:
    """Two versions of a document both hold a section's first chunk: the smaller chunk id is asked (the one a read of
    the collection gives first), whatever order the rows come in (a scan's, or the memory plan's mirror's)."""
    rows = [
        _row("b-new", "x.md", ["X", "Why"], "The second version says why this happens at all.", position=0),
        _row("a-old", "x.md", ["X", "Why"], "The first version says why this happens at all.", position=0),
    ]
    assert [q.chunk_id for q in pseudo_queries(rows)] == ["a-old"]
    assert pseudo_queries(list(reversed(rows))) == pseudo_queries(rows)
