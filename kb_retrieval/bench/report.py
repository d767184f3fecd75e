"""The benchmark report's charts: document hit@1 per golden set and system, lookup latency by collection size.

Charts are data (:class:`~kb_retrieval.reporting.BarChart`, :class:`~kb_retrieval.reporting.LineChart`) drawn by
:func:`kb_retrieval.reporting.write_charts`: titled, labels that never overlap (golden sets on the y axis, the legend
below the plot), byte-identical files for the same figures.

Example:
    >>> [chart.file_name for chart in bench_charts({"quality": {}, "speed": {}})]
    []
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kb_retrieval.reporting import BarChart, Chart, ChartFiles, LineChart, write_charts

#: The systems compared, in the report's column order.
SYSTEMS = ("lookup_knowledge", "stock_dense", "stock_bm25", "stock_fusion")
# Golden-set names share this prefix; the charts drop it to keep labels short.
_COMMON_PREFIX = "runbooks-alerts-"


def bench_charts(report: dict[str, Any]) -> list[Chart]:
    """The charts the figures allow: quality when there are quality figures, latency when there are scale figures."""
    charts: list[Chart] = []
    quality = report.get("quality") or {}
    sets = [(setting, name, systems) for setting, by_name in quality.items() for name, systems in by_name.items()]
    if sets:
        charts.append(
            BarChart(
                file_name="quality_hit1.png",
                title="Document hit@1 per golden set: lookup_knowledge and the stock retrievers",
                categories=[f"{setting} / {name.removeprefix(_COMMON_PREFIX)}" for setting, name, _ in sets],
                series={system: [systems[system]["hit@1"] or 0.0 for _, _, systems in sets] for system in SYSTEMS},
                value_label="document hit@1",
                category_label="setting / golden set",
                value_max=1.0,
            )
        )
    if scale := (report.get("speed") or {}).get("scale"):
        charts.append(
            LineChart(
                file_name="latency_scale.png",
                title="Lookup latency by collection size (p50)",
                x_values=[point["chunks"] for point in scale],
                series={
                    "lookup p50": [point["p50_ms"] for point in scale],
                    "search p50": [point["search_p50_ms"] for point in scale],
                },
                x_label="chunks in collection",
                y_label="ms",
                log_x=True,
            )
        )
    return charts


def write_bench_charts(report: dict[str, Any], out_dir: Path) -> ChartFiles:
    """Draw the charts into ``out_dir`` (skipped with a note when matplotlib is missing)."""
    return write_charts(bench_charts(report), out_dir)
