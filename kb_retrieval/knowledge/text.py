"""Small text helpers shared by the chunker, L0 matching, lexical scoring and the context packer."""

from __future__ import annotations

import itertools
import re
import unicodedata

_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_FENCE = re.compile(r"^\s*(```|~~~)")
#: The ASCII characters of Unicode category C (control) but newline and tab: what clean_text drops from ASCII text.
_ASCII_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
#: The opening of an ATX heading: 1-6 hashes, then whitespace. The rest of the line is trimmed in plain code: the
#: one-regex form ``^(#{1,6})\s+(.+?)\s*#*\s*$`` backtracks quadratically on a long run of spaces.
_HEADING_OPEN = re.compile(r"(#{1,6})(\s+)")


def count_tokens(text: str) -> int:
    """Approximate token count: words and punctuation marks (close to a WordPiece count for English)."""
    return len(_TOKEN.findall(text))


def words(text: str) -> list[str]:
    """Lower-cased word tokens, CamelCase identifiers kept whole (``KubePodCrashLooping`` -> one token)."""
    return [w.lower() for w in _WORD.findall(text)]


def cut_to_bytes(text: str, limit: int) -> str:
    """``text`` cut (at a character boundary) to at most ``limit`` UTF-8 bytes."""
    data = text.encode()
    return text if len(data) <= limit else data[:limit].decode("utf-8", "ignore")


def split_camel(identifier: str) -> list[str]:
    """``KubePodCrashLooping`` -> ``['kube', 'pod', 'crash', 'looping']``."""
    return [part.lower() for part in _CAMEL.findall(identifier)]


def clean_text(text: str) -> str:
    """NFC-normalise, drop control characters (keeping newlines and tabs) and collapse runs of spaces."""
    text = unicodedata.normalize("NFC", text)
    if text.isascii():  # the same characters as the test below, by one regex (every lookup cleans its query)
        text = _ASCII_CONTROL.sub("", text)
    else:
        text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch)[0] != "C")
    return re.sub(r"[ \t]+", " ", text).strip()


def is_fence(line: str) -> bool:
    """True for a Markdown code-fence line (``` or ~~~)."""
    return bool(_FENCE.match(line))


def heading(line: str) -> tuple[int, str] | None:
    """``(level, text)`` of an ATX Markdown heading line (``## Fix`` -> ``(2, 'Fix')``), else None.

    Callers skip lines inside code fences (see :func:`is_fence`).
    """
    match = _HEADING_OPEN.match(line)
    if match is None:
        return None
    rest = line[match.end() :]
    if not rest:  # the regex form takes the last whitespace character as the (then blank) heading text
        return (len(match.group(1)), "") if len(match.group(2)) > 1 else None
    # The closing sequence: trailing whitespace, then hashes, then whitespace, all dropped; at least one character
    # of text stays (``# #`` is the heading ``#``), as in CommonMark's optional closing hashes.
    text = rest.rstrip().rstrip("#").rstrip() or rest[0]
    return len(match.group(1)), text.strip()


def truncate_to_tokens(text: str, max_tokens: int) -> str:
    """The longest prefix of ``text`` with at most ``max_tokens`` tokens, cut at a token boundary."""
    if max_tokens <= 0:
        return ""
    for i, match in enumerate(_TOKEN.finditer(text)):
        if i == max_tokens:
            return text[: match.start()].rstrip()
    return text


def split_to_tokens(text: str, max_tokens: int) -> list[str]:
    """``text`` cut at token boundaries into consecutive pieces of at most ``max_tokens`` tokens (nothing dropped)."""
    starts = [match.start() for match in _TOKEN.finditer(text)]
    cuts = [0, *starts[max_tokens::max_tokens], len(text)] if max_tokens > 0 else [0, len(text)]
    return [piece for a, b in itertools.pairwise(cuts) if (piece := text[a:b].strip())]
