"""Stage 5: pack evidence blocks into a token budget for the agent.

Each included block is a header (source, title, breadcrumb, hit reasons: never truncated) and its content
(truncated to what the budget leaves). A block whose header no longer fits is omitted whole. The summary lists the
included, truncated and omitted sources. Tokens are counted with the same approximate counter as the chunker.
A text's count is the sum of its parts' counts wherever whitespace joins them (no token spans whitespace), so a
document's renderings are counted from its sections' counts, and a section's text, the same on every lookup, is
counted once per process (:func:`section_tokens`), not again for every rendering tried.

A block that carries its document's sections (small-to-big) is packed in three passes, so that the budget reaches
the matching sections of every top document before it gives any one document's context:

1. in rank order, each block its header and its best matched section (a plain block: its content), cut to the room
   left when it does not fit; the first document also its other matched sections, best first, within half the
   budget;
2. the first document's other sections, matched or not, in document order, as they fit whole (a short runbook comes
   back whole: its diagnosis and mitigation beside the section that matched);
3. in rank order, the other documents' further matched sections, as they fit whole.

Each document's chosen sections are rendered in document order, matched ones marked. ``sections_left_out`` counts
the unmatched sections the budget left out, ``matched_left_out`` the matched ones (the budget, not the question,
cut those).

Example:
    >>> pack = pack_context(blocks, budget_tokens=800)  # doctest: +SKIP
    >>> pack.summary.used_tokens <= 800  # doctest: +SKIP
    True
"""

from __future__ import annotations

from functools import lru_cache

from llama_index.core.instrumentation import get_dispatcher

from kb_retrieval.knowledge.text import count_tokens, truncate_to_tokens
from kb_retrieval.models import ContextPack, ContextPackSummary, DocumentSection, EvidenceBlock, PackedBlock
from kb_retrieval.retrieval.events import span

MIN_CONTENT_TOKENS = 12  # the default of KBSettings.scoring.min_content_tokens
TRUNCATION_MARK = " [...]"
MATCHED_MARK = " (matched)"


def _heading(section: DocumentSection) -> str:
    return f"### {section.breadcrumb or '(untitled section)'}{MATCHED_MARK if section.matched else ''}"


def render_sections(sections: list[DocumentSection]) -> str:
    """Sections as text in the order given: a heading line (the breadcrumb, marked when matched), then the text."""
    return "\n\n".join(f"{_heading(section)}\n{section.content}" for section in sections)


#: Token counts of texts met again and again (section and chunk contents, headings), by text; bounded.
_text_tokens = lru_cache(maxsize=8192)(count_tokens)


def section_tokens(section: DocumentSection) -> int:
    """The tokens of ``section`` as :func:`render_sections` renders it: its heading's and its content's (the line
    break between them, like the blank line between sections, is no token).

    Example:
        >>> s = DocumentSection(breadcrumb="Redis > Fix", content="Raise maxmemory.", position=0)
        >>> section_tokens(s) == count_tokens(render_sections([s]))
        True
    """
    return _text_tokens(_heading(section)) + _text_tokens(section.content)


def _match_order(sections: list[DocumentSection]) -> list[int]:
    """Indices of the matched sections, best first (retrieval's order; document order without one)."""
    matched = [i for i, s in enumerate(sections) if s.matched]
    return sorted(matched, key=lambda i: (sections[i].match_rank is None, sections[i].match_rank or 0, i))


class _Entry:
    """One included block while the pack is planned: its header, and its chosen sections (or plain content)."""

    def __init__(self, block: EvidenceBlock, header: str, header_tokens: int) -> None:
        self.block = block
        self.header = header
        self.header_tokens = header_tokens
        self.chosen: list[int] = []
        self.content_tokens = 0
        self.cut_to: int | None = None  # tokens of content the budget left it, when it was truncated

    def add(self, index: int, tokens: int) -> None:
        self.chosen.append(index)
        self.content_tokens += tokens

    def content(self) -> str:
        sections = self.block.sections
        if not sections:
            return self.block.content
        return render_sections([sections[i] for i in sorted(self.chosen, key=lambda i: sections[i].position)])


def block_header(index: int, block: EvidenceBlock | PackedBlock) -> str:
    """The header lines of block ``index`` in the pack: its source, title, breadcrumb and hit reasons."""
    lines = [f"[{index}] source: {block.source}"]
    if block.title:
        lines.append(f"title: {block.title}")
    if block.breadcrumb:
        lines.append(f"breadcrumb: {block.breadcrumb}")
    if block.hit_reasons:
        lines.append(f"hit reasons: {', '.join(block.hit_reasons)}")
    return "\n".join(lines) + "\n"


