"""What every report of the project shares: Markdown cells and tables, the JSON + Markdown pair, deterministic charts.

The offline evaluation (:mod:`kb_retrieval.evaluation.report`), the sidecar comparison (:mod:`sidecar.report`) and
the benchmarks (:mod:`kb_retrieval.bench.report`) write reports that are committed on purpose, so everything here is
deterministic: sorted JSON keys, LF line endings, paths relative and ``/``-separated, PNGs without timestamps, drawn
with matplotlib's defaults whatever the user's ``matplotlibrc`` says.

A chart is plain data (:class:`BarChart`, :class:`LineChart`), drawn by :mod:`kb_retrieval.charts`;
:func:`write_charts` writes a report's charts beside it, and when matplotlib is missing skips them with a one-line
note instead of failing the report.

Example:
    >>> markdown_table(["case", "result"], [[code("redis-001"), inline("strong | fine")]])
    ['| case | result |', '| --- | --- |', '| `redis-001` | strong \\\\| fine |']
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from kb_retrieval.charts import (
    CHART_DPI,
    BarChart,
    Chart,
    LineChart,
    draw_chart,
    label_problems,
    matplotlib_available,
    png_software,
    series_of,
    write_png,
)

if TYPE_CHECKING:
    import pandas as pd

# Charts are drawn by kb_retrieval.charts; these names stay importable from here.
__all__ = [
    "CHART_DPI",
    "LOCAL_REPORTS_DIR",
    "NO_MATPLOTLIB_NOTE",
    "BarChart",
    "Chart",
    "ChartFiles",
    "Displayed",
    "LineChart",
    "ReportFiles",
    "Views",
    "code",
    "display",
    "display_path",
    "draw_chart",
    "format_number",
    "golden_report_name",
    "inline",
    "json_text",
    "label_problems",
    "markdown_table",
    "matplotlib_available",
    "png_software",
    "replace_marked_section",
    "report_name_argument",
    "series_of",
    "text_table",
    "validate_report_name",
    "write_charts",
    "write_png",
    "write_report_files",
    "write_report_pair",
]

#: Where ``eval``, ``compare`` and ``fixtures record`` write unless ``--out`` names a folder: untracked (in
#: .gitignore), so trying a command never rewrites a committed baseline (``make baselines`` regenerates those).
LOCAL_REPORTS_DIR = "reports/local"
#: What a report says when charts cannot be drawn.
NO_MATPLOTLIB_NOTE = "charts skipped: matplotlib is not installed (pip install matplotlib)"

# --- Markdown ------------------------------------------------------------------------------------------------


def inline(text: str) -> str:
    """Plain text made safe for a Markdown table cell (one line; pipes, HTML and emphasis escaped)."""
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


def code(text: str) -> str:
    """Text as inline code in a Markdown table cell (pipes must still be escaped inside tables)."""
    text = " ".join(text.split()).replace("`", "'").replace("|", "\\|")
    return f"`{text}`"


def markdown_table(
    header: Sequence[str], rows: Iterable[Sequence[str]], right_align_from: int | None = None
) -> list[str]:
    """A Markdown table as lines; columns from ``right_align_from`` on are right-aligned (numbers).

    Cells are used as they are: escape them with :func:`inline` or :func:`code` first.
    """
    aligns = [
        "---:" if right_align_from is not None and column >= right_align_from else "---"
        for column in range(len(header))
    ]
    return [_markdown_row(header), _markdown_row(aligns), *(_markdown_row(row) for row in rows)]


def _markdown_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def text_table(rows: Sequence[Sequence[str]], rule_after: int | None = 0) -> str:
    """Rows as aligned plain text for a terminal: the first column left-aligned, the others right-aligned.

    Args:
        rows: The cells, all rows of the same length (the first is usually a header).
        rule_after: Index of the row after which a ``----`` rule is drawn; None for no rule.

    Example:
        >>> print(text_table([["metric", "value"], ["cases", "12"]]))
        metric  value
        ------  -----
        cases      12
    """
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))] if rows else []
    lines = [
        "  ".join(
            cell.ljust(width) if column == 0 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    if rule_after is not None and rows:
        lines.insert(rule_after + 1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def format_number(value: float | None, decimals: int) -> str:
    """A rate or mean with a fixed number of decimals; ``n/a`` when it could not be computed."""
    return "n/a" if value is None else f"{value:.{decimals}f}"


# --- files ---------------------------------------------------------------------------------------------------


def display_path(path: str | Path) -> str:
    """A path as reports show it: as given when relative, relative to the working directory when absolute;
    ``/``-separated either way, so no report holds a machine's absolute path.

    Example:
        >>> display_path("golden/./sample.jsonl")
        'golden/sample.jsonl'
        >>> display_path("../shared/golden/dev.jsonl")
        '../shared/golden/dev.jsonl'
    """
    candidate = Path(path)
    if candidate.is_absolute():
        try:
            candidate = Path(os.path.relpath(candidate))
        except ValueError:  # another drive on Windows: no relative form exists
            return candidate.name
    return candidate.as_posix()


def validate_report_name(name: str) -> str:
    """Return ``name`` if it is a plain file name (no directory part), else raise ValueError."""
    if not name or name in {".", ".."} or Path(name).name != name or "\\" in name:
        raise ValueError(f"report name must be a plain file name, got {name!r}")
    return name


def golden_report_name(golden: str | Path) -> str:
    """The default base name of a report on a golden set: the golden file's name without ``.jsonl`` (``eval`` and
    ``compare`` both name their files so, and two golden sets never overwrite each other's reports).

    Example:
        >>> golden_report_name("golden/sample-kb.jsonl")
        'sample-kb'
    """
    return Path(golden).name.removesuffix(".jsonl").removesuffix(".json") or "report"


def report_name_argument(text: str) -> str:
    """``argparse`` type of a ``--name`` option: a plain file name, else a usage error saying why."""
    try:
        return validate_report_name(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def json_text(data: Any) -> str:
    """JSON as every report writes it: sorted keys, indent 2, UTF-8 text, no NaN, trailing newline."""
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def replace_marked_section(text: str, start: str, end: str, body: str) -> str:
    r"""``text`` with what lies between the ``start`` and ``end`` marker lines replaced by ``body`` (the markers
    kept); ``text`` unchanged when either marker is missing.

    Example:
        >>> replace_marked_section("a\n<!-- s -->\nold\n<!-- e -->\nb", "<!-- s -->", "<!-- e -->", "new")
        'a\n<!-- s -->\nnew\n<!-- e -->\nb'
    """
    if start not in text or end not in text:
        return text
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def write_report_pair(out_dir: str | Path, name: str, json_content: str, markdown_text: str) -> tuple[Path, Path]:
    """Write ``<out_dir>/<name>.json`` and ``<out_dir>/<name>.md`` with LF line endings, creating ``out_dir``.

    Raises:
        ValueError: ``name`` is not a plain file name.
    """
    validate_report_name(name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, markdown_path = out / f"{name}.json", out / f"{name}.md"
    json_path.write_text(json_content, encoding="utf-8", newline="\n")
    markdown_path.write_text(markdown_text, encoding="utf-8", newline="\n")
    return json_path, markdown_path


# --- charts --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChartFiles:
    """What :func:`write_charts` did: the charts drawn, or why none were."""

    charts: list[Chart] = field(default_factory=list)
    """The charts written (empty when skipped)."""
    note: str | None = None
    """One line saying why charts were skipped, else None."""

    def markdown(self) -> list[str]:
        """The report's chart lines: an image link per chart (files beside the report), or the note."""
        if self.note is not None:
            return [f"_{inline(self.note)}._"]
        return [f"![{inline(chart.alt)}]({chart.file_name})" for chart in self.charts]


