"""HTML pages (wiki and help-centre exports) as Markdown-like text, with the standard library's HTML parser.

Headings become ATX headings (``<h2>Fix</h2>`` -> ``## Fix``), so the heading chunker gives an HTML page the same
breadcrumbs as a Markdown one; paragraphs, list items, table rows and line breaks become lines; ``<pre>`` keeps
its text as a fenced code block; ``<script>``, ``<style>``, ``<head>`` content other than ``<title>``, navigation and
comments are dropped. Nothing is downloaded and nothing beyond the standard library is needed.

Example:
    >>> page = html_to_text("<title>Redis OOM</title><h1>Redis OOM</h1><p>Raise <b>maxmemory</b>.</p>")
    >>> page.title, page.text
    ('Redis OOM', '# Redis OOM\\n\\nRaise maxmemory.')
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from html.parser import HTMLParser

HTML_SUFFIXES = (".html", ".htm")
_DROPPED = {"script", "style", "noscript", "template", "nav", "svg", "head"}
_BLOCKS = {"p", "div", "section", "article", "main", "li", "tr", "table", "ul", "ol", "dl", "dt", "dd", "blockquote",
           "br", "hr", "header", "footer", "figure", "figcaption", "body", "form"}  # fmt: skip
_HEADINGS = {f"h{n}": n for n in range(1, 7)}


@dataclass(frozen=True)
class HtmlPage:
    """An HTML page as Markdown-like text (:func:`html_to_text`): its title and its text."""

    title: str
    text: str


def looks_like_html(text: str) -> bool:
    """True when ``text`` starts (after whitespace) like an HTML document or fragment: ``<!doctype``, ``<html``."""
    head = text.lstrip()[:200].lower()
    return head.startswith(("<!doctype html", "<html")) or "<body" in head


def html_to_text(markup: str) -> HtmlPage:
    """The page's ``<title>`` and its text as Markdown-like lines (see the module docstring)."""
    parser = _TextParser()
    parser.feed(markup)
    parser.close()
    return HtmlPage(title=" ".join(parser.title.split()), text=parser.text())


class _TextParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self.current: list[str] = []
        self.title = ""
        self.dropped = 0  # depth inside a dropped element
        self.in_title = False
        self.in_pre = 0
        self.heading = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self.in_title = True
        elif tag in _DROPPED:
            self.dropped += 1
        elif self.dropped:
            return
        elif tag in _HEADINGS:
            self._break()
            self.heading = _HEADINGS[tag]
        elif tag == "pre":
            self._break()
            self.in_pre += 1
            self.lines.append("```")
        elif tag in _BLOCKS:
            self._break()
            if tag == "li":
                self.current.append("- ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.in_title = False
        elif tag in _DROPPED:
            self.dropped = max(0, self.dropped - 1)
        elif self.dropped:
            return
        elif tag in _HEADINGS:
            self._break()
            self.heading = 0
        elif tag == "pre" and self.in_pre:
            self._break()
            self.lines.append("```")
            self.lines.append("")
            self.in_pre -= 1
        elif tag in _BLOCKS or tag in ("td", "th"):
            if tag in ("td", "th"):
                self.current.append(" | ")
            else:
                self._break()

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.title += data
        elif self.dropped:
            return
        elif self.in_pre:
            self.lines.extend(data.strip("\n").splitlines())
        else:
            self.current.append(data)

    def _break(self) -> None:
        line = re.sub(r"\s+", " ", "".join(self.current)).strip().strip("|").strip()
        self.current.clear()
        if line and line != "-":
            if self.heading:
                self.lines += ["", "#" * self.heading + " " + line, ""]
            else:
                self.lines.append(line)
                if not self.in_pre:
                    self.lines.append("")

    def text(self) -> str:
        self._break()
        joined = "\n".join(self.lines)
        return html.unescape(re.sub(r"\n{3,}", "\n\n", joined)).strip()
