"""The evaluation report: one pydantic model, written as JSON (for machines) beside Markdown (for people), with
PNG charts beside both.

All files are byte-identical when the inputs are: no timestamps, no absolute paths, sorted JSON keys, cases in
golden-file order, floats rounded by :mod:`kb_retrieval.evaluation.metrics`, charts drawn deterministically by
:mod:`kb_retrieval.reporting` (skipped with a note when matplotlib is not installed). A baseline in git therefore
changes only when retrieval results change.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from kb_retrieval.evaluation.hit_levels import HIT_RANK_CUTOFF, TOP_CANDIDATES, CaseResult, CaseStatus
from kb_retrieval.evaluation.metrics import DECIMALS, RANKING_CUTOFF, MetricSet, score_names
from kb_retrieval.reporting import (
    LOCAL_REPORTS_DIR,
    BarChart,
    ChartFiles,
    Displayed,
    ReportFiles,
    Views,
    code,
    format_number,
    golden_report_name,
    inline,
    json_text,
    markdown_table,
    text_table,
    write_report_files,
)

#: Default output directory (untracked; the committed baseline is reports/retrieval-eval, written by
#: ``make baselines``). The default report name is the golden file's (``reporting.golden_report_name``).
DEFAULT_OUT_DIR = f"{LOCAL_REPORTS_DIR}/retrieval-eval"
#: Version of the JSON layout; bump it when fields change meaning.
REPORT_SCHEMA_VERSION = 1

# How each status reads in Markdown: failures stand out in bold capitals.
_STATUS_MARKDOWN: dict[CaseStatus, str] = {
    "strong": "strong",
    "medium": "medium",
    "miss": "**MISS**",
    "no_answer_correct": "no-answer ok",
    "no_answer_wrong": "**WRONG no-answer**",
    "not_run": "**NOT RUN**",
}


_DEFINITIONS = """\
## Definitions

- **Retrieved**: the fixture's ranked candidates when the lookup returned `found=true`; nothing when it
  returned `found=false`. **Relevant**: the case's expected and acceptable documents. A relevant document
  **hits** at rank <= {hit_cutoff}, the cut-off `compare` uses too.
- **strong**: a relevant document hits and evidence coverage is met: any expected breadcrumb occurs
  in the breadcrumb or title of a retrieved relevant candidate (of its own document when it names one), or
  every expected keyword occurs in the content of the retrieved relevant candidates or of the evidence
  blocks (case-insensitive). A case listing neither breadcrumbs nor keywords meets coverage by the document
  hit alone.
- **medium**: a relevant document hits but coverage is not met.
- **MISS**: no relevant document hits.
- **no-answer** cases list no relevant documents: correct when the lookup returned `found=false` or
  `evidenceStatus` `no_evidence`, **WRONG** otherwise. They are counted apart from strong/medium/miss.
- **NOT RUN**: no fixture file for the case, or a fixture recorded for a different query. Not-run cases are
  excluded from every rate; `fixture_coverage` is the share of cases that ran.
- `recall@K` (K = {ks}): share of answerable run cases with a relevant document at rank <= K.
  `strong_rate`: strong / answerable run cases. `no_answer_accuracy`: correct / run no-answer cases.
  `avg first hit rank`: mean rank of the first relevant document over the cases that retrieved one.
- `mrr@{cutoff}` and `ndcg@{cutoff}` are computed over answerable run cases with graded relevance
  (expected 2, acceptable 1; nDCG with linear gains and log2 discount); a case that retrieved nothing
  scores 0.
- `came first`: the first retrieved document as `source > breadcrumb` (the JSON report lists the first
  {top}). *(not in evidence)* marks a candidate the agent never received: ranked, and counted as retrieved
  above, but under the evidence threshold or left out of the context pack by its token budget. Rates are
  rounded to {decimals} decimals.
