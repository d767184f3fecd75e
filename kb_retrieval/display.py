"""How results and reports show in a notebook: compact HTML, Markdown for frontends without HTML, a short repr, and
their tables as pandas DataFrames.

Size: over 400 lines: the notebook views of every contract and report live in one module so that the
contracts import none of it (:class:`~kb_retrieval.reporting.Displayed` loads it by name); each view is short.

A :class:`View` is what is shown, as plain data: a headline, a few labelled lines, one table, and collapsible
details. :func:`view_html` and :func:`view_markdown` draw the same view, so the two never say different things. The
words are the terminal's (:mod:`kb_retrieval.terminal`): why a block was chosen, in-pack marks, the completeness
hint. Every piece of text is escaped: a knowledge-base document holding ``<script>`` shows the tag, never runs it.

The contracts (:class:`~kb_retrieval.models.LookupResult`, ...) call these functions from their ``_repr_html_``,
``_repr_markdown_``, ``__repr__`` and ``to_dataframe`` methods; pandas is imported only by ``to_dataframe``
(``pip install kb-retrieval[notebook]``).

Example:
    >>> view_html(View("A <b> title", table=Table(["source"], [["ops/<x>.md"]])))  # doctest: +ELLIPSIS
    '<div class="kb-view"><p><b>A &lt;b&gt; title</b></p>...<td>ops/&lt;x&gt;.md</td>...'
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kb_retrieval.evaluation.report import EvalReport, summary_rows
from kb_retrieval.models import EvidenceBlock, LookupResult, RerankTrace, RetrievalTrace
from kb_retrieval.reporting import markdown_table
from kb_retrieval.result import relevance
from kb_retrieval.scoring_profile import BUILT_IN_PROFILE, ScoringProfile
from kb_retrieval.terminal import completeness_in_words, not_found_lines, pack_mark, reason_in_words, why

if TYPE_CHECKING:
    import pandas as pd

#: The longest a source or title is shown in a repr before it is cut with "...".
REPR_CHARS = 60
_STYLE = (
    "<style>.kb-view table{border-collapse:collapse;font-size:90%}.kb-view td,.kb-view th{text-align:left;"
    "vertical-align:top;padding:2px 8px}.kb-view pre{white-space:pre-wrap;max-height:24em;overflow:auto}</style>"
)


@dataclass
class Table:
    """A table of a view: its header and its rows of cell text."""

    header: list[str]
    rows: list[list[str]]


@dataclass
class Details:
    """A collapsible part: its summary line, and a table, a text (shown preformatted) or both."""

    summary: str
    table: Table | None = None
    text: str | None = None


@dataclass
class View:
    """What one object shows: headline, labelled lines, the main table, collapsible details."""

    headline: str
    lines: list[tuple[str, str]] = field(default_factory=list)
    table: Table | None = None
    details: list[Details] = field(default_factory=list)


# --- drawing -------------------------------------------------------------------------------------------------


def view_html(view: View) -> str:
    """The view as one HTML fragment, every text escaped."""
    parts = [f'<div class="kb-view"><p><b>{_html(view.headline)}</b></p>', _STYLE]
    if view.lines:
        parts.append(
            "<p>" + "<br>".join(f"<b>{_html(label)}</b>: {_html(value)}" for label, value in view.lines) + "</p>"
        )
    if view.table is not None:
        parts.append(_table_html(view.table))
    for part in view.details:
        inner = (_table_html(part.table) if part.table else "") + (
            f"<pre>{_html(part.text)}</pre>" if part.text else ""
        )
        parts.append(f"<details><summary>{_html(part.summary)}</summary>{inner}</details>")
    return "".join(parts) + "</div>"


def view_markdown(view: View) -> str:
    """The view as Markdown: the headline in bold, the lines, the table; each detail under a bold line."""
    lines = [f"**{_md(view.headline)}**", ""]
    lines += [f"- **{_md(label)}**: {_md(value)}" for label, value in view.lines]
    if view.table is not None:
        lines += ["", *_table_markdown(view.table)]
    for part in view.details:
        lines += ["", f"**{_md(part.summary)}**"]
        if part.table:
            lines += ["", *_table_markdown(part.table)]
        if part.text:
            fence = "`" * max(3, _longest_backtick_run(part.text) + 1)
            lines += ["", fence, part.text, fence]
    return "\n".join(lines) + "\n"


def frame(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    """Rows as a pandas DataFrame with these columns (pandas imported here, on first use)."""
    try:
        import pandas as pd
    except ImportError as error:  # pragma: no cover - pandas is in the notebook extra
        raise ImportError("to_dataframe() needs pandas: pip install 'kb-retrieval[notebook]'") from error
    return pd.DataFrame(list(rows), columns=list(columns))


def _table_html(table: Table) -> str:
    head = "".join(f"<th>{_html(cell)}</th>" for cell in table.header)
    body = "".join("<tr>" + "".join(f"<td>{_html(cell)}</td>" for cell in row) + "</tr>" for row in table.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _table_markdown(table: Table) -> list[str]:
    return markdown_table([_md(c) for c in table.header], [[_md(c) for c in row] for row in table.rows])


def _html(text: str) -> str:
    """Plain text safe in HTML (quotes escaped too)."""
    return html.escape(text, quote=True)


def _md(text: str) -> str:
    """Plain text safe in Markdown: one line; HTML, pipes and emphasis escaped."""
    text = " ".join(text.split())
    for char, escaped in (("\\", "\\\\"), ("|", "\\|"), ("<", "&lt;"), ("*", "\\*"), ("_", "\\_"), ("`", "\\`")):
        text = text.replace(char, escaped)
    return text


def _longest_backtick_run(text: str) -> int:
    longest = run = 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    return longest


def _cut(text: str, limit: int = REPR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- a lookup result -----------------------------------------------------------------------------------------

EVIDENCE_COLUMNS = ["rank", "source", "title", "relevance", "in pack", "why"]


def result_view(result: LookupResult, scoring: ScoringProfile | None = None) -> View:
    """The result as the terminal shows it: the evidence table first, the traces folded away."""
    scoring = scoring or BUILT_IN_PROFILE
    summary = result.context_pack.summary
    lines = [("query", result.query_transform.original_query)]
    if result.found:
        headline = (
            f"{len(result.evidence_blocks)} evidence document(s), relevance {result.relevance_level}, "
            f"{result.elapsed_ms:.0f} ms"
        )
        if result.confidence:
            lines.append(("confidence", result.confidence))
        lines.append(("completeness", completeness_in_words(result.completeness_hint)))
        table: Table | None = Table(
            EVIDENCE_COLUMNS,
            [
                [
                    str(rank),
                    block.source,
                    block.title or "-",
                    f"{relevance([block], scoring)} {block.similarity:.2f}",
                    pack_mark(summary, block.source),
                    why(block),
                ]
                for rank, block in enumerate(result.evidence_blocks, start=1)
            ],
        )
    else:
        headline = result.message
        lines += [("near misses", line) for line in not_found_lines(result)]
        table = _near_misses_table(result) if result.near_misses else _attempts_table(result.retrieval_trace)
    details = [
        Details(f"[{rank}] {block.source}" + (f" - {block.title}" if block.title else ""), text=block.content)
        for rank, block in enumerate(result.evidence_blocks, start=1)
    ]
    details.append(
        Details(
            f"context pack: {summary.used_tokens} of {summary.budget_tokens} tokens",
            Table(
                ["included", "cut", "left out", "unmatched sections left out"],
                [
                    [
                        ", ".join(summary.included_sources) or "-",
                        ", ".join(summary.truncated_sources) or "-",
                        ", ".join(summary.omitted_sources) or "-",
                        ", ".join(f"{s}: {n}" for s, n in summary.sections_left_out.items()) or "-",
                    ]
                ],
            ),
        )
    )
    if result.found or result.near_misses:
        details.append(Details("retrieval attempts", _attempts_table(result.retrieval_trace)))
    details.append(Details("rerank trace", rerank_view(result.rerank_trace).table))
    transform = result.query_transform
    hints = transform.hints
    details.append(
        Details(
            "query transform and L0 hints",
            Table(
                ["normalized query", "category filter", "filter reason", "L0 titles", "L0 keywords", "domains"],
                [
                    [
                        transform.normalized_query,
                        transform.category_filter or "-",
                        transform.filter_reason,
                        ", ".join(hints.matched_titles) or "-",
                        ", ".join(hints.matched_keywords) or "-",
                        ", ".join(hints.domains) or "-",
                    ]
                ],
            ),
        )
    )
    return View(headline, lines, table, details)


NEAR_MISS_COLUMNS = ["source", "title", "similarity", "evidence score", "threshold"]


def _near_misses_table(result: LookupResult) -> Table:
    return Table(
        NEAR_MISS_COLUMNS,
        [
            [m.source, m.title or "-", f"{m.similarity:.3f}", f"{m.evidence_score:.3f}", f"{m.threshold:g}"]
            for m in result.near_misses
        ],
    )


def _attempts_table(trace: RetrievalTrace) -> Table:
    return Table(
        ["attempt", "filter", "candidates", "top similarity", "outcome", "why"],
        [
            [
                str(a.attempt),
                a.category_filter or "none",
                str(a.candidate_count),
                "-" if a.top_similarity is None else f"{a.top_similarity:.3f}",
                a.outcome,
                a.outcome_reason or a.error or "-",
            ]
            for a in trace.attempts
        ],
    )


def result_repr(result: LookupResult) -> str:
    """A one-line repr: found, how many documents, the first one."""
    if not result.found:
        return f"<LookupResult found=False {result.evidence_status.value}: {_cut(result.message, 2 * REPR_CHARS)}>"
    first = result.evidence_blocks[0].source
    return (
        f"<LookupResult found=True, {len(result.evidence_blocks)} evidence block(s), relevance "
        f"{result.relevance_level}, first {_cut(first)!r}>"
    )


def result_rows(result: LookupResult, scoring: ScoringProfile | None = None) -> list[dict[str, Any]]:
    """One row per evidence document: the evidence table with numbers as numbers."""
    scoring = scoring or BUILT_IN_PROFILE
    summary = result.context_pack.summary
    return [
        {
            "rank": rank,
            "source": block.source,
            "title": block.title,
            "category": block.category,
            "relevance": relevance([block], scoring),
            "similarity": block.similarity,
            "score": block.score,
            "in_pack": block.source not in summary.omitted_sources,  # a cut block is in, shortened
            "pack": pack_mark(summary, block.source),
            "why": why(block, limit=len(block.hit_reasons)),
            "layer": block.retrieval_layer,
        }
        for rank, block in enumerate(result.evidence_blocks, start=1)
    ]


RESULT_FRAME_COLUMNS = [
    "rank",
    "source",
    "title",
    "category",
    "relevance",
    "similarity",
    "score",
    "in_pack",
    "pack",
    "why",
    "layer",
]


# --- one evidence block --------------------------------------------------------------------------------------


def evidence_view(block: EvidenceBlock) -> View:
    """The block: why it was chosen, its sections (matched ones marked, each once), its text folded."""
    headline = block.source + (f" - {block.title}" if block.title else "")
    lines = [
        ("similarity", f"{block.similarity:.3f}"),
        ("score", f"{block.score:.3f}"),
        ("layer", block.retrieval_layer),
        ("why", why(block, limit=len(block.hit_reasons))),
    ]
    table = (
        Table(["#", "section", "matched", "why"], [_section_row(s) for s in block.sections]) if block.sections else None
    )
    return View(headline, lines, table, [Details(f"text ({len(block.content)} characters)", text=block.content)])


def _section_row(section: Any) -> list[str]:
    reasons = "; ".join(dict.fromkeys(reason_in_words(r) for r in section.hit_reasons))
    return [str(section.position + 1), section.breadcrumb or "-", "yes" if section.matched else "", reasons or "-"]


def evidence_repr(block: EvidenceBlock) -> str:
    """A one-line repr of an evidence block: its source, title, similarity and length."""
    title = f" {_cut(block.title)!r}" if block.title else ""
    return (
        f"<EvidenceBlock {_cut(block.source)!r}{title} similarity {block.similarity:.3f}, {len(block.content)} chars>"
    )


def evidence_rows(block: EvidenceBlock) -> list[dict[str, Any]]:
    """One row per section of the block's document (one row for the block itself when it has none)."""
    if not block.sections:
        return [
            {
                "position": 0,
                "section": block.breadcrumb,
                "matched": True,
                "why": why(block),
                "chars": len(block.content),
            }
        ]
    return [
        {
            "position": s.position,
            "section": s.breadcrumb,
            "matched": s.matched,
            "why": "; ".join(dict.fromkeys(reason_in_words(r) for r in s.hit_reasons)),
            "chars": len(s.content),
        }
        for s in block.sections
    ]


