"""The retrieval-test page at ``/`` and the API reference at ``/docs``, in headless Chromium (Debian's ``chromium``;
``.ci/run`` installs it).

The page runs the query its URL names and shows, in the terminal's words (:mod:`kb_retrieval.terminal`), why each
block was chosen, whether it reached the agent's context, its matched sections once each, and a no-evidence
result's near misses; two setting sets side by side fit a 1280 px window. Knowledge-base content is text, never HTML.
The tests that check the page also take the README's screenshots (timings blanked): into the test's own folder, and
into ``docs/images/`` only with ``KB_WRITE_SCREENSHOTS=1`` (``make screenshots``), since Chromium's PNG bytes vary
from run to run with the page unchanged and a test run should not rewrite committed files. ``/docs`` renders with
every host but the loopback address unresolvable.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

import pytest

from kb_retrieval.bench.serve import post_json
from kb_retrieval.models import LookupResult
from kb_retrieval.terminal import matched_sections, not_found_lines, pack_mark, why
from tests.service.browser import FLAGS, browser, chromium
from tests.service.conftest import CONNECTIONS, HOSTILE_SOURCE, without_timings

pytestmark = pytest.mark.timeout(600)
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
#: The service KB holds no Kafka runbook: a lookup without evidence.
NO_ANSWER = "KafkaConsumerGroupLag: consumer group billing-events lag above 50000 messages on topic invoices"
#: What the page shows of each result column: per block its source, pack mark, why and matched section headings.
COLUMNS = """[...document.querySelectorAll('section.column[id^="result-"]')].filter((c) => !c.hidden).map((c) => ({
  id: c.id,
  settings: JSON.parse(c.querySelector('h2 .mono').textContent),
  blocks: [...c.querySelectorAll('.block')].map((b) => ({
    source: b.dataset.source, pack: b.dataset.pack, mark: b.querySelector('.pack').textContent,
    why: b.querySelector('.why span').textContent,
    sections: [...b.querySelectorAll('.sections li')].map((li) => [li.querySelector('.heading').textContent,
      li.title, li.querySelector('.muted').textContent.replace(/^ — /, '')]) })),
  notFound: [...c.querySelectorAll('.not-found')].map((p) => p.textContent),
  misses: [...c.querySelectorAll('.near-misses tbody tr')].map((tr) => [...tr.children].map((td) => td.textContent)),
  overflow: c.scrollWidth - c.clientWidth }))"""
#: The part of the page a screenshot shows: the form and the evidence of every result column.
CLIP = """(() => { const bottoms = [...document.querySelectorAll('section.column[id^="result-"]')]
  .filter((c) => !c.hidden)
  .map((c) => { const h = [...c.querySelectorAll('h3')][1]; return (h || c).getBoundingClientRect().top; });
  return { x: 0, y: 0, width: document.documentElement.clientWidth, height: Math.ceil(Math.max(...bottoms)) }; })()"""
BLANK_TIMINGS = "document.querySelectorAll('.timing').forEach((t) => { t.textContent = '… ms'; })"


def answer(url: str, query: str, settings: dict) -> LookupResult:
    """The result the page's own route gives for ``query`` (the same lookup the page showed: its trace is new)."""
    status, body = post_json(f"{url}/page/lookup", {"query": query, "settings": settings})
    assert status == 200, body
    return LookupResult.model_validate(body["result"])


def expected_blocks(result: LookupResult) -> list[dict]:
    summary = result.context_pack.summary
    return [
        {
            "source": block.source,
            "pack": pack_mark(summary, block.source),
            "mark": pack_mark(summary, block.source),
            "why": why(block, limit=len(block.hit_reasons)),
            "sections": [list(section) for section in matched_sections(block)],
        }
        for block in result.evidence_blocks
    ]


def test_the_pages_route_answers_what_the_api_does_with_its_view_beside(served):
    """``/page/lookup`` (no browser): the ``/v1/lookup`` JSON, and the view's blocks in the result's order."""
    status, page = post_json(f"{served.url}/page/lookup", {"query": CONNECTIONS})
    api_status, api = post_json(f"{served.url}/v1/lookup", {"query": CONNECTIONS})
    assert status == api_status == 200, (page, api)
    assert without_timings(page["result"]) == without_timings(api)
    result = LookupResult.model_validate(page["result"])
    assert result.evidence_blocks
    view = [(block["source"], block["pack"]) for block in page["view"]["blocks"]]
    assert view == [(b.source, pack_mark(result.context_pack.summary, b.source)) for b in result.evidence_blocks]


