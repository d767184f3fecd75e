"""The shared report helpers: Markdown cells, the JSON + Markdown pair, deterministic and readable charts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kb_retrieval.reporting import (
    NO_MATPLOTLIB_NOTE,
    BarChart,
    LineChart,
    code,
    display_path,
    draw_chart,
    inline,
    json_text,
    label_problems,
    markdown_table,
    png_software,
    text_table,
    write_charts,
    write_report_pair,
)

pytestmark = pytest.mark.unit

STACKED = BarChart(
    file_name="levels.png",
    title="Hit levels per scenario",
    categories=["overall", "aiops", "chat"],
    series={"strong": [26, 8, 18], "medium": [19, 13, 6], "miss": [2, 1, 1]},
    value_label="cases",
    stacked=True,
    colors={"strong": "#2ca02c"},
)
GROUPED = BarChart(
    file_name="grouped.png",
    title="Document hit@1 per golden set",
    categories=[f"runbooks / runbooks-alerts-dev-named-{i}" for i in range(11)],
    series={name: [0.5] * 11 for name in ("lookup_knowledge", "stock_dense", "stock_bm25", "stock_fusion")},
    value_label="document hit@1",
    value_max=1.0,
)
SHIFTS = BarChart(
    file_name="shifts.png",
    title="Rank shifts",
    categories=["-2", "-1", "0", "+1", "+2"],
    series={"documents": [1, 3, 40, 2, 0]},
    value_label="documents",
    horizontal=False,
)
LINES = LineChart(
    file_name="lines.png",
    title="Lookup latency by collection size (p50)",
    x_values=[1000, 10000, 100000],
    series={"lookup p50": [36.7, 72.4, 543.9], "search p50": [15.0, 40.0, 480.0]},
    x_label="chunks",
    y_label="ms",
    log_x=True,
)
CHARTS = [STACKED, GROUPED, SHIFTS, LINES]


def test_markdown_cells_cannot_break_a_table() -> None:
    assert inline("a | b <i>*x*</i>\n_y_ `z`") == "a \\| b &lt;i>\\*x\\*&lt;/i> \\_y\\_ \\`z\\`"
    assert code("a|b `c`") == "`a\\|b 'c'`"
    assert markdown_table(["k", "v"], [["a", "1"]], right_align_from=1) == ["| k | v |", "| --- | ---: |", "| a | 1 |"]


def test_text_table_aligns_columns() -> None:
    assert text_table([["metric", "value"], ["cases", "12"]]) == "metric  value\n------  -----\ncases      12"
    assert text_table([["a", "1"], ["bb", "22"]], rule_after=None) == "a    1\nbb  22"


def test_display_path_keeps_relative_paths_as_given_and_never_absolute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(__file__).parent)
    assert display_path("golden/fixtures/sample-kb/") == "golden/fixtures/sample-kb"
    assert display_path("../shared/golden/x.jsonl") == "../shared/golden/x.jsonl"
    assert display_path(Path.cwd() / "data" / "fixtures") == "data/fixtures"
    assert not display_path("/elsewhere/fixtures").startswith("/")


def test_report_pair_is_lf_sorted_json_and_refuses_paths_as_names(tmp_path: Path) -> None:
    json_path, markdown_path = write_report_pair(tmp_path / "out", "r", json_text({"b": 1, "a": [1.5]}), "# T\n")
    assert json_path.read_bytes() == b'{\n  "a": [\n    1.5\n  ],\n  "b": 1\n}\n'
    assert markdown_path.read_bytes() == b"# T\n"
    for name in ("", "..", "a/b", "a\\b"):
        with pytest.raises(ValueError, match="plain file name"):
            write_report_pair(tmp_path, name, "{}", "")


def test_charts_are_byte_identical_whatever_the_matplotlib_settings(tmp_path: Path) -> None:
    import matplotlib

    first = write_charts(CHARTS, tmp_path / "a")
    with matplotlib.rc_context({"axes.facecolor": "red", "font.size": 20, "savefig.dpi": 300, "figure.dpi": 50}):
        second = write_charts(CHARTS, tmp_path / "b")

    assert first.note is None and [c.file_name for c in first.charts] == [c.file_name for c in CHARTS]
    for chart in CHARTS:
        a, b = (tmp_path / "a" / chart.file_name), (tmp_path / "b" / chart.file_name)
        assert a.read_bytes() == b.read_bytes(), chart.file_name
        assert png_software(a) == f"matplotlib {matplotlib.__version__}"  # fixed metadata: no timestamp
        assert b"tIME" not in a.read_bytes() and b"Creation Time" not in a.read_bytes()
    assert second.markdown() == [f"![{chart.title}]({chart.file_name})" for chart in CHARTS]


def test_charts_have_titles_and_readable_labels() -> None:
    for chart in CHARTS:
        figure = draw_chart(chart)
        assert figure.get_suptitle() == chart.title
        assert label_problems(figure) == [], chart.file_name


def test_label_check_catches_overlapping_and_clipped_labels() -> None:
    # What the bench chart used to be: long two-line labels under narrow vertical bars.
    crowded = BarChart(
        file_name="crowded.png",
        title="T",
        categories=[f"runbooks\nrunbooks-alerts-dev-named-{i}" for i in range(11)],
        series={"a": [1.0] * 11, "b": [1.0] * 11},
        value_label="v",
        horizontal=False,
    )
    problems = label_problems(draw_chart(crowded))
    assert any("overlaps" in problem for problem in problems)

    figure = draw_chart(STACKED)
    figure.axes[0].set_title("a title far too long to fit into a figure of this size " * 3)
    figure.canvas.draw()
    assert any("sticks out" in problem for problem in label_problems(figure))


def test_without_matplotlib_charts_are_skipped_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_charts([STACKED], tmp_path)
    assert (tmp_path / "levels.png").is_file()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError

    skipped = write_charts([STACKED], tmp_path)

    assert skipped.charts == [] and skipped.note == NO_MATPLOTLIB_NOTE
    assert skipped.markdown() == [f"_{NO_MATPLOTLIB_NOTE}._"]
    assert not (tmp_path / "levels.png").exists()  # a stale chart would no longer match its report