EVIDENCE_FRAME_COLUMNS = ["position", "section", "matched", "why", "chars"]


# --- the rerank trace ----------------------------------------------------------------------------------------


def rerank_view(trace: RerankTrace) -> View:
    """The rerank: each ranked document's base score, its boosts and its final score."""
    return View(
        f"rerank of {trace.candidate_count} candidate(s): {len(trace.entries)} ranked",
        table=Table(
            ["rank", "source", "section", "base", "boosts", "final"],
            [
                [
                    str(e.rank),
                    e.source,
                    e.breadcrumb or "-",
                    f"{e.base_score:.3f}",
                    ", ".join(f"{name} +{value:.3f}" for name, value in e.boosts.items()) or "-",
                    f"{e.final_score:.3f}",
                ]
                for e in trace.entries
            ],
        ),
    )


def rerank_repr(trace: RerankTrace) -> str:
    """A one-line repr of a rerank trace: its counts and its first sources."""
    firsts = ", ".join(_cut(e.source, 40) for e in trace.entries[:3])
    return f"<RerankTrace {trace.candidate_count} candidate(s), {len(trace.entries)} ranked: {firsts or '-'}>"


def rerank_rows(trace: RerankTrace) -> list[dict[str, Any]]:
    """The rerank trace as rows (one per ranked candidate, one column per boost), for a DataFrame."""
    return [
        {
            "rank": e.rank,
            "source": e.source,
            "section": e.breadcrumb,
            "base_score": e.base_score,
            "boosts": sum(e.boosts.values()),
            **{f"boost_{name}": value for name, value in e.boosts.items()},
            "final_score": e.final_score,
        }
        for e in trace.entries
    ]


