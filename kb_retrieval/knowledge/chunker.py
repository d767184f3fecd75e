"""Split a document along its Markdown headings into chunks that carry their breadcrumb.

Each heading opens a section; a section's chunk holds the text under that heading up to the next heading. The
breadcrumb is the heading path ``top > section > subsection``, whose top is the H1 opening the document (else its
title): a frontmatter title worded apart from the H1 is not repeated in it, and stays in the chunk's ``title``. A
section longer than ``chunk_tokens`` is split between paragraphs (code blocks kept whole where they fit) into
chunks of at most ``chunk_tokens`` tokens, consecutive chunks sharing about ``overlap`` tokens.

``chunk_tokens`` counts approximate tokens (words and punctuation); the embedding model counts word pieces, and
truncates a text beyond its maximum (256 for the bundled model): code, paths and rare words take several pieces
each, so a chunk of 220 approximate tokens can run past it and lose its end. Given the model's own counter
(:class:`WordPieceLimit`, from :func:`~kb_retrieval.indexing.embeddings.word_piece_limit`), a chunk whose embedded
text (header included) is over the maximum is split again, at a size scaled by how far over it is, until every
part fits: no chunk is embedded cut.

Chunk ids are deterministic: they derive from the source id, the document's content hash, the position and the
chunk's own breadcrumb and text, so re-chunking an unchanged document gives the same ids, and an edited one, or one
chunked with another ``chunk_tokens``/``overlap``, gives new ids (ingest rewrites only chunks whose id is new).

Example:
    >>> from kb_retrieval.knowledge.loader import KbDocument
    >>> doc = KbDocument("redis/oom.md", "Redis OOM", "redis", [], [], [], "# Redis OOM\\n\\n## Fix\\nRaise maxmemory.",
    ...                  "abc")
    >>> [c.breadcrumb_text for c in chunk_document(doc)]
    ['Redis OOM > Fix']
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from kb_retrieval.knowledge.loader import KbDocument
from kb_retrieval.knowledge.text import count_tokens, heading, is_fence, split_to_tokens

BREADCRUMB_SEPARATOR = " > "


@dataclass(frozen=True)
class Chunk:
    """One chunk of a document, in reading order, with the breadcrumb of the section it comes from."""

    chunk_id: str
    source_id: str
    position: int
    breadcrumb: list[str]
    content: str
    title: str = ""

    @property
    def breadcrumb_text(self) -> str:
        return BREADCRUMB_SEPARATOR.join(self.breadcrumb)

    def embedding_text(self) -> str:
        """What is embedded: the title and breadcrumb as a contextual header, then the content.

        The title leads when the breadcrumb does not start with it (a frontmatter title worded apart from the H1):
        the document's name in both wordings helps the search, as it did before the breadcrumb stopped repeating it.
        """
        return embedding_text(self.title, self.breadcrumb, self.content)


def embedding_text(title: str, breadcrumb: list[str], content: str) -> str:
    """The text a chunk of ``content`` under ``breadcrumb`` in a document titled ``title`` is embedded as."""
    header = BREADCRUMB_SEPARATOR.join(breadcrumb)
    if title and breadcrumb and breadcrumb[0] != title:
        header = f"{title}{BREADCRUMB_SEPARATOR}{header}"
    return f"{header}\n\n{content}"


@dataclass(frozen=True)
class WordPieceLimit:
    """The embedding model's maximum input in its own word pieces, and its counter (special tokens included).

    Example:
        >>> limit = WordPieceLimit(max_pieces=7, count=lambda text: len(text.split()) + 2)
        >>> limit.fits("five words are right here"), limit.fits("these six words are too many")
        (True, False)
    """

    max_pieces: int
    count: Callable[[str], int]

    def fits(self, text: str) -> bool:
        return self.count(text) <= self.max_pieces


#: Below this many approximate tokens a part is not split again (a header alone over the maximum cannot fit).
MIN_SPLIT_TOKENS = 8


def chunk_id_for(source_id: str, content_hash: str, position: int, text: str = "") -> str:
    """A chunk's id: stable for the same document content, position and text, new when any changes."""
    return hashlib.sha256(f"{source_id}\x00{content_hash}\x00{position}\x00{text}".encode()).hexdigest()[:32]


def chunk_document(
    doc: KbDocument, chunk_tokens: int = 220, overlap: int = 32, limit: WordPieceLimit | None = None
) -> list[Chunk]:
    """Chunks of one document in reading order; with ``limit``, each one's embedded text within the model's
    maximum word pieces."""
    pieces: list[tuple[list[str], str]] = []
    for breadcrumb, text in _sections(doc):
        for part in _split_section(text, chunk_tokens, overlap):
            if limit is None:
                pieces.append((breadcrumb, part))
            else:
                pieces.extend((breadcrumb, p) for p in _within(limit, doc.title, breadcrumb, part, overlap))
    if not pieces:  # headings only: keep the title so the document stays findable
        pieces.append(([doc.title], doc.title))
    return [
        Chunk(
            chunk_id_for(doc.source_id, doc.content_hash, i, f"{crumb}\x00{content}"),
            doc.source_id,
            i,
            crumb,
            content,
            doc.title,
        )
        for i, (crumb, content) in enumerate(pieces)
    ]


