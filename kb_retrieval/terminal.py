"""The terminal view of a lookup result: what a person reading ``kb-retrieval lookup`` needs first.

One line per evidence document (rank, source, title, relevance, why in words), the documents the context budget
left out named, then the first document's matched sections (``full=True``: every block's whole text). The agent
reads :func:`kb_retrieval.result.agent_text` and scripts read ``--json``; neither changes with this view.

Example:
    >>> reason_in_words("l0_keyword:RedisMemoryHigh")
    'keyword RedisMemoryHigh'
    >>> reason_in_words("l1_document:title 0.788 summary 0.828 text 0.800 static 0.659 weighted title 0.349")
    'whole-document similarity (summary 0.83)'
    >>> reason_in_words("l1_document:placed 4, ranked 6: from the fourth place the ranking alternates with content "
    ...                 "(text 0.634)")
    'placed 4, ranked 6 (alternating with content, 0.63)'
"""

from __future__ import annotations

import re
import textwrap

from kb_retrieval.models import ContextPackSummary, DocumentSection, EvidenceBlock, LookupResult, NearMiss
from kb_retrieval.result import relevance
from kb_retrieval.retrieval.evidence import fills_after_evidence
from kb_retrieval.retrieval.stage import HitKind
from kb_retrieval.scoring_profile import ScoringProfile

#: How many hit reasons the "why" column shows (the rest are in ``--json``).
MAX_REASONS = 4
#: The widest a column of sources or titles grows before it is cut with "...".
MAX_SOURCE_CHARS = 48
MAX_TITLE_CHARS = 40


def lookup_text(result: LookupResult, scoring: ScoringProfile, *, full: bool = False, width: int | None = None) -> str:
    """The result as a person reads it on a terminal.

    Args:
        result: The lookup's result.
        scoring: The settings whose relevance cut-offs name each document's relevance.
        full: Print every evidence block's whole text, not only the first document's matched sections.
        width: Cut the document lines to this many characters (a terminal's width); None keeps them whole.
    """
    if not result.found:
        return "\n".join(visible(line) for line in [result.message, *not_found_lines(result)])
    summary = result.context_pack.summary
    left_out = set(summary.omitted_sources)
    shortened = set(summary.truncated_sources)
    head = (
        f"{len(result.evidence_blocks)} evidence document(s), relevance {result.relevance_level}, "
        f"{result.elapsed_ms:.0f} ms"
    )
    rows = [["#", "source", "title", "relevance", "why"]]
    for rank, block in enumerate(result.evidence_blocks, start=1):
        mark = pack_mark(summary, block.source)
        mark = f" ({mark})" if mark != IN_PACK else ""
        rows.append(
            [
                str(rank),
                _cut(block.source, MAX_SOURCE_CHARS) + mark,
                _cut(block.title or "-", MAX_TITLE_CHARS),
                f"{relevance([block], scoring)} {block.similarity:.2f}",
                why(block),
            ]
        )
    lines = [head, "", *_columns(rows, width)]
    if left_out:
        lines += ["", f"Left out of the agent's context by the token budget: {', '.join(summary.omitted_sources)}"]
    if shortened:
        lines += [f"Cut to fit the token budget: {', '.join(summary.truncated_sources)}"]
    blocks = result.evidence_blocks if full else result.evidence_blocks[:1]
    for rank, block in enumerate(blocks, start=1):
        lines += ["", *_block_text(rank, block, full=full)]
    if not full and len(result.evidence_blocks) > 1:
        lines += ["", "--full prints every document's text; --json the whole result with its traces."]
    return "\n".join(visible(line) for line in lines)


#: Characters a terminal acts on instead of showing: C0/C1 controls (ESC starts colour and cursor sequences, a
#: newline in a file name would forge a line) and the bidirectional overrides that reorder what is shown.
_TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def visible(line: str) -> str:
    r"""``line`` with every terminal control shown as its escape, never acted on.

    Example:
        >>> visible("\x1b[31mRED\x1b[0m.md")
        '\\x1b[31mRED\\x1b[0m.md'
    """
    return _TERMINAL_CONTROLS.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", line
    )


