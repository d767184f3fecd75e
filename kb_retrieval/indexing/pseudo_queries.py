"""Questions a knowledge base asks of itself, made from its own sections: one module, two forms.

A section's heading and its first sentence say what the section is about, in the documents' own words. Two stages
ask such questions, and each needs its own form:

- **The ranking fit** (:func:`pseudo_queries`, :func:`query_text`; used by :mod:`kb_retrieval.indexing.rank_teach`):
  the answer is the section's own document. A query made of a section's text matches that section verbatim, which
  no real question does, so the sentence's words that the heading or the document's title hold are left out, and
  the heading is not asked (``with_heading`` puts it back, to measure the difference): what is left is the
  section's claim in the document's own vocabulary, without the words that would name the document. Such
  pseudo-queries teach the document ranking how to weigh a document's identity against its best section
  (:mod:`kb_retrieval.retrieval.rank_fit`), with no golden set.
- **The calibration** (:func:`heading_query`; used by :mod:`kb_retrieval.retrieval.calibration`): the question is
  searched *outside* its own document, to measure what a question in the knowledge base's vocabulary reaches in a
  document that does not answer it; there the heading is the topic and is asked ("Retention: Prometheus keeps 15
  days by default.").

Sections are taken in a fixed order (a hash of the document and heading), so the same knowledge base always gives
the same queries.

Example:
    >>> crumb = ["Disk full", "Mitigation"]
    >>> rows = [SectionRow("c1", "a.md", "Disk full", crumb, 0, "Delete old snapshots first. Then")]
    >>> [(q.source, q.text) for q in pseudo_queries(rows)]
    [('a.md', 'Delete old snapshots first.')]
    >>> heading_query("Disk full > Mitigation", "Delete **old** snapshots first. Then")
    'Mitigation: Delete old snapshots first.'
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from kb_retrieval.knowledge.chunker import BREADCRUMB_SEPARATOR

#: Words a pseudo-query keeps at least (fewer: the section is skipped; a bare list item or a code line says little).
MIN_WORDS = 4
#: Words a pseudo-query keeps at most (the start of a long sentence).
MAX_WORDS = 30

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_'-]*")
_CODE_FENCE = re.compile(r"```.*?(```|$)", re.S)
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)|\[([^\]]*)\]\[[^\]]*\]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
_MARKUP = re.compile(r"[`*_#>|<]+|^\s*[-+]\s+", re.M)
#: The calibration form's markup and sentence end (a colon ends its sentence too).
_HEADING_QUERY_MARKUP = re.compile(r"[#`*|>_\[\]]+|\s+-\s+|^\s*-\s+", re.MULTILINE)
_HEADING_QUERY_END = re.compile(r"(?<=[.!?:])\s")
#: Characters of the first sentence the calibration form keeps at most.
HEADING_QUERY_CHARS = 200


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


def heading_query(breadcrumb: str, content: str) -> str:
    """The calibration form: a section's heading (the breadcrumb's last part), a colon, and the first sentence of its
    content without Markdown markup (cut at :data:`HEADING_QUERY_CHARS`); the sentence alone without a heading.

    Example:
        >>> heading_query("Guide > Retention", "Prometheus keeps **15 days** by default. Change it with a flag.")
        'Retention: Prometheus keeps 15 days by default.'
    """
    heading = breadcrumb.split(BREADCRUMB_SEPARATOR)[-1].strip()
    text = " ".join(_HEADING_QUERY_MARKUP.sub(" ", content).split())
    sentence = _HEADING_QUERY_END.split(text, maxsplit=1)[0][:HEADING_QUERY_CHARS]
    return f"{heading}: {sentence}" if heading else sentence


def _order(row: SectionRow) -> str:
    return hashlib.sha1(f"{row.source}\n{' > '.join(row.breadcrumb)}".encode()).hexdigest()


def pseudo_queries(rows: Iterable[SectionRow], *, limit: int = 200, with_heading: bool = False) -> list[PseudoQuery]:
    """At most ``limit`` pseudo-queries, one per section (its first chunk), in a fixed order of the sections.

    Sections under the document's own title only (its opening) are skipped: the document's summary vector is made
    of them, so they would teach the summary's weight, not a question's. The same queries come of the rows in any
    order: of two chunks at a section's first position (two versions of a document), the smaller chunk id is taken,
    the one a read of the collection gives first (in primary-key order)."""
    first: dict[tuple[str, tuple[str, ...]], SectionRow] = {}
    for row in rows:
        if len(row.breadcrumb) < 2:
            continue
        key = (row.source, tuple(row.breadcrumb))
        if key not in first or (row.position, row.chunk_id) < (first[key].position, first[key].chunk_id):
            first[key] = row
    out: list[PseudoQuery] = []
    for row in sorted(first.values(), key=_order):
        if text := query_text(row, with_heading=with_heading):
            out.append(PseudoQuery(source=row.source, chunk_id=row.chunk_id, text=text, heading=row.breadcrumb[-1]))
            if len(out) >= limit:
                break
    return out
