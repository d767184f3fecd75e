"""The comparison report as JSON (for machines) beside Markdown (for people), with PNG charts beside both.

Deterministic like the evaluation report: sorted JSON keys, no timestamps or timings, no absolute paths, floats
rounded to 4 decimals, cases in golden-file order, charts drawn by :mod:`kb_retrieval.reporting` (skipped with a note
when matplotlib is not installed). Two runs over the same collection give byte-identical files.
"""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path
from typing import Any

from kb_retrieval.display import Details, Table, View
from kb_retrieval.evaluation.metrics import score_names
from kb_retrieval.evaluation.report import HIT_LEVEL_COLORS, NOT_IN_EVIDENCE, cut_query, hit_level_series
from kb_retrieval.reporting import (
    BarChart,
    ChartFiles,
    ReportFiles,
    code,
    format_number,
    inline,
    json_text,
    markdown_table,
    text_table,
    write_report_files,
)
from sidecar.comparison import DECIMALS, CaseComparison, CompareReport, PathSide
from sidecar.models import ComparableResult

_DEFINITIONS = """\
## Definitions

- Each path's list is its top {k} **documents**, one per source (the best chunk of each): the current path's
  ranking after rule rerank and dedupe, the sidecar's chunks in Milvus order with later chunks of a source dropped.
- **Scores are not comparable across paths.** Each is the raw Milvus score of the document's best chunk under its
  path's label: with COSINE or IP a similarity (higher is better), with L2 a squared distance (lower is better).
  The current path's rank order comes from its rule rerank, the sidecar's from Milvus; see "Paths".
- Row marks: `source` (the paths rank different documents there), else `breadcrumb`, `category`, `score_label`
  (same document, different best chunk heading, category or score label). Rank differences of documents both
  paths returned are listed under "shared".
- `overlap@{k}` = shared sources / the longer of the two lists. `kendall tau` = Kendall tau-b of the shared
  sources' ranks (needs two or more shared sources). `top-1 agreement` = share of compared cases whose first
  document is the same. Means are over the cases where the sidecar answered.
- Hit levels use the offline evaluator's rules on each path's top {k}: `strong`, `medium`, `miss`, no-answer
  correct / wrong. The stock retriever has no evidence threshold, so it "finds" whatever it returns (its evidence
  is its top {k}) and it can never answer a no-answer case correctly. A case where the sidecar did not answer is
  `not_run` for the sidecar; its current-path results stay in the report.
- Sidecar status per case: `ok`, `unavailable` (could not be initialised, or disabled), `failed` (raised),
  `timeout` (no answer within `sidecar_timeout_s`).
- *(not in evidence)* marks a current-path document the agent never received: ranked in the top {k}, but under
  the evidence threshold or left out of the context pack by its token budget. The sidecar's documents never
  reach the agent at all: it runs only for this comparison.
"""


def report_to_json(report: CompareReport) -> str:
    """The JSON report text: sorted keys, indent 2, trailing newline."""
    return json_text(report.model_dump(mode="json"))


def write_compare_report(report: CompareReport, out_dir: str | Path, name: str) -> ReportFiles:
    """Write ``<out_dir>/<name>.json``, ``<out_dir>/<name>.md`` and the charts beside them, creating ``out_dir``.

    Raises:
        ValueError: ``name`` is not a plain file name.
    """
    return write_report_files(
        out_dir,
        name,
        report_to_json(report),
        report_charts(report, name),
        lambda charts: render_markdown(report, name, charts),
    )


