"""What must hold for any context pack, whatever the blocks and budget: one check, shared by the packer's tests
and the hostile-input property tests."""

from __future__ import annotations

from kb_retrieval.knowledge.text import count_tokens
from kb_retrieval.models import ContextPack, EvidenceBlock
from kb_retrieval.retrieval.context_pack import TRUNCATION_MARK, block_header


def check_invariants(blocks: list[EvidenceBlock], pack: ContextPack, budget: int) -> None:
    """Budget held and counted; every block included or omitted, in order; metadata whole; content cut only with
    the truncation mark; the text is exactly the headers and contents."""
    summary = pack.summary
    assert summary.budget_tokens == budget
    assert summary.used_tokens <= budget
    assert count_tokens(pack.text) <= budget
    assert count_tokens(pack.text) == summary.used_tokens
    # Every input block is either included or omitted, in order.
    assert sorted(summary.included_sources + summary.omitted_sources) == sorted(b.source for b in blocks)
    assert summary.included_sources == [p.source for p in pack.blocks]
    assert summary.truncated_sources == [p.source for p in pack.blocks if p.truncated]
    by_source = {b.source: b for b in blocks}
    for index, packed in enumerate(pack.blocks, start=1):
        original = by_source[packed.source]
        header = block_header(index, original)
        assert header + packed.content in pack.text  # the header whole, followed by its content
        assert (packed.title, packed.breadcrumb, packed.hit_reasons) == (
            original.title,
            original.breadcrumb,
            original.hit_reasons,
        )
        if packed.truncated:
            assert packed.content.endswith(TRUNCATION_MARK)
            assert original.content.startswith(packed.content.removesuffix(TRUNCATION_MARK))
            assert packed.content != original.content
        else:
            assert packed.content == original.content
    assert pack.text == "\n\n".join(block_header(i, p) + p.content for i, p in enumerate(pack.blocks, start=1))