"""

#: Colour of each hit level in the charts: good green, partial amber, failures red or purple, not run grey.
HIT_LEVEL_COLORS = {
    "strong": "#2ca02c",
    "medium": "#ffbf00",
    "miss": "#d62728",
    "no-answer correct": "#1f77b4",
    "no-answer wrong": "#9467bd",
    "not run": "#7f7f7f",
}
NOT_IN_EVIDENCE = "*(not in evidence)*"
#: The longest a query is shown in a report's table (the JSON keeps it whole).
QUERY_CHARS = 120


class EvalReport(Displayed, BaseModel):
    """The result of one offline evaluation run; in a notebook the summary table and the cases
    (``to_dataframe()``: one row per case)."""

    model_config = ConfigDict(frozen=True)
    views: ClassVar[Views] = Views("eval_view", "eval_repr", "eval_rows", "EVAL_FRAME_COLUMNS")

    schema_version: int = REPORT_SCHEMA_VERSION
    golden: str
    """The golden file as given: relative and ``/``-separated (see :func:`kb_retrieval.reporting.display_path`)."""
    fixtures: str
    """The fixtures directory as given: relative and ``/``-separated."""
    ks: list[int]
    """Cut-offs of ``recall@K``."""
    overall: MetricSet
    by_scenario: dict[str, MetricSet]
    cases: list[CaseResult]
    """Per-case results in golden-file order."""


def report_to_json(report: EvalReport) -> str:
    """The JSON report text: sorted keys, indent 2, trailing newline."""
    return json_text(report.model_dump(mode="json"))


def write_report(report: EvalReport, out_dir: str | Path = DEFAULT_OUT_DIR, name: str | None = None) -> ReportFiles:
    """Write ``<out_dir>/<name>.json``, ``<out_dir>/<name>.md`` and the charts beside them, creating ``out_dir``.

    Without matplotlib the charts are skipped and the Markdown says so in one line.

    Args:
        report: The report.
        out_dir: Output directory.
        name: Base file name (no directory part); default: the golden file's name.

    Returns:
        The paths written and the charts' outcome.

    Raises:
        ValueError: ``name`` is not a plain file name.
    """
    base = golden_report_name(report.golden) if name is None else name
    return write_report_files(
        out_dir,
        base,
        report_to_json(report),
        report_charts(report, base),
        lambda charts: render_markdown(report, base, charts),
    )


def report_charts(report: EvalReport, name: str | None = None) -> list[BarChart]:
    """The report's charts as data: hit levels per scenario, and the rates per scenario."""
    name = name or golden_report_name(report.golden)
    groups = {"overall": report.overall, **report.by_scenario}
    levels = hit_level_series(list(groups.values()))
    rates = [rate for rate in score_names(report.ks) if rate != "fixture_coverage"]
    return [
        BarChart(
            file_name=f"{name}-hit-levels.png",
            title=f"Hit levels per scenario ({report.overall.case_count} cases)",
            categories=list(groups),
            series=levels,
            value_label="cases",
            stacked=True,
            colors=HIT_LEVEL_COLORS,
        ),
        BarChart(
            file_name=f"{name}-rates.png",
            title="Rates per scenario (answerable or no-answer cases that ran)",
            categories=rates,
            series={group: [metrics.scores[rate] or 0.0 for rate in rates] for group, metrics in groups.items()},
            value_label="rate",
            value_max=1.0,
        ),
    ]


def hit_level_series(groups: list[MetricSet]) -> dict[str, list[float]]:
    """Each hit level's case count per group, for a stacked chart (levels no group has are left out)."""
    counts = [
        {
            "strong": m.strong,
            "medium": m.medium,
            "miss": m.miss,
            "no-answer correct": m.no_answer_correct,
            "no-answer wrong": m.no_answer - m.no_answer_correct,
            "not run": m.not_run,
        }
        for m in groups
    ]
    series = {label: [float(count[label]) for count in counts] for label in HIT_LEVEL_COLORS}
    return {label: values for label, values in series.items() if any(values)}


