"""``heading``: ATX headings parsed in linear time, with the same result as the one-regex form it replaces."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kb_retrieval.knowledge.text import heading

#: The former parser (issue 23 item 3): right on every line, but quadratic-plus on a long run of spaces.
_REGEX_FORM = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def _regex_heading(line: str) -> tuple[int, str] | None:
    match = _REGEX_FORM.match(line)
    return (len(match.group(1)), match.group(2).strip()) if match else None


@pytest.mark.unit
@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("## Fix", (2, "Fix")),
        ("# Title ##", (1, "Title")),
        ("### Mitigation   ###   ", (3, "Mitigation")),
        ("# #", (1, "#")),
        ("#  ", (1, "")),
        ("# ", None),
        ("####### seven", None),
        ("#nospace", None),
        ("# C# tips", (1, "C# tips")),
    ],
)
def test_heading_examples(line: str, expected: tuple[int, str] | None) -> None:
    assert heading(line) == expected == _regex_heading(line)


@pytest.mark.unit
@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet="# \tab\u00a0", max_size=14))
def test_heading_agrees_with_the_regex_form_on_every_short_line(line: str) -> None:
    assert heading(line) == _regex_heading(line)


@pytest.mark.unit
@pytest.mark.parametrize("tail", ["b", "#", " #b", "\t"])
def test_a_hundred_thousand_character_heading_line_parses_in_under_a_second(tail: str) -> None:
    line = "# a" + " " * 100_000 + tail  # the regex form: 44 s at 2,000 spaces
    started = time.perf_counter()
    parsed = heading(line)
    assert time.perf_counter() - started < 1.0
    assert parsed is not None and parsed[0] == 1 and parsed[1].startswith("a")
