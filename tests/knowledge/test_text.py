"""``heading``: ATX headings parsed in linear time, with the same result as the one-regex form it replaces;
``clean_text``: the same text by its ASCII shortcut as by the character-by-character form."""

from __future__ import annotations

import re
import time
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kb_retrieval.knowledge.text import clean_text, heading

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


def _clean_text_by_character(text: str) -> str:
    """``clean_text`` as it was: every character's Unicode category read one by one."""
    text = unicodedata.normalize("NFC", text)
    text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch)[0] != "C")
    return re.sub(r"[ \t]+", " ", text).strip()


@pytest.mark.unit
def test_clean_text_drops_the_same_ascii_characters_as_the_character_form() -> None:
    every_ascii = "".join(map(chr, range(128)))
    assert clean_text(every_ascii) == _clean_text_by_character(every_ascii)
    assert clean_text("Redis\x00 memory\x7f high\n\tnow\x1b[0m") == "Redis memory high\n now[0m"


@pytest.mark.unit
@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x7F) | st.sampled_from("\u00e9\u200b\u0085\ufeff"), max_size=24))
def test_clean_text_agrees_with_the_character_form(text: str) -> None:
    assert clean_text(text) == _clean_text_by_character(text)