def _within(limit: WordPieceLimit, title: str, breadcrumb: list[str], text: str, overlap: int) -> list[str]:
    """``text`` as it is when its embedded text fits ``limit``, else split again (recursively) into parts that do.

    The new size is the part's approximate tokens scaled by max / counted pieces (less 10%: pieces are not spread
    evenly), so one step usually suffices; the overlap shrinks with it so a small part is not mostly overlap.
    """
    pieces = limit.count(embedding_text(title, breadcrumb, text))
    if pieces <= limit.max_pieces:
        return [text]
    size = count_tokens(text)
    target = int(size * limit.max_pieces / pieces * 0.9)
    if size <= MIN_SPLIT_TOKENS or target < MIN_SPLIT_TOKENS:
        return [text]
    parts = _split_section(text, target, min(overlap, target // 4))
    if len(parts) == 1:  # the split could not cut it (one unit): cut at token boundaries
        parts = split_to_tokens(text, target)
    return [p for part in parts for p in _within(limit, title, breadcrumb, part, overlap)]


def _sections(doc: KbDocument) -> list[tuple[list[str], str]]:
    """(breadcrumb, text) for every heading section with text, plus any text before the first heading.

    The breadcrumb's top is the H1 that opens the document (its first heading), else the title; that H1 is not
    repeated below it, nor is a heading equal to the title. So a frontmatter title worded apart from the H1 gives
    "PostgreSQL replication lag > Symptoms", not "PostgreSQL streaming replication lag > PostgreSQL replication lag
    > Symptoms"; an alert runbook titled "Alertmanager Failed Reload" keeps its H1 "AlertmanagerFailedReload".
    """
    lines = doc.body.splitlines()
    first = _first_heading(lines)
    top = first[1] if first is not None and first[0] == 1 else doc.title
    sections: list[tuple[list[str], str]] = []
    stack: list[tuple[int, str | None]] = []  # (level, heading); None for the H1 that is the top
    buffer: list[str] = []
    in_code = False

    def flush() -> None:
        text = "\n".join(buffer).strip()
        buffer.clear()
        if text:
            crumb = [top] + [h for _, h in stack if h is not None and h not in (top, doc.title)]
            sections.append((crumb, text))

    seen_heading = False
    for line in lines:
        if is_fence(line):
            in_code = not in_code
        elif not in_code and (parsed := heading(line)):
            flush()
            level, text = parsed
            stack = [(lv, h) for lv, h in stack if lv < level]
            stack.append((level, None if level == 1 and not seen_heading else text))
            seen_heading = True
            continue
        buffer.append(line)
    flush()
    return sections


def _first_heading(lines: list[str]) -> tuple[int, str] | None:
    in_code = False
    for line in lines:
        if is_fence(line):
            in_code = not in_code
        elif not in_code and (parsed := heading(line)):
            return parsed
    return None


def _blocks(text: str) -> list[str]:
    """Paragraphs and whole fenced code blocks."""
    blocks: list[str] = []
    current: list[str] = []
    in_code = False
    for line in text.splitlines():
        if is_fence(line):
            if not in_code and current:
                blocks.append("\n".join(current))
                current = []
            current.append(line)
            in_code = not in_code
            if not in_code:
                blocks.append("\n".join(current))
                current = []
            continue
        if not in_code and not line.strip():
            if current:
                blocks.append("\n".join(current))
                current = []
            continue
        current.append(line)
    if current:
        blocks.append("\n".join(current))
    return blocks


def _split_section(text: str, chunk_tokens: int, overlap: int) -> list[str]:
    if count_tokens(text) <= chunk_tokens:
        return [text]
    parts: list[str] = []
    current: list[str] = []
    size = 0
    for block in _blocks(text):
        block_size = count_tokens(block)
        if block_size > chunk_tokens:
            if current:
                parts.append("\n\n".join(current))
                current, size = [], 0
            parts.extend(_split_long_block(block, chunk_tokens, overlap))
            continue
        if current and size + block_size > chunk_tokens:
            parts.append("\n\n".join(current))
            # Overlap carries prose over; a trailing code block is not cut into a fragment.
            tail = "" if is_fence(current[-1].lstrip().split("\n", 1)[0]) else _tail(current[-1], overlap)
            current, size = ([tail], count_tokens(tail)) if tail else ([], 0)
            if size + block_size > chunk_tokens:
                current, size = [], 0
        current.append(block)
        size += block_size
    if current:
        parts.append("\n\n".join(current))
    return parts


def _split_long_block(block: str, chunk_tokens: int, overlap: int) -> list[str]:
    """Split by lines (code) or words (prose) into windows of at most ``chunk_tokens`` with overlap."""
    separator = "\n" if "\n" in block.strip() else " "
    units: list[str] = []
    for unit in block.split(separator):
        # A single line or word over the limit is cut at token boundaries instead of being truncated.
        units.extend(split_to_tokens(unit, chunk_tokens) if count_tokens(unit) > chunk_tokens else [unit])
    parts: list[str] = []
    start, done = 0, 0  # units[:done] are already in a part
    while start < len(units):
        size, end = 0, start
        while end < len(units) and size + count_tokens(units[end]) <= chunk_tokens:
            size += count_tokens(units[end])
            end += 1
        if end <= done:  # the overlap left no room for a new unit: a part of overlap only would repeat text
            start = done
            continue
        parts.append(separator.join(units[start:end]))
        done = end
        if end >= len(units):
            break
        back, kept = end, 0
        while back > start + 1 and kept + count_tokens(units[back - 1]) <= overlap:
            back -= 1
            kept += count_tokens(units[back])
        start = back
    return parts


def _tail(text: str, overlap: int) -> str:
    """The last ``overlap`` tokens of ``text``, whole words only."""
    if overlap <= 0:
        return ""
    words = text.split()
    kept: list[str] = []
    size = 0
    for word in reversed(words):
        size += count_tokens(word)
        if size > overlap:
            break
        kept.append(word)
    return " ".join(reversed(kept))
