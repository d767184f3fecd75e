"""Charts as data, drawn deterministically: :class:`BarChart` and :class:`LineChart`, drawn by :func:`draw_chart` on an
Agg canvas with matplotlib's default style whatever the user's ``matplotlibrc`` says, written by :func:`write_png`
without timestamps, and checked by :func:`label_problems` (no label cut off or overlapping).

matplotlib is a development/benchmark extra, not a runtime dependency: it is imported only when a chart is drawn (no
pyplot, no global backend switch, so a notebook keeps its inline plots). The reports that link charts (Markdown, the
JSON + Markdown pair, the note when matplotlib is missing) are :mod:`kb_retrieval.reporting`'s.

Example:
    >>> BarChart("hit-levels.png", "Hit levels", ["aiops"], {"strong": [8]}, value_label="cases").alt
    'Hit levels'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from itertools import cycle
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Resolution of every chart (pixels per inch).
CHART_DPI = 100


@dataclass(frozen=True)
class BarChart:
    """Bars as data: one bar (or stack, or group) per category, one value per category in each series.

    Example:
        >>> chart = BarChart("hit-levels.png", "Hit levels per scenario", ["aiops", "chat"],
        ...                  {"strong": [8, 18], "miss": [1, 0]}, value_label="cases", stacked=True)
        >>> chart.alt
        'Hit levels per scenario'
    """

    file_name: str
    """The PNG's file name, written beside the report."""
    title: str
    categories: list[str]
    series: dict[str, list[float]]
    """Series label -> one value per category (the legend lists the labels in this order)."""
    value_label: str
    category_label: str = ""
    stacked: bool = False
    """Stack the series (parts of a whole) instead of grouping them side by side."""
    horizontal: bool = True
    """Categories on the y axis: long labels stay readable and never collide."""
    value_max: float | None = None
    """Fixed end of the value axis (e.g. 1.0 for rates); None to fit the data."""
    colors: dict[str, str] = field(default_factory=dict)
    """Optional fixed colour per series label (any matplotlib colour); others follow the default cycle."""

    @property
    def alt(self) -> str:
        """The Markdown alt text."""
        return self.title


@dataclass(frozen=True)
class LineChart:
    """Lines as data: one line per series over shared x values."""

    file_name: str
    title: str
    x_values: list[float]
    series: dict[str, list[float]]
    x_label: str
    y_label: str
    log_x: bool = False

    @property
    def alt(self) -> str:
        """The Markdown alt text."""
        return self.title


Chart = BarChart | LineChart