def report_charts(report: CompareReport, name: str) -> list[BarChart]:
    """The report's charts as data: hit levels per path, and (when the sidecar answered) rank shifts and overlap."""
    s, k = report.summary, report.k
    charts = [
        BarChart(
            file_name=f"{name}-hit-levels.png",
            title=f"Hit levels per path ({s.case_count} cases, top {k} documents each)",
            categories=["current", "sidecar"],
            series=hit_level_series([s.current, s.sidecar]),
            value_label="cases",
            stacked=True,
            colors=HIT_LEVEL_COLORS,
        )
    ]
    compared = [case.agreement for case in report.cases if case.agreement is not None]
    if not compared:
        return charts
    shifts = Counter(shared.sidecar_rank - shared.current_rank for a in compared for shared in a.shared)
    shared_counts = Counter(len(a.shared) for a in compared)
    return [
        *charts,
        BarChart(
            file_name=f"{name}-rank-shifts.png",
            title="Rank shifts of the documents both paths return",
            categories=[f"{shift:+d}" if shift else "0" for shift in range(1 - k, k)],
            series={"documents": [float(shifts[shift]) for shift in range(1 - k, k)]},
            value_label="documents",
            category_label="sidecar rank − current rank (below 0: the sidecar ranks it higher)",
            horizontal=False,
        ),
        BarChart(
            file_name=f"{name}-overlap.png",
            title=f"Overlap: documents in both top-{k} lists ({len(compared)} compared cases)",
            categories=[str(count) for count in range(k + 1)],
            series={"cases": [float(shared_counts[count]) for count in range(k + 1)]},
            value_label="cases",
            category_label=f"shared documents in the top {k}",
            horizontal=False,
        ),
    ]


def summary_rows(report: CompareReport) -> list[list[str]]:
    """The summary as ``[figure, value]`` rows, shared by the Markdown report and the CLI."""
    s = report.summary
    statuses = ", ".join(f"{status} {count}" for status, count in s.sidecar_statuses.items())
    return [
        ["cases", str(s.case_count)],
        ["sidecar status", f"{s.sidecar_status} ({statuses})" if statuses else s.sidecar_status],
        ["compared (sidecar answered)", str(s.compared)],
        [f"mean overlap@{report.k}", _number(s.mean_overlap_at_k)],
        ["mean kendall tau (cases)", f"{_number(s.mean_kendall_tau)} ({s.kendall_tau_cases})"],
        ["top-1 agreement", _number(s.top1_agreement)],
        ["cases with row differences", str(s.cases_with_differences)],
    ]


def hit_level_rows(report: CompareReport) -> tuple[list[str], list[list[str]]]:
    """Both paths' hit levels and rates side by side."""
    current, sidecar = report.summary.current, report.summary.sidecar
    header = ["", "current", "sidecar"]
    rows = [
        [name, str(getattr(current, field)), str(getattr(sidecar, field))]
        for name, field in (
            ("strong", "strong"),
            ("medium", "medium"),
            ("miss", "miss"),
            ("no-answer correct", "no_answer_correct"),
            ("no-answer cases", "no_answer"),
            ("not run", "not_run"),
        )
    ]
    rows.append(["avg first hit rank", _number(current.avg_first_hit_rank), _number(sidecar.avg_first_hit_rank)])
    rows += [
        [name, _number(current.scores[name]), _number(sidecar.scores[name])]
        for name in score_names(sorted({1, report.k}))
        if name != "fixture_coverage"
    ]
    return header, rows


def render_summary_text(report: CompareReport) -> str:
    """The summary and hit levels as aligned plain text, for a terminal."""
    header, hits = hit_level_rows(report)
    return text_table([["figure", "value", ""], *[[*row, ""] for row in summary_rows(report)], header, *hits], None)


