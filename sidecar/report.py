"""The comparison report as JSON (for machines) beside Markdown (for people).

Deterministic like the evaluation report: sorted JSON keys, no timestamps or timings, no absolute paths, floats
rounded to 4 decimals, cases in golden-file order. Two runs over the same collection give byte-identical files.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from kb_retrieval.evaluation.metrics import score_names
from kb_retrieval.evaluation.report import _code, _inline, _markdown_table, write_report_pair
from sidecar.comparison import DECIMALS, CaseComparison, CompareReport
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
"""


def report_to_json(report: CompareReport) -> str:
    """The JSON report text: sorted keys, indent 2, trailing newline."""
    data = report.model_dump(mode="json")
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def write_compare_report(report: CompareReport, out_dir: str | Path, name: str) -> tuple[Path, Path]:
    """Write ``<out_dir>/<name>.json`` and ``<out_dir>/<name>.md``, creating ``out_dir``."""
    return write_report_pair(out_dir, name, report_to_json(report), render_markdown(report, name))


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
    table = [["figure", "value", ""], *[[*row, ""] for row in summary_rows(report)], header, *hits]
    widths = [max(len(line[column]) for line in table) for column in range(3)]
    return "\n".join(
        "  ".join(
            cell.ljust(width) if column == 0 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in table
    )


def render_markdown(report: CompareReport, name: str) -> str:
    """The Markdown report: summary, hit levels, the two paths, every case side by side, definitions."""
    lines = [
        f"# Sidecar comparison: {_inline(name)}",
        "",
        f"{report.summary.case_count} golden cases from `{report.golden}`: the current `lookup_knowledge` path and "
        f"the sidecar (`{report.paths['sidecar'].name}`) over the same collection, top {report.k} documents each.",
        "",
        "## Summary",
        "",
        *_markdown_table(["figure", "value"], summary_rows(report), right_align_from=1),
        "",
        "## Hit levels",
        "",
    ]
    header, rows = hit_level_rows(report)
    lines += _markdown_table(header, rows, right_align_from=1)
    lines += ["", "## Paths", ""]
    lines += _markdown_table(
        ["", "path", "score label", "ranked by", "score semantics"],
        [
            [key, _code(p.name), _code(p.score_label or "-"), _inline(p.ranked_by), _inline(p.score_semantics)]
            for key, p in report.paths.items()
        ],
    )
    settings = ", ".join(f"{key}={value}" for key, value in sorted(report.settings.items()))
    lines += ["", f"Settings: {_inline(settings)}.", "", "## Cases", ""]
    for index, case in enumerate(report.cases, start=1):
        lines += _case_markdown(index, case)
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
    lines = [f"### {index}. {_code(case.case_id)} ({_inline(case.scenario)})", "", f"{head}", ""]
    lines += [f"Query: {_inline(case.query[:300])}", ""]
    if sidecar.status != "ok":
        lines += [f"Sidecar {sidecar.status}: {_inline(sidecar.reason or '')}", ""]
    if current.status != "found":
        lines += [f"Current path: {current.status} ({_inline(current.reason or '')})", ""]
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
        lines += _markdown_table(
            ["rank", f"current {_code(current.path)}", f"sidecar {_code(sidecar.path)}", "differs"], table
        )
        lines.append("")
    if case.agreement is not None and case.agreement.shared:
        moved = [
            f"{_code(s.source)} {s.current_rank}→{s.sidecar_rank}"
            for s in case.agreement.shared
            if s.current_rank != s.sidecar_rank
        ]
        lines += [f"Shared: {len(case.agreement.shared)}; rank changes: {', '.join(moved) or 'none'}", ""]
    checks = [f"current: {c}" for c in current.failed_checks] + [
        f"sidecar: {c}" for c in sidecar.failed_checks if sidecar.status == "ok"
    ]
    if checks:
        lines += [f"Failed checks: {'; '.join(_inline(c) for c in checks)}", ""]
    return lines


def _entry(result: ComparableResult | None) -> str:
    if result is None:
        return "-"
    heading = result.breadcrumb or result.title
    label = f"{result.source} > {heading}" if heading else result.source
    score = f"{_inline(result.score_label)} {result.score:.{DECIMALS}f}"
    return f"{_code(label)}<br>{_inline(result.category or '-')} · {score}"


def _hit(level: str, rank: int | None) -> str:
    strong = {"miss": "**MISS**", "no_answer_wrong": "**WRONG no-answer**", "not_run": "**NOT RUN**"}
    text = strong.get(level, level.replace("_", " "))
    return f"{text} (rank {rank})" if rank is not None else text


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.{DECIMALS}f}"
