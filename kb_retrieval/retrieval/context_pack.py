"""Stage 5: pack evidence blocks into a token budget for the agent.

Each included block is a header (source, title, breadcrumb, hit reasons: never truncated) and its content
(truncated to what the budget leaves). A block whose header no longer fits is omitted whole. The summary lists the
included, truncated and omitted sources. Tokens are counted with the same approximate counter as the chunker.

A block that carries its document's sections (small-to-big) is packed by rank: the first document whole when it
fits, else its matched sections and then its other sections in document order as they fit; each later document its
matched sections only. Matched sections are marked. ``sections_left_out`` counts the unmatched sections left out.

Example:
    >>> pack = pack_context(blocks, budget_tokens=800)  # doctest: +SKIP
    >>> pack.summary.used_tokens <= 800  # doctest: +SKIP
    True
"""

from __future__ import annotations

from llama_index.core.instrumentation import get_dispatcher

from kb_retrieval.knowledge.text import count_tokens, truncate_to_tokens
from kb_retrieval.models import ContextPack, ContextPackSummary, DocumentSection, EvidenceBlock, PackedBlock

MIN_CONTENT_TOKENS = 12  # the default of Settings.scoring.min_content_tokens
TRUNCATION_MARK = " [...]"
MATCHED_MARK = " (matched)"


def render_sections(sections: list[DocumentSection]) -> str:
    """Sections as text in the order given: a heading line (the breadcrumb, marked when matched), then the text."""
    parts = []
    for section in sections:
        heading = f"### {section.breadcrumb or '(untitled section)'}{MATCHED_MARK if section.matched else ''}"
        parts.append(f"{heading}\n{section.content}")
    return "\n\n".join(parts)


def _document_content(block: EvidenceBlock, rank: int, room: int) -> tuple[str, int]:
    """The block's text for ``room`` tokens, and how many unmatched sections it leaves out."""
    sections = block.sections
    whole = render_sections(sections)
    if rank == 0 and count_tokens(whole) <= room:
        return whole, 0
    chosen = [s for s in sections if s.matched]
    if rank == 0:  # the top document: its other sections in document order while they fit
        for section in sections:
            if not section.matched:
                trial = sorted([*chosen, section], key=lambda x: x.position)
                if count_tokens(render_sections(trial)) <= room:
                    chosen = trial
    chosen.sort(key=lambda x: x.position)
    return render_sections(chosen), sum(1 for s in sections if not s.matched and s not in chosen)


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
            content, left_out = _document_content(block, len(packed), room)
            if left_out:
                sections_left_out[block.source] = left_out
        is_cut = count_tokens(content) > room
        if is_cut:
            content = truncate_to_tokens(content, room - mark_tokens) + TRUNCATION_MARK
            truncated.append(block.source)
        text = header + content
        used += count_tokens(text)
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