def render_markdown(report: CompareReport, name: str, charts: ChartFiles | None = None) -> str:
    """The Markdown report: summary, where the paths disagree, hit levels, charts (when given), the two paths, one
    line per case, the cases whose hit levels differ rank by rank, definitions."""
    lines = [
        f"# Sidecar comparison: {inline(name)}",
        "",
        f"{report.summary.case_count} golden cases from `{report.golden}`: the current `lookup_knowledge` path and "
        f"the sidecar (`{report.paths['sidecar'].name}`) over the same collection, top {report.k} documents each.",
        "",
        "## Summary",
        "",
        *markdown_table(["figure", "value"], summary_rows(report), right_align_from=1),
        "",
        *_sidecar_failures(report),
        *_disagreements(report),
        "",
        "## Hit levels",
        "",
    ]
    header, rows = hit_level_rows(report)
    lines += markdown_table(header, rows, right_align_from=1)
    if charts is not None:
        lines += ["", "## Charts", "", *charts.markdown()]
    lines += ["", "## Paths", ""]
    lines += markdown_table(
        ["", "path", "score label", "ranked by", "score semantics"],
        [
            [key, code(p.name), code(p.score_label or "-"), inline(p.ranked_by), inline(p.score_semantics)]
            for key, p in report.paths.items()
        ],
    )
    settings = ", ".join(f"{key}={value}" for key, value in sorted(report.settings.items()))
    lines += ["", f"Settings: {inline(settings)}.", "", "## All cases", ""]
    lines += markdown_table(
        ["#", "case", "current", "sidecar", "top-1 same", "overlap", "tau"],
        [
            [
                str(index),
                code(case.case_id),
                _hit(case.current.hit_level, case.current.first_expected_rank),
                _sidecar_hit(case),
                "-"
                if case.agreement is None or case.agreement.top1_same is None
                else _yes_or_no(case.agreement.top1_same),
                _number(case.agreement.overlap_at_k if case.agreement else None),
                _number(case.agreement.kendall_tau if case.agreement else None),
            ]
            for index, case in enumerate(report.cases, start=1)
        ],
    )
    split = [(index, case) for index, case in enumerate(report.cases, start=1) if _levels_differ(case)]
    if split:
        lines += ["", "## The cases whose hit levels differ, rank by rank", ""]
        for index, case in split:
            lines += _case_markdown(index, case)
    else:
        lines.append("")
    lines += [
        *_DEFINITIONS.format(k=report.k).splitlines(),
        "",
        "## Regenerate",
        "",
        "Against a fresh ingest of the golden set's knowledge base (the report is byte-identical when nothing "
        "changed):",
        "",
        "```sh",
        f"kb-retrieval compare --golden {shlex.quote(report.golden)} --k {report.k} --out <this directory> "
        f"--name {shlex.quote(name)} --state-dir <state dir>",
        "```",
        "",
    ]
    return "\n".join(lines)


def disagreements(report: CompareReport) -> list[tuple[int, CaseComparison]]:
    """The cases where the paths disagree, with their 1-based place in the golden file: hit levels that differ
    first (the current path worse, then better), then the same hit level but a different first document."""

    def order(item: tuple[int, CaseComparison]) -> tuple[int, int]:
        index, case = item
        current, sidecar = (_LEVEL_ORDER.get(side.hit_level, 9) for side in (case.current, case.sidecar))
        return (0 if current > sidecar else 1 if current < sidecar else 2, index)

    chosen = [
        (index, case)
        for index, case in enumerate(report.cases, start=1)
        if _levels_differ(case) or (case.agreement is not None and case.agreement.top1_same is False)
    ]
    return sorted(chosen, key=order)


def _disagreements(report: CompareReport) -> list[str]:
    """The section the report opens with: where the two paths disagree, one line per case."""
    cases = disagreements(report)
    lines = ["## Where the paths disagree", ""]
    if not cases:
        return [*lines, "Nowhere: every case has the same hit level and the same first document on both paths."]
    differ = sum(1 for _, case in cases if _levels_differ(case))
    lines += [
        f"{len(cases)} of {report.summary.case_count} cases: {differ} with different hit levels (the current path "
        f"worse first), {len(cases) - differ} with the same hit level but a different first document.",
        "",
    ]
    lines += markdown_table(
        ["#", "case", "query", "expected", "current came first", "sidecar came first"],
        [
            [
                str(index),
                code(case.case_id),
                inline(cut_query(case.query)),
                "<br>".join(code(doc) for doc in case.expected_docs) or "(no answer expected)",
                _first(case.current),
                _first(case.sidecar) if case.sidecar.status == "ok" else f"**{case.sidecar.status.upper()}**",
            ]
            for index, case in cases
        ],
    )
    return lines


