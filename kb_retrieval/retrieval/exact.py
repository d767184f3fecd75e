"""Exact-identifier and rare-term evidence: a rare term of the query found verbatim in a document is a signal itself.

A token of the query that looks like an identifier (``snake_case``, ``lowerCamel``, ``dotted.names``, ``--flags``,
``/paths``, error codes such as ``ENOTFOUND``) and occurs verbatim in at most ``max_df`` documents makes the chunks
that hold it candidates (scored by Milvus like lexical ones) and evidence whatever their dense similarity, with the
hit reason ``exact_match:<token>``. This is L1 lexical evidence, not an L0 hint: it is found in the text itself.

A plain word or an ``UpperCamel`` name (``conntrack``, ``Watchdog``, ``misscheduled``) is a *rare term* when at most
``rare_term_max_df`` documents (1) hold it as a whole token, no more hold a word of its stem (``reconcile`` is common
where ``reconciling`` and ``reconciliation`` are), and such a document names it in its title or a heading: the same
candidates, evidence and boost, with the hit reason ``rare_term:<token>``. The naming condition is measured, not
taste: over the public query sets a word found in one runbook only pointed at a wrong one when the runbook merely
used it (engineer's own words: 3 right, 60 wrong, 7 in unanswerable queries), and at the right one when the runbook
names it (alert texts: 16 right, 2 wrong). Never rare terms: a word several documents hold (common in this
knowledge base), instance names (a digit and a hyphen: ``pg-replica-2``), numbers, stop words and alert-template
placeholders.

Example:
    >>> index = ExactIdentifierIndex.build([("c1", "a.md", "check kube_pod_status_ready"), ("c2", "b.md", "x")])
    >>> [(h.token, h.sources) for h in index.match("kube_pod_status_ready is 0 on pod api-1")]
    [('kube_pod_status_ready', ('a.md',))]
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from kb_retrieval.retrieval.bm25 import stem
from kb_retrieval.retrieval.l0_hints import QUESTION_STOPWORDS
from kb_retrieval.retrieval.templates import PLACEHOLDER

#: Rows of a token read at a time when only a few documents matter (``_holders_of`` with a limit).
HOLDERS_BLOCK = 64

# A token: word characters with inner . _ - : / * allowed (kube_pod_status_ready, v1beta1.metrics.k8s.io, --flag).
_TOKEN = re.compile(r"(?:--)?[\w/*][\w.:/*-]*\w|\w")
_CAMEL = re.compile(r"[a-z][A-Z]")
_DOTTED = re.compile(r"[A-Za-z]\.[A-Za-z]")
_CAPS = re.compile(r"^[A-Z]{5,}$")  # error codes (ENOTFOUND, EACCES), not acronyms (RAID, TSDB)
_INSTANCE = re.compile(r"\d.*-|-.*\d")  # a digit and a hyphen: a host, pod or replica name
# Values, not names: a number, a duration, a version, an IP address (v4 or v6, with a port or prefix), a hash, an
# instance's address.
_VALUE = re.compile(
    r"[+-]?\d+(?:[.,]\d+)*%?"  # 42, 0.95, 1,000, 80%
    r"|(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h|d|w|y))+"  # 30s, 1h30m, 1.5h
    r"|v?\d+(?:\.\d+)+(?:[-+.][\w.]*)?"  # v2.45.0, 1.2.3-rc.1
    r"|\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?(?:/\d+)?"  # 10.0.0.1:9090, 10.0.0.0/8
    r"|[0-9a-f]*:[0-9a-f:]*:[0-9a-f:]*"  # fe80::1
    r"|0x[0-9a-f]+|(?:sha\d+:)?(?=[0-9a-f]*\d)[0-9a-f]{7,}"  # 0xdeadbeef, 5f7d9c8, sha256:e3b0c442
    r"|[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}"  # a UUID
    # Instances, not kinds: a URL, anything with a port or tag (host:9100, image:1.43.0), a path to a numbered
    # thing (a device, a partition, an API version: /dev/nvme0n1p1, /api/v1).
    r"|\w+://.*|.*:\d[\w.]*|.*/[^/]*\d",
    re.IGNORECASE,
)


def tokens(text: str) -> list[str]:
    """Verbatim tokens of ``text`` (case kept), trailing dots and colons dropped."""
    return [t.rstrip(".:") for t in _TOKEN.findall(text)]


@lru_cache(maxsize=16384)  # asked of every query token and every exact term of every candidate
def is_identifier(token: str) -> bool:
    """Whether a query token names something exactly (metric, field, flag, path, error code) rather than a word.

    ``UpperCamel`` words are left out: they are names of kinds and products (``PersistentVolume``,
    ``CrashLoopBackOff``) that many documents discuss without being about them; alert names are L0's.
    """
    if len(token) < 4 or token.isdigit() or _INSTANCE.search(token):
        return False
    core = token.lstrip("-/")
    return bool(
        token.startswith("--")
        or (token.startswith("/") and len(core) >= 3)
        or ("_" in core.strip("_") and any(c.isalpha() for c in core))
        or (core[:1].islower() and _CAMEL.search(core))
        or _DOTTED.search(core)
        or _CAPS.match(core)
    )


@lru_cache(maxsize=16384)
def is_name(token: str) -> bool:
    """Whether ``token`` is a name (a metric, a flag, an alert, a path) rather than a value: a number, a duration, a
    version, an IP address, a hash-like string, a URL, an address with a port or tag or a path to a numbered device
    is a value, which a knowledge base is not expected to hold.

    Example:
        >>> [t for t in ("kube_pod_info", "--web.enable-lifecycle", "30s", "v2.45.0", "10.0.0.1") if is_name(t)]
        ['kube_pod_info', '--web.enable-lifecycle']
    """
    core = token.lstrip("-/")
    return any(c.isalpha() for c in core) and not _VALUE.fullmatch(core)


def query_identifiers(query: str) -> list[str]:
    """The identifier-like tokens of a query, each once, in query order."""
    seen: dict[str, None] = {}
    for token in tokens(PLACEHOLDER.sub(" ", query)):
        if is_identifier(token):
            seen.setdefault(token, None)
    return list(seen)


def query_words(query: str) -> list[str]:
    """The query's plain words and ``UpperCamel`` names that may be rare terms, each once, in query order."""
    seen: dict[str, None] = {}
    for token in tokens(PLACEHOLDER.sub(" ", query)):
        if len(token) < 4 or token.isdigit() or _INSTANCE.search(token) or is_identifier(token):
            continue
        if token.lower() not in QUESTION_STOPWORDS:
            seen.setdefault(token, None)
    return list(seen)


