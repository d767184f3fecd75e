"""The retrieval-test page at ``/``, in headless Chromium (Debian's ``chromium``; ``.ci/run`` installs it): it runs
the query its URL names, shows the evidence with its source, and shows knowledge-base content as text, never HTML."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.service.conftest import HOSTILE_SOURCE

pytestmark = pytest.mark.timeout(600)
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.fail("chromium is not installed: apt-get install -y chromium (.ci/run does it)")
    return found


def browse(url: str, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Load ``url``, let its scripts run (virtual time: the page's fetches finish), then do what ``extra`` says."""
    command = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=60000", *extra, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=240)


def test_the_page_runs_a_query_and_shows_content_as_text(served, tmp_path):
    query = "ConsoleMarkupInjection: the alert console renders raw markup"
    dom = browse(f"{served.url}/?{urlencode({'q': query})}", tmp_path / "profile", "--dump-dom")
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
    assert "matched sections: " in page and "l1_semantic" in page and "path served" in page
    assert re.search(r"<th>ranking signals</th>", page) and "doc_" in page  # document-ranking signals per document
    traces = page[page.index('id="traces"') :]
    assert html.escape(query, quote=False) in traces


def test_two_setting_sets_side_by_side_and_a_screenshot(served, tmp_path):
    params = {"q": "RedisMemoryHigh on cache-01", "b": "1", "a.max_evidence_blocks": "3", "b.top_k": "5"}
    url = f"{served.url}/?{urlencode(params)}"
    dom = browse(url, tmp_path / "profile-dom", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    a = page[page.index('id="result-a"') : page.index('id="result-b"')]
    b = page[page.index('id="result-b"') : page.index('id="traces"')]
    assert "hidden" not in b[:40]
    assert html.escape('{"max_evidence_blocks":3}', quote=False) in a.replace("&quot;", '"')
    assert '{"top_k":5,"document_ranking":false}' in html.unescape(b)  # B's defaults: document ranking off
    assert len(re.findall(r'<div class="source">', a)) == 3
    assert re.findall(r'<div class="source">([^<]*)</div>', b)[0] == "redis/memory-usage-high.md"
    shot = tmp_path / "page.png"
    taken = browse(url, tmp_path / "profile-shot", "--window-size=1400,1600", f"--screenshot={shot}")
    assert taken.returncode == 0 and shot.stat().st_size > 20_000, taken.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"screenshot: {shot}")
