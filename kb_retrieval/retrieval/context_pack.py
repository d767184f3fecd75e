"""Stage 5: pack evidence blocks into a token budget for the agent.

Each included block is a header (source, title, breadcrumb, hit reasons: never truncated) and its content
(truncated to what the budget leaves). A block whose header no longer fits is omitted whole. The summary lists the
included, truncated and omitted sources. Tokens are counted with the same approximate counter as the chunker.

Example:
    >>> pack = pack_context(blocks, budget_tokens=800)  # doctest: +SKIP
    >>> pack.summary.used_tokens <= 800  # doctest: +SKIP
    True
"""

from __future__ import annotations

from llama_index.core.instrumentation import get_dispatcher

from kb_retrieval.knowledge.text import count_tokens, truncate_to_tokens
from kb_retrieval.models import ContextPack, ContextPackSummary, EvidenceBlock, PackedBlock

MIN_CONTENT_TOKENS = 12  # the default of Settings.scoring.min_content_tokens
TRUNCATION_MARK = " [...]"


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
    mark_tokens = count_tokens(TRUNCATION_MARK)
    for block in blocks:
        header = block_header(len(packed) + 1, block)
        header_tokens = count_tokens(header)
        room = budget_tokens - used - header_tokens
        if room < min_content_tokens:
            omitted.append(block.source)
            continue
        content = block.content
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
        ),
    )