def matplotlib_available() -> bool:
    """Whether charts can be drawn (matplotlib imports)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def draw_chart(chart: Chart) -> Figure:
    """The chart as a matplotlib ``Figure`` on an Agg canvas (drawn with matplotlib's default style)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with _default_style():
        if isinstance(chart, BarChart):
            figure = Figure(figsize=_bar_size(chart), layout="constrained")
            FigureCanvasAgg(figure)
            _draw_bars(figure, chart)
        else:
            figure = Figure(figsize=(6.4, 4.0), layout="constrained")
            FigureCanvasAgg(figure)
            _draw_lines(figure, chart)
        figure.canvas.draw()  # lay out now, under the default style
    return figure


def write_png(figure: Figure, path: str | Path) -> Path:
    """Save a figure as a PNG with fixed metadata (no timestamp; the software line names matplotlib's version)."""
    import matplotlib

    target = Path(path)
    metadata = {"Software": f"matplotlib {matplotlib.__version__}"}
    with _default_style():  # savefig reads its own settings (face colour, bbox, ...) from rcParams
        figure.savefig(target, format="png", dpi=CHART_DPI, metadata=metadata)
    return target


def _default_style() -> AbstractContextManager[None]:
    """matplotlib's default style for the duration, whatever the user's ``matplotlibrc`` or notebook set."""
    import matplotlib.style

    return matplotlib.style.context("default")


def png_software(path: str | Path) -> str | None:
    """The ``Software`` text of a PNG written by :func:`write_png` (which matplotlib drew it), or None."""
    data = Path(path).read_bytes()
    marker = b"tEXtSoftware\x00"
    start = data.find(marker)
    if start < 0:
        return None
    length = int.from_bytes(data[start - 4 : start], "big")
    return data[start + len(marker) : start + 4 + length].decode("latin-1")


def label_problems(figure: Figure) -> list[str]:
    """What makes a drawn chart hard to read: visible texts (title, axis and tick labels, legend entries) that
    overlap one another or stick out of the figure. Empty for a good chart."""
    from matplotlib.text import Text

    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    texts = [text for text in figure.findobj(Text) if isinstance(text, Text)]
    tick_labels: set[int] = set()
    shown: list[Text] = []
    for ax in figure.axes:  # tick labels exist for ticks outside the view too; only those inside are drawn
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            slack = 1e-9 * (high - low)
            for ticks, locs in (
                (axis.get_major_ticks(), axis.get_majorticklocs()),
                (axis.get_minor_ticks(), axis.get_minorticklocs()),
            ):
                for tick, loc in zip(ticks, locs, strict=False):
                    tick_labels.update((id(tick.label1), id(tick.label2)))
                    if low - slack <= loc <= high + slack:
                        shown += [tick.label1, tick.label2]
    drawn = [text for text in texts if id(text) not in tick_labels] + shown
    boxes = [
        (text.get_text(), text.get_window_extent(renderer))
        for text in drawn
        if text.get_visible() and text.get_text().strip()
    ]
    bounds = figure.bbox
    problems = [
        f"{label!r} sticks out of the figure"
        for label, box in boxes
        if box.x0 < bounds.x0 - 0.5 or box.y0 < bounds.y0 - 0.5 or box.x1 > bounds.x1 + 0.5 or box.y1 > bounds.y1 + 0.5
    ]
    problems += [
        f"{a!r} overlaps {b!r}"
        for index, (a, box_a) in enumerate(boxes)
        for b, box_b in boxes[index + 1 :]
        if box_a.width > 0 and box_b.width > 0 and box_a.overlaps(box_b)
    ]
    return problems


def _bar_size(chart: BarChart) -> tuple[float, float]:
    # Room per bar: enough for a tick label per category, since labels sit one per category (or per group).
    per_category = 0.4 if chart.stacked else 0.15 * max(2, len(chart.series))
    if chart.horizontal:
        return (7.5, max(2.6, 1.8 + per_category * len(chart.categories)))
    return (max(6.4, 1.5 + 1.5 * per_category * len(chart.categories)), 4.0)


def _draw_bars(figure: Figure, chart: BarChart) -> None:
    ax = figure.add_subplot()
    count = len(chart.series)
    positions = list(range(len(chart.categories)))
    width = 0.8 if chart.stacked else 0.8 / max(1, count)
    offsets = [0.0] * len(positions)
    for index, (label, values) in enumerate(chart.series.items()):
        where = positions if chart.stacked else [p - 0.4 + width * (index + 0.5) for p in positions]
        color = chart.colors.get(label)
        if chart.horizontal:
            ax.barh(where, values, height=width, left=offsets if chart.stacked else None, label=label, color=color)
        else:
            ax.bar(where, values, width=width, bottom=offsets if chart.stacked else None, label=label, color=color)
        if chart.stacked:
            offsets = [a + b for a, b in zip(offsets, values, strict=True)]
    if chart.horizontal:
        ax.set_yticks(positions, chart.categories)
        ax.invert_yaxis()  # the first category on top, as in the report's tables
        ax.set_xlabel(chart.value_label)
        ax.set_ylabel(chart.category_label)
        if chart.value_max is not None:
            ax.set_xlim(0, chart.value_max)
    else:
        ax.set_xticks(positions, chart.categories)
        ax.set_ylabel(chart.value_label)
        ax.set_xlabel(chart.category_label)
        if chart.value_max is not None:
            ax.set_ylim(0, chart.value_max)
    figure.suptitle(chart.title)  # centred on the whole figure: room for a long title beside long tick labels
    if count > 1:
        figure.legend(loc="outside lower center", ncols=min(count, 4), fontsize="small", frameon=False)


def _draw_lines(figure: Figure, chart: LineChart) -> None:
    ax = figure.add_subplot()
    for marker, (label, values) in zip(cycle("osd^v<>"), chart.series.items()):
        ax.plot(chart.x_values, values, marker=marker, label=label)
    if chart.log_x:
        ax.set_xscale("log")
    ax.set_xlabel(chart.x_label)
    ax.set_ylabel(chart.y_label)
    figure.suptitle(chart.title)
    if len(chart.series) > 1:
        ax.legend(fontsize="small")


def series_of(rows: Mapping[str, Mapping[str, float]], labels: Sequence[str]) -> dict[str, list[float]]:
    """Turn ``{category: {series: value}}`` into ``{series: [value per category]}`` (missing values are 0)."""
    return {label: [float(row.get(label, 0.0)) for row in rows.values()] for label in labels}
