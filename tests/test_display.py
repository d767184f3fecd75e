"""Results and reports in a notebook: HTML and Markdown with the terminal's words, a short repr, DataFrames.

The results are real ones: the lookups the committed sample-KB fixtures froze (a found one whose budget left
documents out, a no-evidence one), read back as ``LookupResult``.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from kb_retrieval.evaluation.fixtures import load_fixture
from kb_retrieval.evaluation.golden import load_golden
from kb_retrieval.evaluation.runner import evaluate
from kb_retrieval.models import LookupResult
from kb_retrieval.result import relevance
from kb_retrieval.scoring_profile import BUILT_IN_PROFILE
from kb_retrieval.terminal import completeness_in_words, why

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "golden" / "sample-kb.jsonl"
FIXTURES = REPO / "golden" / "fixtures" / "sample-kb"
FOUND = "chat-k8s-003"  # three evidence documents
NOT_FOUND = "noanswer-001"


def _result(case_id: str) -> LookupResult:
    return LookupResult.model_validate(json.loads((FIXTURES / f"{case_id}.json").read_text())["result"])


def _cells(text: str) -> list[list[str]]:
    """The main table's rows of an HTML fragment, cells unescaped."""
    body = text.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)] for row in body.split("</tr>") if row]


def test_a_found_result_shows_the_evidence_table_in_the_terminals_words():
    result = _result(FOUND)
    # The committed fixtures fit the default budget whole: mark one document cut and one left out, as a smaller
    # budget would, so that every mark is drawn.
    sources = [b.source for b in result.evidence_blocks]
    assert len(sources) >= 3
    result.context_pack.summary.truncated_sources = [sources[1]]
    result.context_pack.summary.omitted_sources = [sources[2]]
    page = result._repr_html_()
    summary = result.context_pack.summary
    omitted, cut = set(summary.omitted_sources), set(summary.truncated_sources)
    assert omitted and cut
    rows = _cells(page)
    assert [row[1] for row in rows] == [b.source for b in result.evidence_blocks]
    for row, block in zip(rows, result.evidence_blocks, strict=True):
        assert row[4] == ("left out" if block.source in omitted else "cut" if block.source in cut else "in pack")
        assert row[5] == why(block)  # the CLI's wording, not the raw codes
        assert row[3] == f"{relevance([block], BUILT_IN_PROFILE)} {block.similarity:.2f}"
        assert "l1_semantic:" not in row[5]
    assert html.escape(result.confidence) in page
    assert html.escape(completeness_in_words(result.completeness_hint)) in page
    assert page.count("<details>") >= len(result.evidence_blocks) + 2  # each text, the pack, the traces
    markdown = result._repr_markdown_()
    assert "| rank | source | title | relevance | in pack | why |" in markdown
    assert "left out" in markdown


def test_a_no_evidence_result_says_so_and_shows_the_attempts():
    result = _result(NOT_FOUND)
    page = result._repr_html_()
    assert not result.found
    assert html.escape(result.message) in page
    tables = page.split("<tbody>")[1:]
    # The near misses come first (what came closest, and the bar it missed), the attempts in their details.
    assert result.near_misses
    near = _cells("<tbody>" + tables[0])
    assert [row[0] for row in near] == [m.source for m in result.near_misses]
    assert near[0][2:] == [
        f"{result.near_misses[0].similarity:.3f}",
        f"{result.near_misses[0].evidence_score:.3f}",
        f"{result.near_misses[0].threshold:g}",
    ]
    attempts = next(_cells(t) for t in page.split("<table>")[1:] if "<th>attempt</th>" in t.split("</thead>")[0])
    attempt = result.retrieval_trace.attempts[0]
    assert attempts[0][0] == str(attempt.attempt) and attempts[0][4] == attempt.outcome
    assert attempts[0][3] == f"{attempt.top_similarity:.3f}"
    assert "evidence document" not in page
    assert result.to_dataframe().empty
    assert repr(result).startswith("<LookupResult found=False no_evidence:")


def test_knowledge_base_text_never_renders_as_html():
    result = _result(FOUND)
    block = result.evidence_blocks[0].model_copy(
        update={"source": "ops/<img src=x onerror=alert(1)>.md", "content": "</pre><script>alert(1)</script>"}
    )
    hostile = result.model_copy(update={"evidence_blocks": [block]})
    for page in (hostile._repr_html_(), block._repr_html_()):
        assert "<script>" not in page and "<img" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>" not in hostile._repr_markdown_().split("```")[0]  # outside the fenced text, escaped


def test_reprs_are_short():
    result = _result(FOUND)
    for value in (result, result.evidence_blocks[0], result.rerank_trace):
        text = repr(value)
        assert len(text) < 200 and "\n" not in text
    assert result.evidence_blocks[0].source in repr(result)
    assert len(result.model_dump_json()) > 5_000  # what the old repr printed in full


def test_to_dataframe_on_results_evidence_and_traces():
    pytest.importorskip("pandas")
    result = _result(FOUND)
    frame = result.to_dataframe()
    assert list(frame["source"]) == [b.source for b in result.evidence_blocks]
    summary = result.context_pack.summary
    assert list(frame["in_pack"]) == [b.source not in summary.omitted_sources for b in result.evidence_blocks]
    assert frame["similarity"].dtype.kind == "f"
    block = result.evidence_blocks[0]
    sections = block.to_dataframe()
    assert len(sections) == max(len(block.sections), 1)
    assert sections["matched"].sum() == (sum(s.matched for s in block.sections) if block.sections else 1)
    rerank = result.rerank_trace.to_dataframe()
    assert list(rerank["source"]) == [e.source for e in result.rerank_trace.entries]
    assert list(rerank["final_score"]) == [e.final_score for e in result.rerank_trace.entries]


def test_evaluation_report_displays_and_tabulates():
    report = evaluate(GOLDEN, FIXTURES)
    page = report._repr_html_()
    assert f"strong {report.overall.strong}" in page and "recall@1" in page
    assert "<details>" in page
    assert repr(report).startswith("<EvalReport golden/") or repr(report).startswith("<EvalReport ")
    pytest.importorskip("pandas")
    frame = report.to_dataframe()
    assert list(frame["case"]) == [c.case_id for c in report.cases]
    assert list(frame["level"]) == [c.status for c in report.cases]


def test_comparison_report_displays_and_tabulates():
    from kb_retrieval.config import KBSettings
    from sidecar.comparison import build_report, compare_case
    from sidecar.models import disabled_run

    cases = load_golden(GOLDEN)[:6]
    comparisons = []
    for case in cases:
        fixture = load_fixture(FIXTURES, case.case_id)
        assert fixture is not None
        result = LookupResult.model_validate(fixture.result)
        comparisons.append(compare_case(case, result, [], disabled_run()))
    report = build_report(cases, comparisons, "golden/sample-kb.jsonl", 5, KBSettings())
    page = report._repr_html_()
    assert "comparison of the current path and the sidecar on golden/sample-kb.jsonl" in page
    assert "unavailable" in page  # the sidecar's status, said
    for case in cases:
        assert html.escape(case.query) in page
    assert "CompareReport golden/sample-kb.jsonl: 6 case(s)" in repr(report)
    assert "**comparison of the current path" in report._repr_markdown_()
    pytest.importorskip("pandas")
    assert list(report.to_dataframe()["case"]) == [c.case_id for c in cases]