def _sidecar_failures(report: CompareReport) -> list[str]:
    """One line per distinct reason the sidecar did not answer (none when it always did)."""
    reasons = Counter((c.sidecar.status, c.sidecar.reason or "") for c in report.cases if c.sidecar.status != "ok")
    lines = [
        f"Sidecar {status} in {count} case(s): {inline(reason) or '(no reason given)'}"
        for (status, reason), count in sorted(reasons.items())
    ]
    return [*lines, ""] if lines else []


def _first(side: PathSide) -> str:
    """The path's first document (marked when the agent never received it) and the case's hit level."""
    if not side.results:
        return f"(nothing)<br>{_hit(side.hit_level, side.first_expected_rank)}"
    top = side.results[0]
    mark = f" {NOT_IN_EVIDENCE}" if top.in_evidence is False else ""
    return f"{code(top.source)}{mark}<br>{_hit(side.hit_level, side.first_expected_rank)}"


def _levels_differ(case: CaseComparison) -> bool:
    return case.sidecar.status == "ok" and case.current.hit_level != case.sidecar.hit_level


def _sidecar_hit(case: CaseComparison) -> str:
    if case.sidecar.status != "ok":
        return f"**{case.sidecar.status.upper()}**"
    return _hit(case.sidecar.hit_level, case.sidecar.first_expected_rank)


def _yes_or_no(value: bool) -> str:
    return "yes" if value else "**no**"


#: Hit levels from best to worst, to put the cases where the current path does worse first.
_LEVEL_ORDER = {"strong": 0, "no_answer_correct": 0, "medium": 1, "miss": 2, "no_answer_wrong": 2, "not_run": 3}


def _case_markdown(index: int, case: CaseComparison) -> list[str]:
    current, sidecar = case.current, case.sidecar
    head = f"current {_hit(current.hit_level, current.first_expected_rank)}"
    if sidecar.status == "ok":
        head += f" · sidecar {_hit(sidecar.hit_level, sidecar.first_expected_rank)}"
    else:
        head += f" · sidecar **{sidecar.status.upper()}**"
    if case.agreement is not None:
        a = case.agreement
        head += f" · overlap {_number(a.overlap_at_k)} · tau {_number(a.kendall_tau)}"
    lines = [f"### {index}. {code(case.case_id)} ({inline(case.scenario)})", "", f"{head}", ""]
    lines += [f"Query: {inline(case.query[:300])}", ""]
    if sidecar.status != "ok":
        lines += [f"Sidecar {sidecar.status}: {inline(sidecar.reason or '')}", ""]
    if current.status != "found":
        lines += [f"Current path: {current.status} ({inline(current.reason or '')})", ""]
    marks = {row.rank: row.differs for row in case.rows}
    count = max(len(current.results), len(sidecar.results))
    table = [
        [
            str(rank),
            _entry(current.results[rank - 1] if rank <= len(current.results) else None),
            _entry(sidecar.results[rank - 1] if rank <= len(sidecar.results) else None),
            ", ".join(marks.get(rank, [])) or "-",
        ]
        for rank in range(1, count + 1)
    ]
    if table:
        lines += markdown_table(
            [
                "rank",
                f"current {code(current.path)}",
                f"sidecar {code(sidecar.path)} (never sent to the agent)",
                "differs",
            ],
            table,
        )
        lines.append("")
    if case.agreement is not None and case.agreement.shared:
        moved = [
            f"{code(s.source)} {s.current_rank}→{s.sidecar_rank}"
            for s in case.agreement.shared
            if s.current_rank != s.sidecar_rank
        ]
        lines += [f"Shared: {len(case.agreement.shared)}; rank changes: {', '.join(moved) or 'none'}", ""]
    checks = [f"current: {c}" for c in current.failed_checks] + [
        f"sidecar: {c}" for c in sidecar.failed_checks if sidecar.status == "ok"
    ]
    if checks:
        lines += [f"Failed checks: {'; '.join(inline(c) for c in checks)}", ""]
    return lines


