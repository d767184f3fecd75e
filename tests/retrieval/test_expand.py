"""Small-to-big: evidence blocks are documents (sections in order, matched marked), packed by rank."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kb_retrieval.knowledge.text import count_tokens
from kb_retrieval.models import DocumentSection, EvidenceBlock
from kb_retrieval.retrieval.context_pack import MATCHED_MARK, pack_context, render_sections, section_tokens

ALERT = "KubeContainerOOMKilled namespace=payments pod=api-1"


def _block(source: str, sections: list[DocumentSection]) -> EvidenceBlock:
    return EvidenceBlock(
        source=source,
        retrieval_layer="L1",
        content=render_sections(sections),
        sections=sections,
        score=0.9,
        similarity=0.8,
    )


def _sections(n: int, matched: set[int], words: int = 40) -> list[DocumentSection]:
    return [
        DocumentSection(breadcrumb=f"Doc > S{i}", content=" ".join([f"w{i}"] * words), position=i, matched=i in matched)
        for i in range(n)
    ]


def test_top_document_whole_when_it_fits_others_matched_sections_only():
    top = _block("a.md", _sections(3, {1}))
    second = _block("b.md", _sections(4, {2}))
    pack = pack_context([top, second], budget_tokens=1000)
    first, other = pack.blocks
    assert all(f"S{i}" in first.content for i in range(3))  # whole, in document order
    assert first.content.index("S0") < first.content.index("S1") < first.content.index("S2")
    assert f"Doc > S1{MATCHED_MARK}" in first.content and f"Doc > S0{MATCHED_MARK}" not in first.content
    assert "S2" in other.content and "S0" not in other.content  # the next document: its best sections
    assert pack.summary.sections_left_out == {"b.md": 3}
    assert pack.summary.used_tokens <= 1000


def test_a_long_top_document_gives_its_matched_sections_then_what_fits():
    long_doc = _block("long.md", _sections(12, {7}, words=60))
    budget = 300
    pack = pack_context([long_doc], budget_tokens=budget)
    content = pack.blocks[0].content
    assert f"Doc > S7{MATCHED_MARK}" in content  # the matched section is never dropped for the others
    assert 0 < pack.summary.sections_left_out["long.md"] < 11
    assert pack.summary.used_tokens <= budget and count_tokens(pack.text) <= budget


def test_a_long_first_document_leaves_room_for_the_others_best_sections():
    """The budget reaches every top document's best section before one document's context (issue 37, item 3)."""
    long_doc = _block("long.md", _sections(12, {1, 3, 5, 7, 9, 11}, words=60))
    others = [_block(f"o{i}.md", _sections(4, {i}, words=60)) for i in range(3)]
    budget = 600
    pack = pack_context([long_doc, *others], budget_tokens=budget)
    assert pack.summary.included_sources == ["long.md", "o0.md", "o1.md", "o2.md"]
    assert pack.summary.truncated_sources == [] and pack.summary.omitted_sources == []
    for i, block in enumerate(pack.blocks[1:]):
        assert f"Doc > S{i}{MATCHED_MARK}" in block.content  # each other document's matched section
    assert f"Doc > S1{MATCHED_MARK}" in pack.blocks[0].content
    assert count_tokens(pack.text) == pack.summary.used_tokens <= budget
    assert pack.summary.matched_left_out.get("long.md", 0) >= 1  # the budget, not the question, cut those


def test_a_documents_best_matched_section_comes_first_whatever_its_place():
    sections = _sections(5, {1, 4}, words=60)
    sections = [s.model_copy(update={"match_rank": {4: 0, 1: 1}.get(s.position)}) for s in sections]
    first = _block("first.md", _sections(2, {0}, words=10))
    second = _block("second.md", sections)
    budget = count_tokens(pack_context([first], budget_tokens=10_000).text) + 100  # room for one section
    content = pack_context([first, second], budget_tokens=budget).blocks[1].content
    assert f"Doc > S4{MATCHED_MARK}" in content and "Doc > S1" not in content


def test_completeness_says_when_the_budget_cut_matched_evidence():
    from kb_retrieval.result import completeness

    blocks = [_block("long.md", _sections(12, {3, 7, 9}, words=60)), _block("b.md", _sections(3, {0}))]
    cut = pack_context(blocks, budget_tokens=200)
    assert cut.summary.matched_left_out
    assert completeness(blocks, cut.summary).startswith("partial: the context budget (200 tokens), not the question")
    roomy = pack_context(blocks, budget_tokens=5000)
    assert roomy.summary.matched_left_out == {}
    assert completeness(blocks, roomy.summary).startswith("matched_sections:")


def test_a_short_runbook_comes_back_whole(sample_lookup):
    result = sample_lookup.lookup(ALERT)
    block = result.evidence_blocks[0]
    assert block.source == "kubernetes/container-oomkilled.md"
    positions = [s.position for s in block.sections]
    assert positions == sorted(positions) and positions[0] == 0 and len(positions) > 1
    assert any(s.matched for s in block.sections) and not all(s.matched for s in block.sections)
    assert any("Mitigation" in (s.breadcrumb or "") for s in block.sections)  # the fix is in the evidence
    matched = [s for s in block.sections if s.matched]
    assert all(s.hit_reasons for s in matched)
    packed = result.context_pack.blocks[0].content
    assert all(s.content[:40] in packed for s in matched)


def test_expansion_can_be_switched_off(sample_lookup):
    plain = sample_lookup.with_settings(expand_documents=False).lookup(ALERT)
    assert plain.evidence_blocks[0].sections == []
    assert "### " not in plain.context_pack.blocks[0].content


_text = st.text(alphabet=st.characters(codec="utf-8", categories=["L", "M", "N", "P", "S", "Z"]), max_size=120)
_section_lists = st.lists(
    st.builds(
        DocumentSection,
        breadcrumb=st.one_of(st.none(), _text),
        content=_text,
        position=st.just(0),
        matched=st.booleans(),
    ),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(sections=_section_lists)
def test_property_a_rendering_counts_as_its_sections(sections: list[DocumentSection]) -> None:
    """The pack counts a document from its sections' counts: exact, since no token spans the line breaks between."""
    sections = [s.model_copy(update={"position": i}) for i, s in enumerate(sections)]
    assert count_tokens(render_sections(sections)) == sum(section_tokens(s) for s in sections)


@settings(max_examples=200, deadline=None)
@given(documents=st.lists(_section_lists, min_size=1, max_size=4), budget=st.integers(min_value=64, max_value=900))
def test_property_documents_pack_within_the_budget(documents: list[list[DocumentSection]], budget: int) -> None:
    blocks = [
        _block(f"doc{d}.md", [s.model_copy(update={"position": i}) for i, s in enumerate(sections)])
        for d, sections in enumerate(documents)
    ]
    pack = pack_context(blocks, budget_tokens=budget)
    assert count_tokens(pack.text) == pack.summary.used_tokens <= budget  # counted from the sections, exactly