@dataclass(frozen=True)
class ReportFiles:
    """The files of one report: JSON, Markdown, and the charts beside them (or the note saying why none)."""

    json: Path
    markdown: Path
    charts: ChartFiles

    def paths(self) -> list[Path]:
        """Every file written, JSON and Markdown first."""
        return [self.json, self.markdown, *(self.markdown.parent / chart.file_name for chart in self.charts.charts)]

    def summary(self) -> str:
        """One line for a terminal: what was written (and why charts were not)."""
        written = ", ".join(path.as_posix() for path in self.paths())
        return f"wrote {written}" + (f"\n{self.charts.note}" if self.charts.note else "")


def write_report_files(
    out_dir: str | Path,
    name: str,
    json_content: str,
    charts: Sequence[Chart],
    render_markdown: Callable[[ChartFiles], str],
) -> ReportFiles:
    """Draw the charts, then write the JSON and the Markdown that links them (``render_markdown(charts drawn)``).

    Raises:
        ValueError: ``name`` is not a plain file name.
    """
    drawn = write_charts(charts, out_dir)
    json_path, markdown_path = write_report_pair(out_dir, name, json_content, render_markdown(drawn))
    return ReportFiles(json_path, markdown_path, drawn)


def write_charts(charts: Sequence[Chart], out_dir: str | Path) -> ChartFiles:
    """Draw each chart to ``<out_dir>/<file_name>``; without matplotlib remove stale ones and return a note.

    The files are byte-identical for the same charts and the same matplotlib version.
    """
    out = Path(out_dir)
    for chart in charts:
        validate_report_name(chart.file_name)
    if not matplotlib_available():
        for chart in charts:  # a chart left from an earlier run would no longer match its report
            (out / chart.file_name).unlink(missing_ok=True)
        return ChartFiles(note=NO_MATPLOTLIB_NOTE)
    out.mkdir(parents=True, exist_ok=True)
    for chart in charts:
        write_png(draw_chart(chart), out / chart.file_name)
    return ChartFiles(charts=list(charts))


# --- notebook display ------------------------------------------------------------------------------------------


def display(name: str) -> Any:
    """A function of :mod:`kb_retrieval.display` (or ``module:name`` of another module), loaded by name on first
    use: the view imports the contracts, the contracts only call it when a notebook shows one (so importing a
    contract never loads the view)."""
    module, _, attribute = name.rpartition(":")
    return getattr(import_module(module or "kb_retrieval.display"), attribute)


class Views(NamedTuple):
    """The names, in :mod:`kb_retrieval.display`, of what draws one kind of object."""

    view: str
    repr: str
    rows: str
    columns: str


class Displayed:
    """Notebook display of a contract or report: ``_repr_html_``, ``_repr_markdown_``, a short ``repr`` and
    ``to_dataframe()``, all drawn by :mod:`kb_retrieval.display` (the functions ``views`` names)."""

    views: ClassVar[Views]

    def __repr__(self) -> str:
        return str(display(self.views.repr)(self))

    def _repr_html_(self) -> str:
        return str(display("view_html")(display(self.views.view)(self)))

    def _repr_markdown_(self) -> str:
        return str(display("view_markdown")(display(self.views.view)(self)))

    def to_dataframe(self) -> pd.DataFrame:
        """The object's table as a pandas DataFrame (pandas is in the ``notebook`` extra)."""
        rows = display(self.views.rows)(self)
        columns = display(self.views.columns)
        return display("frame")(rows, columns(rows) if callable(columns) else columns)
