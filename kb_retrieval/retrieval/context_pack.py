"""Stage 5: pack evidence blocks into a token budget for the agent.

Each included block is a header (source, title, breadcrumb, hit reasons: never truncated) and its content
(truncated to what the budget leaves). A block whose header no longer fits is omitted whole. The summary lists the
included, truncated and omitted sources. Tokens are counted with the same approximate counter as the chunker.
A text's count is the sum of its parts' counts wherever whitespace joins them (no token spans whitespace), so a
document's renderings are counted from its sections' counts, and a section's text, the same on every lookup, is
counted once per process (:func:`section_tokens`), not again for every rendering tried.

A block that carries its document's sections (small-to-big) is packed by rank: the first document whole when it
fits, else its matched sections and then its other sections in document order as they fit; each later document its
matched sections only. Matched sections are marked. ``sections_left_out`` counts the unmatched sections left out.

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

MIN_CONTENT_TOKENS = 12  # the default of Settings.scoring.min_content_tokens
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


def _document_content(block: EvidenceBlock, rank: int, room: int) -> tuple[str, int, int]:
    """The block's text for ``room`` tokens, its token count, and how many unmatched sections it leaves out."""
    sections = block.sections
    tokens = [section_tokens(s) for s in sections]
    if rank == 0 and sum(tokens) <= room:
        return render_sections(sections), sum(tokens), 0
    chosen = [i for i, s in enumerate(sections) if s.matched]
    used = sum(tokens[i] for i in chosen)
    if rank == 0:  # the top document: its other sections in document order while they fit
        for i, section in enumerate(sections):
            if not section.matched and used + tokens[i] <= room:
                chosen.append(i)
                used += tokens[i]
    picked = sorted((sections[i] for i in chosen), key=lambda x: x.position)
    return render_sections(picked), used, sum(1 for s in sections if not s.matched and s not in picked)


def block_header(index: int, block: EvidenceBlock | PackedBlock) -> str:
    lines = [f"[{index}] source: {block.source}"]
    if block.title:
        lines.append(f"title: {block.title}")
    if block.breadcrumb:
        lines.append(f"breadcrumb: {block.breadcrumb}")
    if block.hit_reasons:
        lines.append(f"hit reasons: {', '.join(block.hit_reasons)}")
    return "\n".join(lines) + "\n"


dispatcher = get_dispatcher(__name__)


@dispatcher.span
def pack_context(
    blocks: list[EvidenceBlock], budget_tokens: int, min_content_tokens: int = MIN_CONTENT_TOKENS
) -> ContextPack:
    packed: list[PackedBlock] = []
    texts: list[str] = []
    used = 0
    omitted: list[str] = []
    truncated: list[str] = []
    sections_left_out: dict[str, int] = {}
    mark_tokens = count_tokens(TRUNCATION_MARK)
    for block in blocks:
        header = block_header(len(packed) + 1, block)
        header_tokens = count_tokens(header)
        room = budget_tokens - used - header_tokens
        if room < min_content_tokens:
            omitted.append(block.source)
            continue
        content = block.content
        if block.sections:
            content, content_tokens, left_out = _document_content(block, len(packed), room)
            if left_out:
                sections_left_out[block.source] = left_out
        else:
            content_tokens = _text_tokens(content)
        is_cut = content_tokens > room
        if is_cut:
            content = truncate_to_tokens(content, room - mark_tokens) + TRUNCATION_MARK
            content_tokens = count_tokens(content)
            truncated.append(block.source)
        text = header + content
        used += header_tokens + content_tokens  # the header ends with a line break: no token spans the two
        texts.append(text)
        packed.append(
            PackedBlock(
                source=block.source,
                title=block.title,
                breadcrumb=block.breadcrumb,
                hit_reasons=block.hit_reasons,
                content=content,
                truncated=is_cut,
            )
        )
    return ContextPack(
        blocks=packed,
        text="\n\n".join(texts),
        summary=ContextPackSummary(
            budget_tokens=budget_tokens,
            used_tokens=used,
            included_sources=[b.source for b in packed],
            truncated_sources=truncated,
            omitted_sources=omitted,
            sections_left_out=sections_left_out,
        ),
    )