def not_found_lines(result: LookupResult) -> list[str]:
    """Without evidence, the nearest miss and the threshold it missed, then the next misses ([] when none).

    Example: ``not found: nearest miss Redis memory high (redis/memory.md) at 0.388, threshold 0.42``.
    """
    if not result.near_misses:
        return []
    first, *others = result.near_misses
    lines = [f"not found: nearest miss {near_miss_words(first)}, threshold {first.threshold:g}"]
    if others:
        lines.append("next below the threshold: " + "; ".join(near_miss_words(m) for m in others))
    return lines


def near_miss_words(miss: NearMiss) -> str:
    """``title (source) at 0.388``: the evidence score, what the threshold is compared with."""
    name = f"{miss.title} ({miss.source})" if miss.title else miss.source
    return f"{name} at {miss.evidence_score:.3f}"


IN_PACK = "in pack"


def pack_mark(summary: ContextPackSummary, source: str) -> str:
    """Whether the agent received the document: ``in pack``, ``cut`` (shortened to fit the token budget) or
    ``left out`` (the budget left no room for it)."""
    if source in summary.omitted_sources:
        return "left out"
    return "cut" if source in summary.truncated_sources else IN_PACK


def completeness_in_words(hint: str) -> str:
    """A completeness hint without its code word, e.g. ``"one document answers; it may not cover every aspect"``.

    Example:
        >>> completeness_in_words("single_source: one document answers; it may not cover every aspect")
        'one document answers; it may not cover every aspect'
        >>> completeness_in_words("no_evidence")
        'no evidence'
    """
    code, separator, words = hint.partition(": ")
    return words if separator else code.replace("_", " ")


def why(block: EvidenceBlock, limit: int = MAX_REASONS) -> str:
    """The block's hit reasons in words, the strongest kinds first, at most ``limit`` of them."""
    return reasons_in_words(block.hit_reasons, limit)


def reasons_in_words(hit_reasons: list[str], limit: int = MAX_REASONS) -> str:
    """Hit reasons in words, the strongest kinds first, each phrase once, at most ``limit`` of them.

    Example:
        >>> reasons_in_words(["l1_semantic:0.481", "l0_keyword:RedisMemoryHigh"])
        'keyword RedisMemoryHigh; meaning similarity 0.48'
    """
    order = {kind.value: index for index, kind in enumerate(_KIND_ORDER)}
    reasons = sorted(hit_reasons, key=lambda r: order.get(r.partition(":")[0], len(order)))
    words = list(dict.fromkeys(reason_in_words(r) for r in reasons))
    more = len(words) - limit
    return "; ".join(words[:limit]) + (f"; +{more} more" if more > 0 else "")


def matched_sections(block: EvidenceBlock) -> list[tuple[str, str, str]]:
    """The block's matched sections once each, in document order: ``(heading, breadcrumb, why)``.

    A long section is several chunks under one breadcrumb; they are one section here, its reasons merged (the
    closest meaning of its chunks). The heading is the breadcrumb's last part.
    """
    merged: dict[str, list[str]] = {}
    for section in block.sections:
        if section.matched:
            merged.setdefault(section.breadcrumb or block.breadcrumb or block.source, []).extend(section.hit_reasons)
    return [
        (breadcrumb.rpartition(" > ")[2], breadcrumb, reasons_in_words(_closest_meaning(reasons)))
        for breadcrumb, reasons in merged.items()
    ]


def _closest_meaning(hit_reasons: list[str]) -> list[str]:
    """The reasons with one ``l1_semantic`` left: the highest (each chunk of a section has its own)."""
    semantic = [r for r in hit_reasons if r.startswith(f"{HitKind.L1_SEMANTIC.value}:")]
    best = max(semantic, key=lambda r: _float(r.partition(":")[2]), default=None)
    return [r for r in hit_reasons if r not in semantic or r == best]


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


#: The document ranker's reason for a document placed by content (``doc_rank.DocumentRanker._interleaved``).
_PLACED = re.compile(r"placed (\d+), ranked (\d+):.*\(text (-?\d+\.\d+)\)")


