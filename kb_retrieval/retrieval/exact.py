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
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from kb_retrieval.retrieval.l0_hints import STOPWORDS
from kb_retrieval.retrieval.lexical import stem

# A token: word characters with inner . _ - : / * allowed (kube_pod_status_ready, v1beta1.metrics.k8s.io, --flag).
_TOKEN = re.compile(r"(?:--)?[\w/*][\w.:/*-]*\w|\w")
_CAMEL = re.compile(r"[a-z][A-Z]")
_DOTTED = re.compile(r"[A-Za-z]\.[A-Za-z]")
_CAPS = re.compile(r"^[A-Z]{5,}$")  # error codes (ENOTFOUND, EACCES), not acronyms (RAID, TSDB)
_INSTANCE = re.compile(r"\d.*-|-.*\d")  # a digit and a hyphen: a host, pod or replica name
_TEMPLATE = re.compile(r"\{\{.*?\}\}|\$\w[\w.]*")  # alert-template placeholders: {{ $labels.node }}, $value


def tokens(text: str) -> list[str]:
    """Verbatim tokens of ``text`` (case kept), trailing dots and colons dropped."""
    return [t.rstrip(".:") for t in _TOKEN.findall(text)]


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


def query_identifiers(query: str) -> list[str]:
    """The identifier-like tokens of a query, each once, in query order."""
    seen: dict[str, None] = {}
    for token in tokens(_TEMPLATE.sub(" ", query)):
        if is_identifier(token):
            seen.setdefault(token, None)
    return list(seen)


def query_words(query: str) -> list[str]:
    """The query's plain words and ``UpperCamel`` names that may be rare terms, each once, in query order."""
    seen: dict[str, None] = {}
    for token in tokens(_TEMPLATE.sub(" ", query)):
        if len(token) < 4 or token.isdigit() or _INSTANCE.search(token) or is_identifier(token):
            continue
        if token.lower() not in STOPWORDS:
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
    token: str
    sources: tuple[str, ...]  # the documents holding it verbatim (at most max_df)
    chunk_ids: tuple[str, ...]  # the chunks holding it


class ExactIdentifierIndex:
    """Lower-cased verbatim tokens -> chunks and documents holding them. Read-only after ``build``."""

    def __init__(self, postings: dict[str, dict[str, set[str]]]) -> None:
        self._postings = postings  # token -> source -> chunk ids
        self._vocabulary = "\n".join(sorted(postings))  # for document frequency by substring

    @classmethod
    def build(cls, rows: Iterable[tuple[str, str, str]]) -> ExactIdentifierIndex:
        """Index ``(chunk_id, source, text)`` rows."""
        postings: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for chunk_id, source, text in rows:
            for token in {t.lower() for t in tokens(text)}:
                postings[token][source].add(chunk_id)
        return cls({t: dict(s) for t, s in postings.items()})

    def holders(self, token: str) -> dict[str, set[str]]:
        """Documents (-> chunks) holding ``token`` verbatim, also inside a longer token (``kube_pod_info`` is in
        ``kube_pod_info_total``): the document frequency says how rare the string is, not the whole word."""
        needle = token.lower()
        out: dict[str, set[str]] = defaultdict(set)
        start = 0
        while (at := self._vocabulary.find(needle, start)) >= 0:
            line_start = self._vocabulary.rfind("\n", 0, at) + 1
            line_end = self._vocabulary.find("\n", at)
            line_end = len(self._vocabulary) if line_end < 0 else line_end
            for source, chunks in self._postings[self._vocabulary[line_start:line_end]].items():
                out[source] |= chunks
            start = line_end + 1
        return out

    def token_holders(self, token: str) -> dict[str, set[str]]:
        """Documents (-> chunks) holding ``token`` as a whole token (case folded)."""
        return self._postings.get(token.lower(), {})

    def stem_frequency(self, word: str) -> int:
        """How many documents hold a word of ``word``'s stem (``reconcile``: also reconciling, reconciliation)."""
        return len(self._stem_holders.get(stem(word.lower()), ()))

    @cached_property
    def _stem_holders(self) -> dict[str, set[str]]:
        """Stem -> documents, over the alphabetic tokens (built at the first rare-term question, once)."""
        out: dict[str, set[str]] = defaultdict(set)
        for token, by_source in self._postings.items():
            if token.isalpha():
                out[stem(token)].update(by_source)
        return out

    def document_frequency(self, token: str) -> int:
        return len(self.holders(token))

    def match(self, query: str, max_df: int = 2) -> list[ExactHit]:
        """The query's identifiers found verbatim in 1..``max_df`` documents, rarest first."""
        hits = []
        for token in query_identifiers(query):
            by_source = self.holders(token)
            if 0 < len(by_source) <= max_df:
                sources = tuple(sorted(by_source))
                chunks = tuple(sorted(c for s in sources for c in by_source[s]))
                hits.append(ExactHit(token, sources, chunks))
        return sorted(hits, key=lambda h: (len(h.sources), h.token))

    def match_rare_terms(self, query: str, named: Mapping[str, frozenset[str]], max_df: int = 1) -> list[ExactHit]:
        """The query's rare terms (see the module doc): words held whole by 1..``max_df`` documents, each naming it
        in its title or a heading (``named``, from :func:`named_terms`); the chunks holding it, rarest first."""
        hits = []
        for token in query_words(query) if max_df > 0 else []:
            by_source = self.token_holders(token)
            naming = named.get(token.lower(), frozenset())
            if not 0 < len(by_source) <= max_df or self.stem_frequency(token) > max_df:
                continue
            if sources := tuple(sorted(s for s in by_source if s in naming)):
                chunks = tuple(sorted(c for s in sources for c in by_source[s]))
                hits.append(ExactHit(token, sources, chunks))
        return sorted(hits, key=lambda h: (len(h.sources), h.token))
