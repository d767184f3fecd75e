"""Questions a knowledge base asks of itself: one pseudo-query per section, its answer the section's own document.

A section's heading and its first sentence say what the section is about, in the documents' own words; asked as a
query, the right answer is the document the section belongs to. Such pseudo-queries teach the document ranking how
to weigh a document's identity (its title, summary and text vectors) against its best section, on the knowledge base
at hand (:mod:`kb_retrieval.retrieval.rank_fit`), with no golden set.

A query made of a section's text matches that section verbatim, which no real question does. So the sentence's words
that the heading or the document's title hold are left out of it, and the heading is not asked (``with_heading``
puts it back, to measure the difference): what is left is the section's claim in the document's own vocabulary,
without the words that would name the document.

Sections are taken in a fixed order (a hash of the document and heading), so the same knowledge base always gives
the same queries.

Example:
    >>> crumb = ["Disk full", "Mitigation"]
    >>> rows = [SectionRow("c1", "a.md", "Disk full", crumb, 0, "Delete old snapshots first. Then")]
    >>> [(q.source, q.text) for q in pseudo_queries(rows)]
    [('a.md', 'Delete old snapshots first.')]
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

#: Words a pseudo-query keeps at least (fewer: the section is skipped; a bare list item or a code line says little).
MIN_WORDS = 4
#: Words a pseudo-query keeps at most (the start of a long sentence).
MAX_WORDS = 30

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_'-]*")
_CODE_FENCE = re.compile(r"```.*?(```|$)", re.S)
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)|\[([^\]]*)\]\[[^\]]*\]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
_MARKUP = re.compile(r"[`*_#>|<]+|^\s*[-+]\s+", re.M)


@dataclass(frozen=True)
class SectionRow:
    """One chunk as stored: its id, its document, the document's title, its breadcrumb (headings from the top), its
    position in the document and its text."""

    chunk_id: str
    source: str
    title: str
    breadcrumb: list[str]
    position: int
    content: str


@dataclass(frozen=True)
class PseudoQuery:
    """A query the knowledge base asks of itself, the document that answers it and the chunk it was taken from."""

    source: str
    chunk_id: str
    text: str
    heading: str


def first_sentence(content: str) -> str:
    """The first sentence of a section's prose: code blocks, link targets and Markdown markup left out."""
    text = _CODE_FENCE.sub(" ", content)
    text = _LINK.sub(lambda m: m.group(1) or m.group(2) or "", text)
    text = _MARKUP.sub(" ", text)
    for part in _SENTENCE_END.split(text):
        part = " ".join(part.split())
        if len(_WORD.findall(part)) >= MIN_WORDS:
            return part
    return ""


def _words(text: str) -> set[str]:
    return {w.casefold() for w in _WORD.findall(text)}


def query_text(row: SectionRow, *, with_heading: bool = False) -> str:
    """The pseudo-query of one section's first chunk ("" when too little is left; see the module doc)."""
    sentence = first_sentence(row.content)
    heading = row.breadcrumb[-1] if row.breadcrumb else ""
    naming = _words(heading) | _words(row.title) | _words(row.breadcrumb[0] if row.breadcrumb else "")
    kept = [w for w in sentence.split() if not (_words(w) and _words(w) <= naming)]
    if len(_WORD.findall(" ".join(kept))) < MIN_WORDS:
        return ""
    text = " ".join(kept[:MAX_WORDS])
    return f"{heading} {text}" if with_heading and heading else text


def _order(row: SectionRow) -> str:
    return hashlib.sha1(f"{row.source}\n{' > '.join(row.breadcrumb)}".encode()).hexdigest()


def pseudo_queries(rows: Iterable[SectionRow], *, limit: int = 200, with_heading: bool = False) -> list[PseudoQuery]:
    """At most ``limit`` pseudo-queries, one per section (its first chunk), in a fixed order of the sections.

    Sections under the document's own title only (its opening) are skipped: the document's summary vector is made
    of them, so they would teach the summary's weight, not a question's."""
    first: dict[tuple[str, tuple[str, ...]], SectionRow] = {}
    for row in rows:
        if len(row.breadcrumb) < 2:
            continue
        key = (row.source, tuple(row.breadcrumb))
        if key not in first or row.position < first[key].position:
            first[key] = row
    out: list[PseudoQuery] = []
    for row in sorted(first.values(), key=_order):
        if text := query_text(row, with_heading=with_heading):
            out.append(PseudoQuery(source=row.source, chunk_id=row.chunk_id, text=text, heading=row.breadcrumb[-1]))
            if len(out) >= limit:
                break
    return out