dispatcher = get_dispatcher(__name__)


@span(dispatcher)
def pack_context(
    blocks: list[EvidenceBlock], budget_tokens: int, min_content_tokens: int = MIN_CONTENT_TOKENS
) -> ContextPack:
    """The evidence blocks packed into ``budget_tokens``: every block's header and best section first, then more."""
    entries: list[_Entry] = []
    omitted: list[str] = []
    used = 0
    for block in blocks:  # pass 1: every block's header and best section (or content)
        header = block_header(len(entries) + 1, block)
        header_tokens = count_tokens(header)
        room = budget_tokens - used - header_tokens
        if room < min_content_tokens:
            omitted.append(block.source)
            continue
        entry = _Entry(block, header, header_tokens)
        if block.sections:
            order = _match_order(block.sections) or [0]
            entry.add(order[0], section_tokens(block.sections[order[0]]))
            if not entries:  # the first document: its matched sections, best first, within half the budget
                for i in order[1:]:
                    tokens = section_tokens(block.sections[i])
                    if used + header_tokens + entry.content_tokens + tokens <= budget_tokens // 2:
                        entry.add(i, tokens)
        else:
            entry.content_tokens = _text_tokens(block.content)
        if entry.content_tokens > room:
            entry.cut_to = room
        used += header_tokens + min(entry.content_tokens, room)
        entries.append(entry)

    def fill(entry: _Entry, indices: list[int]) -> None:
        nonlocal used
        for i in indices:
            tokens = section_tokens(entry.block.sections[i])
            if i not in entry.chosen and used + tokens <= budget_tokens:
                entry.add(i, tokens)
                used += tokens

    whole = [e for e in entries if e.block.sections and e.cut_to is None]
    if whole and whole[0] is entries[0]:  # pass 2: the first document's context
        sections = entries[0].block.sections
        fill(entries[0], [i for i in range(len(sections)) if sections[i].matched] + list(range(len(sections))))
    for entry in whole:  # pass 3: the others' further matched sections
        fill(entry, _match_order(entry.block.sections))
    return _render(entries, omitted, budget_tokens, used)


def _render(entries: list[_Entry], omitted: list[str], budget_tokens: int, used: int) -> ContextPack:
    packed: list[PackedBlock] = []
    texts: list[str] = []
    truncated: list[str] = []
    sections_left_out: dict[str, int] = {}
    matched_left_out: dict[str, int] = {}
    mark_tokens = count_tokens(TRUNCATION_MARK)
    counted = 0  # the text's tokens, block by block (see below)
    for entry in entries:
        block, content = entry.block, entry.content()
        content_tokens = entry.content_tokens
        if entry.cut_to is not None:
            content = truncate_to_tokens(content, entry.cut_to - mark_tokens) + TRUNCATION_MARK
            content_tokens = count_tokens(content)
            truncated.append(block.source)
        counted += entry.header_tokens + content_tokens
        left = [s for i, s in enumerate(block.sections) if i not in entry.chosen]
        if unmatched := sum(1 for s in left if not s.matched):
            sections_left_out[block.source] = unmatched
        if matched := sum(1 for s in left if s.matched):
            matched_left_out[block.source] = matched
        texts.append(entry.header + content)
        packed.append(
            PackedBlock(
                source=block.source,
                title=block.title,
                breadcrumb=block.breadcrumb,
                hit_reasons=block.hit_reasons,
                content=content,
                truncated=entry.cut_to is not None,
            )
        )
    text = "\n\n".join(texts)
    if truncated:
        # A cut content is counted again: the mark and the cut are not a sum of parts. The rest of the text need not
        # be: no token spans whitespace, and every header ends in a line break and the blocks are joined by blank
        # lines, so the text's count is the sum of its headers' and contents' (count_tokens(text), without reading
        # the whole pack again).
        used = counted
    return ContextPack(
        blocks=packed,
        text=text,
        summary=ContextPackSummary(
            budget_tokens=budget_tokens,
            used_tokens=used,
            included_sources=[b.source for b in packed],
            truncated_sources=truncated,
            omitted_sources=omitted,
            sections_left_out=sections_left_out,
            matched_left_out=matched_left_out,
        ),
    )
