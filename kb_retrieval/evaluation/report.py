"""The evaluation report: one pydantic model, written as JSON (for machines) beside Markdown (for people).

Both files are byte-identical when the inputs are: no timestamps, no absolute paths, sorted JSON keys,
cases in golden-file order, floats rounded by :mod:`kb_retrieval.evaluation.metrics`. A baseline in git
therefore changes only when retrieval results change.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kb_retrieval.evaluation.hit_levels import TOP_CANDIDATES, CaseResult, CaseStatus
from kb_retrieval.evaluation.metrics import DECIMALS, RANKING_CUTOFF, MetricSet, score_names

#: Default output directory (the retrieval evaluation documentation area) and report name.
DEFAULT_OUT_DIR = "reports/retrieval-eval"
DEFAULT_REPORT_NAME = "baseline"
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
  returned `found=false`. **Relevant**: the case's expected and acceptable documents.
- **strong**: a relevant document is retrieved and evidence coverage is met: any expected breadcrumb occurs
  in the breadcrumb or title of a retrieved relevant candidate (of its own document when it names one), or
  every expected keyword occurs in the content of the retrieved relevant candidates or of the evidence
  blocks (case-insensitive). A case listing neither breadcrumbs nor keywords meets coverage by the document
  hit alone.
- **medium**: a relevant document is retrieved but coverage is not met.
- **MISS**: no relevant document is retrieved.
- **no-answer** cases list no relevant documents: correct when the lookup returned `found=false` or
  `evidenceStatus` `no_evidence`, **WRONG** otherwise. They are counted apart from strong/medium/miss.
- **NOT RUN**: no fixture file for the case, or a fixture recorded for a different query. Not-run cases are
  excluded from every rate; `fixture_coverage` is the share of cases that ran.
- `recall@K` (K = {ks}): share of answerable run cases with a relevant document at rank <= K.
  `strong_rate`: strong / answerable run cases. `no_answer_accuracy`: correct / run no-answer cases.
  `avg first hit rank`: mean rank of the first relevant document over the cases that retrieved one.
- `mrr@{cutoff}` and `ndcg@{cutoff}` are computed by ranx over answerable run cases with graded relevance
  (expected 2, acceptable 1; nDCG with linear gains and log2 discount); a case that retrieved nothing
  scores 0.
- `top candidates`: the first {top} retrieved documents as `source > breadcrumb`. Rates are rounded to
  {decimals} decimals.
"""


class EvalReport(BaseModel):
    """The result of one offline evaluation run."""

    model_config = ConfigDict(frozen=True)

    schema_version: int = REPORT_SCHEMA_VERSION
    golden: str
    """The golden file, relative and ``/``-separated, as given."""
    fixtures: str
    """The fixtures directory, relative and ``/``-separated, as given."""
    ks: list[int]
    """Cut-offs of ``recall@K``."""
    overall: MetricSet
    by_scenario: dict[str, MetricSet]
    cases: list[CaseResult]
    """Per-case results in golden-file order."""


def report_to_json(report: EvalReport) -> str:
    """The JSON report text: sorted keys, indent 2, trailing newline."""
    data = report.model_dump(mode="json")
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def write_report(
    report: EvalReport, out_dir: str | Path = DEFAULT_OUT_DIR, name: str = DEFAULT_REPORT_NAME
) -> tuple[Path, Path]:
    """Write ``<out_dir>/<name>.json`` and ``<out_dir>/<name>.md``, creating ``out_dir``.

    Args:
        report: The report.
        out_dir: Output directory.
        name: Base file name (no directory part).

    Returns:
        The JSON and Markdown paths.

    Raises:
        ValueError: ``name`` is not a plain file name.
    """
    return write_report_pair(out_dir, name, report_to_json(report), render_markdown(report, name))


def write_report_pair(out_dir: str | Path, name: str, json_text: str, markdown_text: str) -> tuple[Path, Path]:
    """Write ``<out_dir>/<name>.json`` and ``.md`` with LF line endings, creating ``out_dir``."""
    validate_report_name(name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, markdown_path = out / f"{name}.json", out / f"{name}.md"
    json_path.write_text(json_text, encoding="utf-8", newline="\n")
    markdown_path.write_text(markdown_text, encoding="utf-8", newline="\n")
    return json_path, markdown_path


def validate_report_name(name: str) -> str:
    """Return ``name`` if it is a plain file name (no directory part), else raise ValueError."""
    if not name or name in {".", ".."} or Path(name).name != name or "\\" in name:
        raise ValueError(f"report name must be a plain file name, got {name!r}")
    return name


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
    table = [header, *rows]
    widths = [max(len(line[column]) for line in table) for column in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(width) if column == 0 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in table
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def render_markdown(report: EvalReport, name: str = DEFAULT_REPORT_NAME) -> str:
    """The Markdown report: title, summary, per-case table, definitions, how to regenerate."""
    overall = report.overall
    ks = " ".join(str(k) for k in report.ks)
    lines = [
        f"# Retrieval evaluation: {_inline(name)}",
        "",
        f"Offline evaluation of {overall.case_count} golden cases from `{report.golden}` against the "
        f"recorded `lookup_knowledge` fixtures in `{report.fixtures}` (no Milvus, model or database).",
        "",
        "## Summary",
        "",
    ]
    header, rows = summary_rows(report)
    lines += _markdown_table([_inline(cell) for cell in header], rows, right_align_from=1)
    lines += ["", "## Cases", ""]
    case_rows = [
        [
            str(index),
            _code(result.case_id),
            _inline(result.scenario),
            _STATUS_MARKDOWN[result.status],
            str(result.first_expected_rank) if result.first_expected_rank is not None else "-",
            "<br>".join(_code(label) for label in result.top_candidates) or "-",
            "<br>".join(_inline(check) for check in result.failed_checks) or "-",
        ]
        for index, result in enumerate(report.cases, start=1)
    ]
    lines += _markdown_table(
        ["#", "case", "scenario", "result", "first expected rank", "top candidates", "failed checks"],
        case_rows,
    )
    lines += [
        "",
        *_DEFINITIONS.format(ks=ks, cutoff=RANKING_CUTOFF, top=TOP_CANDIDATES, decimals=DECIMALS).splitlines(),
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


def _markdown_table(header: list[str], rows: list[list[str]], right_align_from: int | None = None) -> list[str]:
    aligns = [
        "---:" if right_align_from is not None and column >= right_align_from else "---"
        for column in range(len(header))
    ]
    return [_markdown_row(header), _markdown_row(aligns), *(_markdown_row(row) for row in rows)]


def _markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _inline(text: str) -> str:
    """Plain text made safe for a Markdown table cell."""
    text = " ".join(text.split())
    for char, escaped in (
        ("\\", "\\\\"),
        ("|", "\\|"),
        ("<", "&lt;"),
        ("*", "\\*"),
        ("_", "\\_"),
        ("`", "\\`"),
    ):
        text = text.replace(char, escaped)
    return text


def _code(text: str) -> str:
    """Text as inline code in a Markdown table cell (pipes must still be escaped inside tables)."""
    text = " ".join(text.split()).replace("`", "'").replace("|", "\\|")
    return f"`{text}`"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.{DECIMALS}f}"