def test_the_page_runs_a_query_and_shows_content_as_text(served, tmp_path):
    query = "ConsoleMarkupInjection: the alert console renders raw markup"
    flags = [flag for flag in FLAGS if "remote" not in flag]  # --dump-dom: no DevTools endpoint
    command = [chromium(), *flags, f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=60000"]
    url = f"{served.url}/?{urlencode({'q': query})}"
    dom = subprocess.run([*command, "--dump-dom", url], capture_output=True, text=True, timeout=240)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    assert 'data-state="done"' in page, page[-3000:]  # the query ran and the page rendered its answer
    sources = re.findall(r'<div class="source">([^<]*)</div>', page)
    assert sources and sources[0] == HOSTILE_SOURCE  # the first evidence block's source
    # The document's <script> and <img onerror> are shown as text: escaped in the DOM, never elements.
    assert "&lt;script&gt;document.title='pwned'" in page
    assert html.escape("<b>raw markup</b>", quote=False) in page
    assert len(re.findall(r"<script\b", page)) == 1 and "/page/app.js" in page  # only the page's own script
    assert "<img" not in page and "<b>raw markup" not in page
    assert "<title>kb-retrieval: retrieval test</title>" in page and "pwned</title>" not in page
    # The sections, the attempts, the rerank and ranking signals, and the trace rows are on the page.
    for heading in ("Evidence blocks", "Attempts", "Rerank contributions and document-ranking signals"):
        assert f"<h3>{heading}</h3>" in page
    assert "matched sections:" in page and "meaning similarity " in page and "path served" in page
    assert re.search(r"<th>ranking signals</th>", page) and "doc_" in page  # document-ranking signals per document
    traces = page[page.index('id="traces"') :]
    assert html.escape(query, quote=False) in traces


def test_two_setting_sets_side_by_side_in_the_terminals_words(served, tmp_path):
    # B's budget leaves documents out of the agent's context: both marks are drawn.
    params = {"q": CONNECTIONS, "b": "1", "b.context_budget_tokens": "150"}
    with browser(tmp_path / "profile") as chrome:
        visit = chrome.visit(
            f"{served.url}/?{urlencode(params)}",
            width=1280,
            values={"columns": COLUMNS, "page_width": "document.documentElement.scrollWidth"},
            before_shot=BLANK_TIMINGS,
            shot_clip=CLIP,
        )
    a, b = visit.values["columns"]
    assert (a["id"], b["id"]) == ("result-a", "result-b")
    # Side by side at 1280 px: nothing wider than the window, no column wider than itself.
    assert visit.values["page_width"] <= 1280 and a["overflow"] <= 0 and b["overflow"] <= 0
    assert a["settings"] == {} and b["settings"]["context_budget_tokens"] == 150
    a_result = answer(served.url, CONNECTIONS, a["settings"])
    b_result = answer(served.url, CONNECTIONS, b["settings"])
    assert a["blocks"] == expected_blocks(a_result)  # the CLI's words, marks and sections, block for block
    assert b["blocks"] == expected_blocks(b_result)
    assert a["blocks"][0]["pack"] == "in pack" and "left out" in {block["pack"] for block in b["blocks"]}, b["blocks"]
    left_out = [sum(block["pack"] == "left out" for block in column["blocks"]) for column in (a, b)]
    assert left_out[0] < left_out[1]  # B's smaller budget leaves out more of the same evidence
    for block in a["blocks"] + b["blocks"]:
        assert "l1_semantic:" not in block["why"] and block["why"]
        breadcrumbs = [section[1] for section in block["sections"]]
        assert len(breadcrumbs) == len(set(breadcrumbs))  # each matched section once
    assert any(len(block["sections"]) > 1 for block in a["blocks"])
    save(visit.png, "page-a-b.png", tmp_path)


def test_a_no_evidence_result_shows_its_near_misses(served, tmp_path):
    with browser(tmp_path / "profile") as chrome:
        visit = chrome.visit(
            f"{served.url}/?{urlencode({'q': NO_ANSWER})}",
            width=1280,
            values={"columns": COLUMNS},
            before_shot=BLANK_TIMINGS,
            shot_clip=CLIP,
        )
    (column,) = visit.values["columns"]
    result = answer(served.url, NO_ANSWER, {})
    assert not result.found and result.near_misses
    assert column["blocks"] == [] and column["notFound"] == not_found_lines(result)
    assert column["notFound"][0].startswith("not found: nearest miss ")
    assert [row[0] for row in column["misses"]] == [m.source for m in result.near_misses]
    threshold = result.near_misses[0].threshold
    assert all(row[4] == f"{threshold:.3f}" and float(row[3]) < threshold for row in column["misses"])
    save(visit.png, "page-not-found.png", tmp_path)


def test_docs_render_with_no_network(served, tmp_path):
    with urllib.request.urlopen(f"{served.url}/openapi.json", timeout=30) as response:
        spec = json.load(response)
    with browser(tmp_path / "profile", offline=True) as chrome:
        visit = chrome.visit(
            f"{served.url}/docs",
            values={
                "state": "document.body.dataset.state",
                "operations": "[...document.querySelectorAll('section.op h2')].map((h) => h.textContent)",
                "text": "document.body.innerText",
            },
        )
    assert visit.values["state"] == "done", visit.values["text"][:2000]
    expected = [f"{method.upper()}{path}" for path, item in spec["paths"].items() for method in item]
    assert expected and visit.values["operations"][: len(expected)] == expected
    assert "/v1/lookup" in visit.values["text"] and "LookupRequest" in visit.values["text"]
    assert spec["paths"]["/v1/lookup"]["post"]["description"].split("\n")[0] in visit.values["text"]
    # Everything the page loaded came from this server; nothing was tried elsewhere and nothing failed.
    assert visit.requests and all(url.startswith(served.url) for url in visit.requests), visit.requests
    assert visit.failed == []


def save(png: bytes | None, name: str, scratch: Path) -> None:
    """Checks the screenshot is a picture and writes it into ``scratch``, or the README's folder when
    ``KB_WRITE_SCREENSHOTS=1``."""
    assert png is not None and png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    folder = IMAGES if os.environ.get("KB_WRITE_SCREENSHOTS") == "1" else scratch
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(png)
    print(f"screenshot: {folder / name}")
