"""``pack_context``: the budget holds, metadata is never cut, content is, and the summary says what happened."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kb_retrieval.knowledge.text import count_tokens
from kb_retrieval.models import EvidenceBlock
from kb_retrieval.retrieval.context_pack import MIN_CONTENT_TOKENS, TRUNCATION_MARK, block_header, pack_context
from tests.support.context_pack import check_invariants


def block(
    source: str,
    content: str,
    *,
    title: str | None = "A title",
    breadcrumb: str | None = "A title > Section",
    hit_reasons: list[str] | None = None,
) -> EvidenceBlock:
    return EvidenceBlock(
        source=source,
        title=title,
        breadcrumb=breadcrumb,
        retrieval_layer="L1",
        content=content,
        hit_reasons=["semantic"] if hit_reasons is None else hit_reasons,
        score=0.5,
        similarity=0.5,
    )


def words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def test_everything_fits() -> None:
    blocks = [block("a.md", "short one"), block("b.md", "short two")]
    pack = pack_context(blocks, budget_tokens=500)
    check_invariants(blocks, pack, 500)
    assert pack.summary.included_sources == ["a.md", "b.md"]
    assert pack.summary.truncated_sources == [] and pack.summary.omitted_sources == []
    assert pack.text.startswith("[1] source: a.md\ntitle: A title\nbreadcrumb: A title > Section\n")
    assert "hit reasons: semantic\nshort one" in pack.text
    assert "[2] source: b.md" in pack.text


def test_header_lines_left_out_when_absent() -> None:
    header = block_header(3, block("x.md", "c", title=None, breadcrumb=None, hit_reasons=[]))
    assert header == "[3] source: x.md\n"


def test_content_truncated_with_mark_metadata_whole() -> None:
    long_reasons = ["keyword:RedisMemoryHigh", "title:Redis memory high", "domain:redis", "entity:cache-01"]
    blocks = [block("redis/mem.md", words(500), hit_reasons=long_reasons)]
    pack = pack_context(blocks, budget_tokens=100)
    check_invariants(blocks, pack, 100)
    assert pack.summary.truncated_sources == ["redis/mem.md"]
    assert pack.blocks[0].truncated
    assert pack.text.endswith(TRUNCATION_MARK)
    assert "hit reasons: " + ", ".join(long_reasons) + "\n" in pack.text
    assert pack.summary.used_tokens > 90  # the room was used, not wasted


def test_later_blocks_omitted_when_budget_runs_out() -> None:
    blocks = [block("one.md", words(40)), block("two.md", words(200)), block("three.md", words(40))]
    pack = pack_context(blocks, budget_tokens=120)
    check_invariants(blocks, pack, 120)
    assert pack.summary.included_sources == ["one.md", "two.md"]
    assert pack.summary.truncated_sources == ["two.md"]
    assert pack.summary.omitted_sources == ["three.md"]
    assert "three.md" not in pack.text


def test_block_whose_header_does_not_fit_is_omitted_whole_not_cut() -> None:
    huge_header = block("big-header.md", "content", hit_reasons=[f"reason-{i}" for i in range(80)])
    small = block("small.md", "tiny content")
    blocks = [huge_header, small]
    pack = pack_context(blocks, budget_tokens=100)
    check_invariants(blocks, pack, 100)
    assert pack.summary.omitted_sources == ["big-header.md"]
    assert "reason-0" not in pack.text  # no half header
    assert pack.summary.included_sources == ["small.md"]
    assert pack.text.startswith("[1] source: small.md")  # numbering counts included blocks


def test_block_left_with_too_little_room_is_omitted() -> None:
    first = block("first.md", words(10), title=None, breadcrumb=None, hit_reasons=[])
    header_tokens = count_tokens(block_header(2, block("second.md", "")))
    used = count_tokens(block_header(1, first) + first.content)
    budget = used + header_tokens + MIN_CONTENT_TOKENS - 1
    blocks = [first, block("second.md", words(50))]
    pack = pack_context(blocks, budget_tokens=budget)
    check_invariants(blocks, pack, budget)
    assert pack.summary.omitted_sources == ["second.md"]
    pack = pack_context(blocks, budget_tokens=budget + 1)
    assert pack.summary.truncated_sources == ["second.md"]


def test_content_exactly_at_room_is_not_truncated() -> None:
    b = block("a.md", words(30))
    budget = count_tokens(block_header(1, b) + b.content)
    pack = pack_context([b], budget_tokens=budget)
    assert pack.summary.truncated_sources == []
    assert pack.summary.used_tokens == budget
    assert pack_context([b], budget_tokens=budget - 1).summary.truncated_sources == ["a.md"]


def test_no_blocks() -> None:
    pack = pack_context([], budget_tokens=100)
    assert pack.text == "" and pack.blocks == [] and pack.summary.used_tokens == 0


text_strategy = st.text(alphabet=st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Zs"]), max_size=80)
block_strategy = st.builds(
    block,
    source=st.text(min_size=1, max_size=30).filter(str.strip),
    content=st.one_of(text_strategy, st.integers(0, 400).map(words), st.text(max_size=600)),
    title=st.one_of(st.none(), text_strategy),
    breadcrumb=st.one_of(st.none(), text_strategy),
    hit_reasons=st.lists(st.text(min_size=1, max_size=20), max_size=6),
)


@settings(max_examples=300, deadline=None)
@given(
    blocks=st.lists(block_strategy, max_size=8, unique_by=lambda b: b.source),
    budget=st.integers(min_value=64, max_value=1500),
)
def test_property_budget_and_metadata_hold(blocks: list[EvidenceBlock], budget: int) -> None:
    check_invariants(blocks, pack_context(blocks, budget_tokens=budget), budget)


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=6), budget=st.integers(min_value=64, max_value=800))
def test_property_first_block_included_when_its_header_fits(sizes: list[int], budget: int) -> None:
    blocks = [block(f"doc{i}.md", words(n, prefix=f"d{i}x")) for i, n in enumerate(sizes)]
    pack = pack_context(blocks, budget_tokens=budget)
    check_invariants(blocks, pack, budget)
    assert pack.summary.included_sources[0] == "doc0.md"  # a 64-token budget always has room for one block
