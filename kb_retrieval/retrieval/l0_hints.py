"""L0: match the query against titles, keywords, categories and entities of the persisted L0 index.

L0 only *hints*: its output narrows L1 to a domain when exactly one is found, boosts candidates in the reranker, and
is recorded in the trace. It is never returned as evidence.

Matching is on word sequences, case-insensitive: a keyword or entity matches when all its words occur contiguously
in the query (``RedisMemoryHigh`` is one word; ``INFO memory`` two). Keywords shared by many documents (a heading
such as "Mitigation") say nothing about which document is meant, so only keywords of at most
``max_keyword_documents`` documents count. A title matches when it occurs in the query, or when the query holds all
of its (at least two) content words.

Example:
    >>> provider = L0HintProvider(index)  # doctest: +SKIP
    >>> provider.hints("RedisMemoryHigh on cache-01").domains  # doctest: +SKIP
    ['redis']
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from functools import lru_cache

from kb_retrieval.indexing.l0_index import L0Index
from kb_retrieval.knowledge.text import split_camel, words
from kb_retrieval.models import L0Hints

STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "can",
        "do",
        "does",
        "for",
        "from",
        "has",
        "have",
        "how",
        "i",
        "in",
        "is",
        "it",
        "its",
        "my",
        "not",
        "of",
        "on",
        "or",
        "our",
        "should",
        "the",
        "this",
        "to",
        "was",
        "we",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
    ]
)


_PIECE = re.compile(r"[^\W_]+", re.UNICODE)


@lru_cache(maxsize=1)
def _stemmer() -> object:
    import Stemmer

    return Stemmer.Stemmer("english")


def title_terms(text: str) -> set[str]:
    """Stemmed content words of ``text`` with identifiers split (``KubePersistentVolumeFillingUp`` -> kube,
    persist, volum, fill, up): how a title and a query are compared term by term."""
    pieces = [part for piece in _PIECE.findall(text) for part in split_camel(piece) or [piece.lower()]]
    kept = [p for p in pieces if p not in STOPWORDS and not p.isdigit()]
    return set(_stemmer().stemWords(kept))  # type: ignore[attr-defined]


def _phrase(text: str) -> tuple[str, ...]:
    return tuple(words(text))


def _contains(haystack: tuple[str, ...], needle: tuple[str, ...]) -> bool:
    n = len(needle)
    if n == 0 or n > len(haystack):
        return False
    if n == 1:
        return needle[0] in haystack
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def _is_specific(keyword: str) -> bool:
    """Multi-word phrases and identifiers (CamelCase, digits, ``_`` ``-`` ``.``) are specific; plain words are not."""
    stripped = keyword.strip()
    return (
        len(words(stripped)) > 1
        or any(ch in stripped for ch in "_-.")
        or any(ch.isdigit() for ch in stripped)
        or any(ch.isupper() for ch in stripped[1:])
    )


def _entity_case_ok(entity: str, query: str) -> bool:
    """A capitalised entity ("Service", "InnoDB") names a thing only when written that way; a lower-case one
    ("redis", "kubectl") matches in any case."""
    return entity.islower() or not entity.isalpha() or entity in query


def _by_first_word(phrases: dict[tuple[str, ...], set[str]]) -> dict[str, list[tuple[str, ...]]]:
    starts: dict[str, list[tuple[str, ...]]] = defaultdict(list)
    for phrase in phrases:
        starts[phrase[0]].append(phrase)
    return dict(starts)


class L0HintProvider:
    """Precomputed phrase tables over an :class:`L0Index`; ``hints(query)`` is pure and thread-safe."""

    def __init__(
        self,
        index: L0Index,
        max_keyword_documents: int = 3,
        title_coverage_min: float = 0.5,
        title_coverage_limit: int = 20,
    ) -> None:
        self.index = index
        self.title_coverage_min = title_coverage_min
        self.title_coverage_limit = title_coverage_limit
        keyword_docs: dict[tuple[str, ...], set[str]] = defaultdict(set)
        entity_docs: dict[tuple[str, ...], set[str]] = defaultdict(set)
        self._keyword_text: dict[tuple[str, ...], str] = {}
        self._entity_text: dict[tuple[str, ...], str] = {}
        self._titles: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []
        for source, entry in index.documents.items():
            for keyword in entry.keywords:
                phrase = _phrase(keyword)
                if phrase and not (len(phrase) == 1 and phrase[0] in STOPWORDS):
                    keyword_docs[phrase].add(source)
                    self._keyword_text.setdefault(phrase, keyword)
            for entity in entry.entities:
                phrase = _phrase(entity)
                if phrase:
                    entity_docs[phrase].add(source)
                    self._entity_text.setdefault(phrase, entity)
            title = _phrase(entry.title)
            content = tuple(w for w in title if w not in STOPWORDS)
            self._titles.append((source, title, content))
        self._keywords = {p: s for p, s in keyword_docs.items() if len(s) <= max_keyword_documents}
        self._entities = dict(entity_docs)
        self._keyword_starts = _by_first_word(self._keywords)
        self._entity_starts = _by_first_word(self._entities)
        # Inverted index of title content words: a title matches when the query holds all of them.
        self._title_words: dict[str, list[int]] = defaultdict(list)
        for i, (_, _, content) in enumerate(self._titles):
            for word in set(content):
                self._title_words[word].append(i)
        # Title terms weighted by rarity among titles: "kube" in every title says little, "quota" much.
        self._term_sources: dict[str, list[str]] = defaultdict(list)  # inverted: a query visits only its terms
        title_sets = {source: title_terms(entry.title) for source, entry in index.documents.items()}
        for source, terms in title_sets.items():
            for term in terms:
                self._term_sources[term].append(source)
        n = max(len(title_sets), 1)
        self._term_idf = {term: math.log(1 + n / len(sources)) for term, sources in self._term_sources.items()}
        # Sums in sorted order: set order varies between processes (hash seeds), float sums with it.
        self._title_weight = {s: sum(self._term_idf[t] for t in sorted(terms)) for s, terms in title_sets.items()}

    def title_coverage(self, query: str, minimum: float | None = None, limit: int | None = None) -> dict[str, float]:
        """Per document, the share of its title (terms weighted by rarity) that the query holds, when at least
        ``minimum`` and with at least two terms shared: how far the query is *about* what the document is titled,
        word by word. The best ``limit``."""
        minimum = self.title_coverage_min if minimum is None else minimum
        limit = self.title_coverage_limit if limit is None else limit
        shared: dict[str, list[str]] = defaultdict(list)
        for term in title_terms(query):
            for source in self._term_sources.get(term, ()):
                shared[source].append(term)
        covered: dict[str, float] = {}
        for source, terms in shared.items():
            if len(terms) < 2:  # one shared word ("alerting", "instrumentation") is not aboutness
                continue
            share = sum(self._term_idf[t] for t in sorted(terms)) / self._title_weight[source]
            if share >= minimum:
                covered[source] = round(share, 4)
        best = sorted(covered.items(), key=lambda item: (-item[1], item[0]))[:limit]
        return dict(best)

    def hints(self, query: str) -> L0Hints:
        tokens = _phrase(query)
        token_set = set(tokens)
        strong: set[str] = set()  # documents matched by a title, a phrase or an identifier-like keyword
        weak: set[str] = set()  # documents matched only by a single plain word
        titles: list[str] = []
        for source in self._title_matches(tokens, token_set):
            titles.append(self.index.documents[source].title)
            strong.add(source)
        keywords: list[str] = []
        for phrase in self._phrases_in(tokens, self._keyword_starts):
            text = self._keyword_text[phrase]
            keywords.append(text)
            (strong if _is_specific(text) else weak).update(self._keywords[phrase])
        entities = [
            text
            for p in self._phrases_in(tokens, self._entity_starts)
            if _entity_case_ok(text := self._entity_text[p], query)
        ]

        # A specific match (an alert name, a title) says more about the domain than a generic word does.
        # A category name merely occurring in the query ("node", "prometheus") is not a match of any entry: in
        # alert texts such words are everywhere, and a wrong filter that still finds fair candidates is not retried.
        deciding = strong or weak
        domains = sorted({c for s in deciding if (c := self.index.documents[s].category)})
        matched_sources = strong | weak
        return L0Hints(
            matched_titles=sorted(set(titles)),
            matched_keywords=sorted(set(keywords)),
            domains=domains,
            entities=sorted(set(entities)),
            matched_sources=sorted(matched_sources),
            title_coverage=self.title_coverage(query),
        )

    def _title_matches(self, tokens: tuple[str, ...], token_set: set[str]) -> list[str]:
        hits: dict[int, int] = defaultdict(int)
        for word in token_set:
            for i in self._title_words.get(word, ()):
                hits[i] += 1
        matched = []
        for i, count in sorted(hits.items()):
            source, title, content = self._titles[i]
            if (len(set(content)) >= 2 and count == len(set(content))) or _contains(tokens, title):
                matched.append(source)
        return matched

    @staticmethod
    def _phrases_in(tokens: tuple[str, ...], starts: dict[str, list[tuple[str, ...]]]) -> list[tuple[str, ...]]:
        found: dict[tuple[str, ...], None] = {}
        for i, token in enumerate(tokens):
            for phrase in starts.get(token, ()):
                if tokens[i : i + len(phrase)] == phrase:
                    found[phrase] = None
        return list(found)

    def document_keywords(self, source: str) -> set[tuple[str, ...]]:
        entry = self.index.documents.get(source)
        return {_phrase(k) for k in entry.keywords} if entry else set()