def named_terms(names: Mapping[str, Iterable[str]]) -> dict[str, frozenset[str]]:
    """Lower-cased tokens -> the documents naming them, from ``names``: source -> its title and headings."""
    out: dict[str, set[str]] = defaultdict(set)
    for source, texts in names.items():
        for text in texts:
            for token in tokens(text):
                out[token.lower()].add(source)
    return {token: frozenset(sources) for token, sources in out.items()}


@dataclass(frozen=True)
class ExactHit:
    """A verbatim token of the query found in the knowledge base, with the documents and chunks holding it."""

    token: str
    sources: tuple[str, ...]  # the documents holding it verbatim (at most max_df)
    chunk_ids: tuple[str, ...]  # the chunks holding it


@dataclass(frozen=True)
class IdentifierScan:
    """A query's identifiers against the index (:meth:`ExactIdentifierIndex.identifiers`): those held by 1..max_df
    documents (rarest first), and the names no document holds (query order)."""

    hits: list[ExactHit]
    unheld: list[str]


class ExactIdentifierIndex:
    """Lower-cased verbatim tokens -> chunks and documents holding them. Read-only after ``build``.

    Stored as arrays, not a set per token and document: the sorted vocabulary (one string, a token a line, for
    document frequency by substring), each token's rows (one array, a token's rows a slice of it) and each row's
    chunk id and source. At 100k chunks that is a few arrays instead of millions of sets to build and keep.
    """

    def __init__(
        self, vocabulary: list[str], starts: np.ndarray, rows: np.ndarray, chunk_ids: list[str], sources: list[str]
    ) -> None:
        self._tokens = vocabulary  # sorted
        self._vocabulary = "\n".join(vocabulary)  # the same, one a line
        self._line_starts = np.cumsum([0, *(len(t) + 1 for t in vocabulary[:-1])]) if vocabulary else np.zeros(1)
        self._starts = starts  # token i's rows: rows[starts[i]:starts[i + 1]]
        self._rows = rows
        self._chunk_ids = chunk_ids
        self._sources = sources

    @classmethod
    def build(cls, rows: Iterable[tuple[str, str, str]]) -> ExactIdentifierIndex:
        """Index ``(chunk_id, source, text)`` rows."""
        vocabulary: dict[str, int] = {}
        token_ids = array("q")
        holders = array("q")
        chunk_ids: list[str] = []
        sources: list[str] = []
        for row, (chunk_id, source, text) in enumerate(rows):
            chunk_ids.append(chunk_id)
            sources.append(source)
            distinct = {t.lower() for t in tokens(text)}
            token_ids.extend([vocabulary.setdefault(t, len(vocabulary)) for t in distinct])
            holders.extend([row] * len(distinct))
        names = sorted(vocabulary)
        rank = np.empty(len(vocabulary), dtype=np.int64)
        rank[[vocabulary[t] for t in names]] = np.arange(len(names))
        ranked = rank[np.frombuffer(token_ids, dtype=np.int64)] if len(token_ids) else np.empty(0, dtype=np.int64)
        order = np.argsort(ranked, kind="stable")  # by token, rows ascending within
        starts = np.searchsorted(ranked[order], np.arange(len(names) + 1))
        held = np.frombuffer(holders, dtype=np.int64)[order] if len(holders) else np.empty(0, dtype=np.int64)
        return cls(names, starts, held, chunk_ids, sources)

    def holders(self, token: str, limit: int | None = None) -> dict[str, set[str]] | None:
        """Documents (-> chunks) holding ``token`` verbatim, also inside a longer token (``kube_pod_info`` is in
        ``kube_pod_info_total``): the document frequency says how rare the string is, not the whole word. ``None``
        when more than ``limit`` documents hold it (found without reading them all)."""
        needle = token.lower()
        start = 0
        lines: list[int] = []
        while (at := self._vocabulary.find(needle, start)) >= 0:
            line = int(np.searchsorted(self._line_starts, at, side="right")) - 1
            lines.append(line)
            next_line = line + 1
            start = int(self._line_starts[next_line]) if next_line < len(self._line_starts) else len(self._vocabulary)
        return self._holders_of(lines, limit)

    def token_holders(self, token: str, limit: int | None = None) -> dict[str, set[str]] | None:
        """Documents (-> chunks) holding ``token`` as a whole token (case folded); ``None`` past ``limit``."""
        needle = token.lower()
        at = bisect_left(self._tokens, needle)
        return self._holders_of([at] if at < len(self._tokens) and self._tokens[at] == needle else [], limit)

    def stem_frequency(self, word: str, limit: int | None = None) -> int:
        """How many documents hold a word of ``word``'s stem (``reconcile``: also reconciling, reconciliation);
        ``limit + 1`` when more than ``limit`` do."""
        holders = self._holders_of(self._stem_tokens.get(stem(word.lower()), []), limit)
        return len(holders) if holders is not None else (limit or 0) + 1

    @cached_property
    def _stem_tokens(self) -> dict[str, list[int]]:
        """Stem -> the alphabetic tokens of the vocabulary that have it (made at the first rare-term question)."""
        out: dict[str, list[int]] = defaultdict(list)
        for i, token in enumerate(self._tokens):
            if token.isalpha():
                out[stem(token)].append(i)
        return out

    def _holders_of(self, token_indexes: Iterable[int], limit: int | None = None) -> dict[str, set[str]] | None:
        """Documents (-> chunks) holding any of the vocabulary's tokens at ``token_indexes``; ``None`` as soon as
        more than ``limit`` documents do (a common token at 100k chunks has thousands of rows)."""
        out: dict[str, set[str]] = defaultdict(set)
        for i in token_indexes:
            start, end = int(self._starts[i]), int(self._starts[i + 1])
            # With a limit, a block of rows at a time: past it after a few rows, not after converting them all.
            step = end - start if limit is None else HOLDERS_BLOCK
            for at in range(start, end, max(step, 1)):
                for row in self._rows[at : min(at + step, end)].tolist():
                    out[self._sources[row]].add(self._chunk_ids[row])
                    if limit is not None and len(out) > limit:
                        return None
        return out

    def document_frequency(self, token: str) -> int:
        return len(self.holders(token) or ())

    def unheld(self, query: str) -> list[str]:
        """The query's identifier names (:func:`query_identifiers` that are :func:`is_name`) no document holds, even
        inside a longer token, in query order: the knowledge base does not have the specific thing the query names.

        Example:
            >>> index = ExactIdentifierIndex.build([("c1", "a.md", "kube_pod_info_total")])
            >>> index.unheld("kube_pod_info or node_load15?")
            ['node_load15']
        """
        return self.identifiers(query, 0).unheld

    def match(self, query: str, max_df: int = 2) -> list[ExactHit]:
        """The query's identifiers found verbatim in 1..``max_df`` documents, rarest first."""
        return self.identifiers(query, max_df).hits

    def identifiers(self, query: str, max_df: int) -> IdentifierScan:
        """:meth:`match` and :meth:`unheld` of ``query`` at once, each identifier's holders looked up once: a lookup
        asks both (the hits for its candidates, the unheld names for its trace).

        ``holders(token, limit=max_df)`` is ``{}`` exactly when no document holds the token (past the limit it is
        ``None``, not empty), so one lookup per identifier answers both questions.

        Example:
            >>> index = ExactIdentifierIndex.build([("c1", "a.md", "kube_pod_info_total")])
            >>> scan = index.identifiers("kube_pod_info or node_load15?", 2)
            >>> [h.token for h in scan.hits], scan.unheld
            (['kube_pod_info'], ['node_load15'])
        """
        hits = []
        unheld = []
        for token in query_identifiers(query):
            by_source = self.holders(token, limit=max(max_df, 0))
            if by_source:
                sources = tuple(sorted(by_source))
                chunks = tuple(sorted(c for s in sources for c in by_source[s]))
                hits.append(ExactHit(token, sources, chunks))
            elif by_source == {} and is_name(token):
                unheld.append(token)
        return IdentifierScan(sorted(hits, key=lambda h: (len(h.sources), h.token)), unheld)

    def match_rare_terms(self, query: str, named: Mapping[str, frozenset[str]], max_df: int = 1) -> list[ExactHit]:
        """The query's rare terms (see the module doc): words held whole by 1..``max_df`` documents, each naming it
        in its title or a heading (``named``, from :func:`named_terms`); the chunks holding it, rarest first."""
        hits = []
        for token in query_words(query) if max_df > 0 else []:
            if not (naming := named.get(token.lower())):  # cheap first: most words name no document
                continue
            by_source = self.token_holders(token, limit=max_df)
            if not by_source or self.stem_frequency(token, limit=max_df) > max_df:
                continue
            if sources := tuple(sorted(s for s in by_source if s in naming)):
                chunks = tuple(sorted(c for s in sources for c in by_source[s]))
                hits.append(ExactHit(token, sources, chunks))
        return sorted(hits, key=lambda h: (len(h.sources), h.token))