def rerank_columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The columns of :func:`rerank_rows`' rows, in order: every boost any row has, between the scores."""
    boosts = sorted({key for row in rows for key in row if key.startswith("boost_")})
    return ["rank", "source", "section", "base_score", "boosts", *boosts, "final_score"]


# --- the offline evaluation ------------------------------------------------------------------------------------

CASE_COLUMNS = ["case", "scenario", "query", "expected", "level", "first expected rank", "came first", "why not better"]


def eval_view(report: EvalReport) -> View:
    """The evaluation: the summary table first, the cases folded (failures first)."""
    overall = report.overall
    header, rows = summary_rows(report)
    headline = (
        f"retrieval evaluation of {overall.case_count} case(s) from {report.golden}: strong {overall.strong}, "
        f"medium {overall.medium}, miss {overall.miss}, no-answer correct {overall.no_answer_correct} of "
        f"{overall.no_answer}, not run {overall.not_run}"
    )
    order = {"miss": 0, "no_answer_wrong": 1, "not_run": 2, "medium": 3}
    cases = sorted(report.cases, key=lambda c: order.get(c.status, 4))
    case_table = Table(
        CASE_COLUMNS,
        [
            [
                c.case_id,
                c.scenario,
                c.query,
                ", ".join(c.expected_docs) or "(no answer expected)",
                c.status,
                "-" if c.first_expected_rank is None else str(c.first_expected_rank),
                c.top_candidates[0] if c.top_candidates else "(nothing)",
                "; ".join(c.failed_checks) or "-",
            ]
            for c in cases
        ],
    )
    return View(
        headline, table=Table(header, rows), details=[Details(f"{len(cases)} case(s), failures first", case_table)]
    )


def eval_repr(report: EvalReport) -> str:
    """A one-line repr of an evaluation report: its golden file, cases and hit levels."""
    o = report.overall
    return f"<EvalReport {report.golden}: {o.case_count} case(s), strong {o.strong}, medium {o.medium}, miss {o.miss}>"


def eval_rows(report: EvalReport) -> list[dict[str, Any]]:
    """The evaluation report's cases as rows (the columns of :data:`CASE_COLUMNS`), for a DataFrame."""
    return [
        {
            "case": c.case_id,
            "scenario": c.scenario,
            "query": c.query,
            "expected": ", ".join(c.expected_docs),
            "level": c.status,
            "first_expected_rank": c.first_expected_rank,
            "came_first": c.top_candidates[0] if c.top_candidates else None,
            "failed_checks": "; ".join(c.failed_checks),
        }
        for c in report.cases
    ]


EVAL_FRAME_COLUMNS = [
    "case",
    "scenario",
    "query",
    "expected",
    "level",
    "first_expected_rank",
    "came_first",
    "failed_checks",
]