def reason_in_words(reason: str) -> str:
    """One hit reason (``kind:detail``) as a short phrase."""
    kind, _, detail = reason.partition(":")
    if kind == HitKind.L1_DOCUMENT.value and (placed := _PLACED.match(detail)):
        return f"placed {placed[1]}, ranked {placed[2]} (alternating with content, {float(placed[3]):.2f})"
    if kind == HitKind.L1_DOCUMENT.value:
        scores = dict((name, float(value)) for name, value in re.findall(r"([a-z ]+?) (\d+\.\d+)", detail))
        name, best = max(scores.items(), key=lambda item: item[1], default=("", 0.0))
        return f"whole-document similarity ({name.strip()} {best:.2f})" if name else "whole-document similarity"
    if kind == HitKind.L1_RANK.value:
        where = "below" if fills_after_evidence(reason) else "above"
        return f"ranked {where} the first document at the evidence threshold"
    if kind == HitKind.L1_SEMANTIC.value:
        return f"meaning similarity {_number(detail, 2)}"
    if kind == HitKind.LEXICAL_BM25.value:
        return f"same words (BM25 {_number(detail, 2)} of the best)"
    if kind == HitKind.L0_TITLE_TERMS.value:
        return f"{_percent(detail)} of the title's words in the query"
    phrase = _PHRASES.get(kind)
    return f"{phrase} {detail}" if phrase else reason


_KIND_ORDER = (
    HitKind.EXACT_MATCH,
    HitKind.L0_KEYWORD,
    HitKind.L0_TITLE,
    HitKind.L0_TITLE_TERMS,
    HitKind.L1_SEMANTIC,
    HitKind.LEXICAL_BM25,
    HitKind.L0_ENTITY,
    HitKind.BREADCRUMB_MATCH,
    HitKind.CONTENT_MATCH,
    HitKind.L0_CATEGORY,
    HitKind.L1_DOCUMENT,
    HitKind.L1_RANK,
)
_PHRASES = {
    HitKind.EXACT_MATCH.value: "exact identifier",
    HitKind.L0_KEYWORD.value: "keyword",
    HitKind.L0_TITLE.value: "title named:",
    HitKind.L0_ENTITY.value: "names",
    HitKind.L0_CATEGORY.value: "in category",
    HitKind.BREADCRUMB_MATCH.value: "heading has",
    HitKind.CONTENT_MATCH.value: "text has",
}


def _block_text(rank: int, block: EvidenceBlock, *, full: bool) -> list[str]:
    """The block's title line, then its matched sections (``full``: its whole content)."""
    lines = [f"[{rank}] {block.source}" + (f" - {block.title}" if block.title else "")]
    sections: list[DocumentSection] = [s for s in block.sections if s.matched] if not full else []
    if sections:
        for section in sections:
            lines += ["", f"  -- {section.breadcrumb or block.breadcrumb or block.source}", ""]
            lines += _indent(section.content)
        left = len(block.sections) - len(sections)
        if left:
            lines += ["", f"  ({left} other section(s) of this document not shown: --full shows them)"]
        return lines
    if block.breadcrumb and not full:
        lines += [f"  -- {block.breadcrumb}"]
    return [*lines, "", *_indent(block.content)]


def _indent(text: str) -> list[str]:
    return [textwrap.indent(line, "  ") if line.strip() else "" for line in text.strip("\n").splitlines()]


def _columns(rows: list[list[str]], width: int | None) -> list[str]:
    """Rows as left-aligned columns; the last column takes what is left (cut to ``width`` when given)."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        line = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
        lines.append(_cut(line.rstrip(), width) if width else line.rstrip())
    return lines


def _cut(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return text[: max(limit - 3, 1)] + "..."


def _number(text: str, decimals: int) -> str:
    try:
        return f"{float(text):.{decimals}f}"
    except ValueError:
        return text


def _percent(text: str) -> str:
    try:
        return f"{float(text):.0%}"
    except ValueError:
        return text
