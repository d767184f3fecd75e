from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from kb_retrieval.evaluation import EvalReport, evaluate, render_markdown, write_report
from kb_retrieval.evaluation.report import report_charts
from kb_retrieval.reporting import display_path, draw_chart, label_problems

pytestmark = pytest.mark.unit

CHARTS = ["baseline-hit-levels.png", "baseline-rates.png"]


def test_reports_and_charts_are_byte_identical_across_runs_and_directories(
    golden_path: Path, fixtures_dir: Path, tmp_path: Path
) -> None:
    first = write_report(evaluate(golden_path, fixtures_dir), tmp_path / "one", "baseline")
    second = write_report(evaluate(golden_path, fixtures_dir), tmp_path / "two" / "nested", "baseline")

    assert [path.name for path in first.paths()] == ["baseline.json", "baseline.md", *CHARTS]
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == sorted(["baseline.json", "baseline.md", *CHARTS])
    for a, b in zip(first.paths(), second.paths(), strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name
    assert first.charts.note is None


def test_charts_are_linked_from_the_markdown_titled_and_readable(
    golden_path: Path, fixtures_dir: Path, tmp_path: Path
) -> None:
    report = evaluate(golden_path, fixtures_dir)
    files = write_report(report, tmp_path, "baseline")
    markdown = files.markdown.read_text(encoding="utf-8")

    sections = [line for line in markdown.splitlines() if line.startswith("## ")]
    assert sections == ["## Summary", "## Charts", "## Cases", "## Definitions", "## Regenerate"]
    for name in CHARTS:
        assert f"]({name})" in markdown  # relative link to the file beside the report
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
    hit_levels, rates = report_charts(report, "baseline")
    assert hit_levels.title.startswith("Hit levels per scenario") and rates.title.startswith("Rates per scenario")
    assert hit_levels.categories == ["overall", "aiops", "chat"]
    # The stacked hit levels add up to the case counts of each group.
    totals = [sum(values) for values in zip(*hit_levels.series.values(), strict=True)]
    assert totals == [report.overall.case_count, *(m.case_count for m in report.by_scenario.values())]
    for chart in (hit_levels, rates):
        assert label_problems(draw_chart(chart)) == []


def test_regenerate_line_shows_the_paths_as_given(
    golden_path: Path, fixtures_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "repo"
    shutil.copytree(golden_path.parent, work / "golden" / "nested")
    monkeypatch.chdir(work)

    relative = render_markdown(evaluate("golden/nested/golden.jsonl", "golden/nested/fixtures"))
    absolute = render_markdown(evaluate(work / "golden/nested/golden.jsonl", work / "golden/nested/fixtures"))

    for markdown in (relative, absolute):
        regenerate = next(line for line in markdown.splitlines() if line.startswith("kb-retrieval eval "))
        assert "--golden golden/nested/golden.jsonl --fixtures golden/nested/fixtures " in regenerate


def test_report_holds_no_absolute_or_output_paths(
    golden_path: Path, fixtures_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Inputs given as absolute paths are stored relative to the working directory.
    work = tmp_path / "repo"
    shutil.copytree(golden_path.parent, work / "golden")
    monkeypatch.chdir(work)

    report = evaluate(work / "golden" / golden_path.name, (work / "golden" / fixtures_dir.name).resolve())
    files = write_report(report, work / "out")

    assert (report.golden, report.fixtures) == ("golden/golden.jsonl", "golden/fixtures")
    for path in (files.json, files.markdown):
        text = path.read_text(encoding="utf-8")
        assert str(tmp_path) not in text
        assert "golden/golden.jsonl" in text


def test_display_path() -> None:
    assert display_path("golden/./sample.jsonl") == "golden/sample.jsonl"
    assert display_path("../shared/golden/dev.jsonl") == "../shared/golden/dev.jsonl"
    assert display_path(Path.cwd() / "a" / "b.jsonl") == "a/b.jsonl"
    assert not os.path.isabs(display_path("/somewhere/else.jsonl"))


def test_json_report_is_sorted_and_loads_back(golden_path: Path, fixtures_dir: Path, tmp_path: Path) -> None:
    text = write_report(evaluate(golden_path, fixtures_dir), tmp_path).json.read_text(encoding="utf-8")
    data = json.loads(text)

    assert text == json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    report = EvalReport.model_validate(data)
    assert [case.case_id for case in report.cases][:2] == ["chat-strong-breadcrumb", "aiops-strong-keywords"]
    assert "ranking" not in data["cases"][0]
    assert data["ks"] == [1, 3, 5, 10]
    assert data["cases"][3] == {
        "case_id": "chat-miss",
        "scenario": "chat",
        "query": "How do I rotate the TLS certificate of the ingress?",
        "expected_docs": ["tls/cert-rotation.md"],
        "status": "miss",
        "first_expected_rank": None,
        "top_candidates": ["nginx/ingress-5xx.md > Ingress 5xx > Diagnosis", "k8s/secrets.md > Secrets > Rotation"],
        "not_in_evidence": ["k8s/secrets.md > Secrets > Rotation"],
        "failed_checks": ["expected doc not retrieved"],
    }


def test_markdown_reads_on_its_own(golden_path: Path, fixtures_dir: Path) -> None:
    markdown = render_markdown(evaluate(golden_path, fixtures_dir), "baseline")
    lines = markdown.splitlines()

    assert lines[0] == "# Retrieval evaluation: baseline"
    assert lines[2].startswith("Offline evaluation of 9 golden cases from `")
    sections = [line for line in lines if line.startswith("## ")]
    assert sections == ["## Summary", "## Cases", "## Definitions", "## Regenerate"]  # no charts unless drawn
    assert "| metric | overall | aiops | chat |" in lines
    assert "| recall@5 | 0.6000 | 0.6667 | 0.5000 |" in lines
    rows = {line.split(" | ")[1].split("<br>")[0]: line for line in lines if line.startswith("| ") and " | `" in line}
    assert "**MISS**" in rows["`chat-miss`"]
    assert "**MISS**" in rows["`aiops-miss-withheld`"]
    assert "**WRONG no-answer**" in rows["`aiops-no-answer-wrong`"]
    assert "**NOT RUN**" in rows["`chat/missing fixture`"]
    assert "| strong | 1 |" in rows["`chat-strong-breadcrumb`"]
    assert "K = 1 3 5 10" in markdown
    assert markdown.endswith("```\n")


def test_markdown_escapes_table_breaking_text(golden_path: Path, fixtures_dir: Path) -> None:
    report = evaluate(golden_path, fixtures_dir)
    case = report.cases[0].model_copy(
        update={"case_id": "a|b", "top_candidates": ["x.md > A | B"], "failed_checks": ["keyword 'a|<b>' not found"]}
    )
    markdown = render_markdown(report.model_copy(update={"cases": [case]}))

    row = next(line for line in markdown.splitlines() if line.startswith("| 1 |"))
    assert row.count(" | ") == 7  # eight cells, no stray separators
    assert "&lt;b>" in row


@pytest.mark.parametrize("name", ["", "..", "a/b", "../x"])
def test_report_name_must_be_a_plain_file_name(
    golden_path: Path, fixtures_dir: Path, tmp_path: Path, name: str
) -> None:
    with pytest.raises(ValueError, match="plain file name"):
        write_report(evaluate(golden_path, fixtures_dir), tmp_path, name)


def test_candidates_the_agent_never_received_are_marked(golden_path: Path, fixtures_dir: Path) -> None:
    report = evaluate(golden_path, fixtures_dir)
    markdown = render_markdown(report)
    row = next(line for line in markdown.splitlines() if line.startswith("| 4 | `chat-miss`"))
    cells = row.split(" | ")
    assert cells[2:4] == ["How do I rotate the TLS certificate of the ingress?", "`tls/cert-rotation.md`"]
    assert cells[6] == "`nginx/ingress-5xx.md > Ingress 5xx > Diagnosis`"  # came first, and the agent got it
    # A first candidate the agent never received is marked in its cell.
    case = report.cases[3].model_copy(update={"not_in_evidence": [report.cases[3].top_candidates[0]]})
    marked = render_markdown(report.model_copy(update={"cases": [case]}))
    row = next(line for line in marked.splitlines() if line.startswith("| 1 | `chat-miss`"))
    assert row.split(" | ")[6] == "`nginx/ingress-5xx.md > Ingress 5xx > Diagnosis` *(not in evidence)*"
    assert "*(not in evidence)* marks a candidate the agent never received" in " ".join(markdown.split())