def summary_rows(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    """The summary table shared by the Markdown report and the CLI: one row per metric.

    Returns:
        The header (``metric``, ``overall``, then each scenario) and the rows, all as text.
    """
    groups = [report.overall, *report.by_scenario.values()]
    header = ["metric", "overall", *report.by_scenario]
    rows = [
        ["cases", *(str(m.case_count) for m in groups)],
        ["not run", *(str(m.not_run) for m in groups)],
        ["answerable (run)", *(str(m.answerable) for m in groups)],
        ["strong", *(str(m.strong) for m in groups)],
        ["medium", *(str(m.medium) for m in groups)],
        ["miss", *(str(m.miss) for m in groups)],
        ["no-answer correct / run", *(f"{m.no_answer_correct} / {m.no_answer}" for m in groups)],
        ["avg first hit rank", *(_number(m.avg_first_hit_rank) for m in groups)],
    ]
    rows += [[name, *(_number(m.scores[name]) for m in groups)] for name in score_names(report.ks)]
    return header, rows


def render_summary_text(report: EvalReport) -> str:
    """The summary table as aligned plain text, for a terminal."""
    header, rows = summary_rows(report)
    return text_table([header, *rows])


def render_markdown(report: EvalReport, name: str | None = None, charts: ChartFiles | None = None) -> str:
    """The Markdown report: title, summary, charts (when given), per-case table, definitions, how to regenerate."""
    name = name or golden_report_name(report.golden)
    overall = report.overall
    ks = " ".join(str(k) for k in report.ks)
    lines = [
        f"# Retrieval evaluation: {inline(name)}",
        "",
        f"Offline evaluation of {overall.case_count} golden cases from `{report.golden}` against the "
        f"recorded `lookup_knowledge` fixtures in `{report.fixtures}` (no Milvus, model or database).",
        "",
        "## Summary",
        "",
    ]
    header, rows = summary_rows(report)
    lines += markdown_table([inline(cell) for cell in header], rows, right_align_from=1)
    if charts is not None:
        lines += ["", "## Charts", "", *charts.markdown()]
    lines += ["", "## Cases", ""]
    case_rows = [
        [
            str(index),
            f"{code(result.case_id)}<br>{inline(result.scenario)}",
            inline(cut_query(result.query)) or "-",
            "<br>".join(code(doc) for doc in result.expected_docs) or "(no answer expected)",
            _STATUS_MARKDOWN[result.status],
            str(result.first_expected_rank) if result.first_expected_rank is not None else "-",
            _candidate_cell(result.top_candidates[0], result) if result.top_candidates else "(nothing)",
            "<br>".join(inline(check) for check in result.failed_checks) or "-",
        ]
        for index, result in enumerate(report.cases, start=1)
    ]
    lines += markdown_table(
        ["#", "case", "query", "expected", "result", "first expected rank", "came first", "failed checks"],
        case_rows,
    )
    lines += [
        "",
        *_DEFINITIONS.format(
            ks=ks, hit_cutoff=HIT_RANK_CUTOFF, cutoff=RANKING_CUTOFF, top=TOP_CANDIDATES, decimals=DECIMALS
        ).splitlines(),
        "",
        "## Regenerate",
        "",
        "From the repository root (the report is byte-identical when nothing changed):",
        "",
        "```sh",
        f"kb-retrieval eval --golden {shlex.quote(report.golden)} --fixtures {shlex.quote(report.fixtures)} "
        f"--k {ks} --out <this directory> --name {shlex.quote(name)}",
        "```",
        "",
    ]
    return "\n".join(lines)


def cut_query(query: str, limit: int = QUERY_CHARS) -> str:
    """A query on one line, cut to ``limit`` characters with "..." (for a table cell)."""
    text = " ".join(query.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _candidate_cell(label: str, result: CaseResult) -> str:
    return f"{code(label)} {NOT_IN_EVIDENCE}" if label in result.not_in_evidence else code(label)


def _number(value: float | None) -> str:
    return format_number(value, DECIMALS)