def _entry(result: ComparableResult | None) -> str:
    if result is None:
        return "-"
    heading = result.breadcrumb or result.title
    label = f"{result.source} > {heading}" if heading else result.source
    score = f"{inline(result.score_label)} {result.score:.{DECIMALS}f}"
    entry = f"{code(label)}<br>{inline(result.category or '-')} · {score}"
    return f"{entry}<br>{NOT_IN_EVIDENCE}" if result.in_evidence is False else entry


def _hit(level: str, rank: int | None) -> str:
    strong = {"miss": "**MISS**", "no_answer_wrong": "**WRONG no-answer**", "not_run": "**NOT RUN**"}
    text = strong.get(level, level.replace("_", " "))
    return f"{text} (rank {rank})" if rank is not None else text


def _number(value: float | None) -> str:
    return format_number(value, DECIMALS)


# --- notebook display (CompareReport._repr_html_, to_dataframe) ------------------------------------------------

COMPARE_FRAME_COLUMNS = [
    "case",
    "scenario",
    "query",
    "expected",
    "current_level",
    "sidecar_level",
    "current_first",
    "sidecar_first",
    "overlap_at_k",
    "top1_same",
]


def compare_view(report: CompareReport) -> View:
    """The comparison in a notebook: summary and hit levels side by side, the cases (disagreements first) folded."""
    header, hits = hit_level_rows(report)
    cases = sorted(report.cases, key=lambda c: not _levels_differ(c))
    case_table = Table(
        ["case", "query", "current", "sidecar", "current first", "sidecar first", f"overlap@{report.k}"],
        [
            [
                row["case"],
                row["query"],
                _hit(row["current_level"], c.current.first_expected_rank),
                _sidecar_hit(c),
                row["current_first"] or "-",
                row["sidecar_first"] or "-",
                _number(row["overlap_at_k"]),
            ]
            for c, row in ((c, _case_row(c)) for c in cases)
        ],
    )
    return View(
        f"comparison of the current path and the sidecar on {report.golden} (top {report.k})",
        lines=[(figure, value) for figure, value in summary_rows(report)],
        table=Table(header, hits),
        details=[Details(f"{len(cases)} case(s), different hit levels first", case_table)],
    )


def compare_repr(report: CompareReport) -> str:
    """A one-line repr of a comparison report: its cases, the sidecar's status and the agreement."""
    s = report.summary
    return (
        f"<CompareReport {report.golden}: {s.case_count} case(s), sidecar {s.sidecar_status}, strong "
        f"{s.current.strong} vs {s.sidecar.strong}, top-1 agreement {_number(s.top1_agreement)}>"
    )


def compare_rows(report: CompareReport) -> list[dict[str, Any]]:
    """The comparison report's cases as rows, for a DataFrame."""
    return [_case_row(c) for c in report.cases]


def _case_row(case: CaseComparison) -> dict[str, Any]:
    return {
        "case": case.case_id,
        "scenario": case.scenario,
        "query": case.query,
        "expected": ", ".join(case.expected_docs),
        "current_level": case.current.hit_level,
        "sidecar_level": case.sidecar.hit_level,
        "current_first": case.current.results[0].source if case.current.results else None,
        "sidecar_first": case.sidecar.results[0].source if case.sidecar.results else None,
        "overlap_at_k": case.agreement.overlap_at_k if case.agreement else None,
        "top1_same": case.agreement.top1_same if case.agreement else None,
    }
