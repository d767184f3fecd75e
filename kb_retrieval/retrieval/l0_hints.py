"""L0: match the query against titles, keywords, categories and entities of the persisted L0 index.

L0 only *hints*: its output narrows L1 to a domain when exactly one is found, boosts candidates in the reranker, and
is recorded in the trace. It is never returned as evidence.

Matching is on word sequences, case-insensitive: a keyword or entity matches when all its words occur contiguously
in the query (``RedisMemoryHigh`` is one word; ``INFO memory`` two). Keywords shared by many documents (a heading
such as "Mitigation") say nothing about which document is meant, so only keywords of at most
``max_keyword_documents`` documents count. A title matches when it occurs in the query, or when the query holds all
of its (at least two) content words.

Only a strong match sets a domain: a matched title, or a specific keyword (an identifier or a phrase) that is a
*name* - no proper fragment of any document's names (file name, specific keywords). ``KubePodCrashLooping`` names
its runbook, ``INFO memory`` its Redis page; ``NotReady`` (derived from the title "Prometheus Operator NotReady") is
a piece of ``PrometheusOperatorNotReady``, ``KubeNodeNotReady`` and ``KubePodNotReady``, and ``StatefulSet`` of three
``KubeStatefulSet...`` names: a fragment names none of them. Every other keyword match (plain words, fragments)
still boosts its documents in the reranker. ``domain_matches`` says which match set each domain.

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
from pathlib import Path

from kb_retrieval.indexing.l0_index import L0Index
from kb_retrieval.knowledge.text import split_camel, words
from kb_retrieval.models import L0Hints

#: The words an ops question is built from that name no document: articles, pronouns, auxiliaries and the question
#: words (how, why, what, should, my, ...). Left out wherever a query is matched against what names a document:
#: titles and one-word keywords of the L0 index (here), and a query's rare terms
#: (:func:`kb_retrieval.retrieval.exact.query_words`). Not BM25's list,
#: :data:`kb_retrieval.retrieval.bm25.analysis.STOPWORDS_EN`, and different on purpose: that one is bm25s' own
#: (NLTK's short list, pinned to bm25s by a test) so that every place BM25 runs analyses text as bm25s does; it keeps
#: the question words and drops a few connectives this one keeps (but, if, then, there, ...). Each list's results
#: were measured with it: making them one would change rankings.
QUESTION_STOPWORDS = frozenset(
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
    pieces = [part for piece in _PIECE.findall(text) for part in _piece_parts(piece)]
    kept = [p for p in pieces if p not in QUESTION_STOPWORDS and not p.isdigit()]
    return set(_stemmer().stemWords(kept))  # type: ignore[attr-defined]


@lru_cache(maxsize=16384)
def _piece_parts(piece: str) -> tuple[str, ...]:
    """A word's parts, identifiers split (``CrashLooping`` -> crash, looping); a query's words recur across lookups."""
    return tuple(split_camel(piece)) or (piece.lower(),)


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


def _name_pieces(name: str) -> tuple[str, ...]:
    """``Prometheus Operator NotReady`` -> (prometheus, operator, not, ready): a name's words, identifiers split, so
    that a keyword is found inside a longer identifier (``NotReady`` in ``KubeNodeNotReady``)."""
    return tuple(part for word in _PIECE.findall(name) for part in _piece_parts(word))


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
        #: source, title words, their set and how many distinct content words.
        self._titles: list[tuple[str, tuple[str, ...], frozenset[str], int]] = []
        title_content: list[tuple[str, ...]] = []
        for source, entry in index.documents.items():
            for keyword in entry.keywords:
                phrase = _phrase(keyword)
                if phrase and not (len(phrase) == 1 and phrase[0] in QUESTION_STOPWORDS):
                    keyword_docs[phrase].add(source)
                    self._keyword_text.setdefault(phrase, keyword)
            for entity in entry.entities:
                phrase = _phrase(entity)
                if phrase:
                    entity_docs[phrase].add(source)
                    self._entity_text.setdefault(phrase, entity)
            title = _phrase(entry.title)
            content = tuple(w for w in title if w not in QUESTION_STOPWORDS)
            self._titles.append((source, title, frozenset(title), len(set(content))))
            title_content.append(content)
        self._keywords = {p: s for p, s in keyword_docs.items() if len(s) <= max_keyword_documents}
        # Each document's names as piece sequences, and an inverted index of their pieces: which documents' names
        # a keyword is a piece of (see is_a_name).
        self._names: dict[str, set[tuple[str, ...]]] = {}
        self._piece_sources: dict[str, set[str]] = defaultdict(set)
        for source, entry in index.documents.items():
            names = [k for k in entry.keywords if _is_specific(k)] + [Path(source).stem]
            self._names[source] = {pieces for name in names if (pieces := _name_pieces(name))}
            for name in self._names[source]:
                for piece in name:
                    self._piece_sources[piece].add(source)
        self._names_cache: dict[tuple[str, ...], bool] = {}
        self._entities = dict(entity_docs)
        self._keyword_starts = _by_first_word(self._keywords)
        self._entity_starts = _by_first_word(self._entities)
        # Inverted index of title content words: a title matches when the query holds all of them.
        self._title_words: dict[str, list[int]] = defaultdict(list)
        for i, content in enumerate(title_content):
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
        # Only the titles sharing a term with the query are visited (the inverted index); terms in sorted order, so
        # each title's shared weights are summed in the same order whatever the hash seed.
        shared: dict[str, list[float]] = defaultdict(list)
        for term in sorted(title_terms(query)):
            if (sources := self._term_sources.get(term)) is not None:
                idf = self._term_idf[term]
                for source in sources:
                    shared[source].append(idf)
        covered: dict[str, float] = {}
        for source, weights in shared.items():
            if len(weights) < 2:  # one shared word ("alerting", "instrumentation") is not aboutness
                continue
            share = sum(weights) / self._title_weight[source]
            if share >= minimum:
                covered[source] = round(share, 4)
        best = sorted(covered.items(), key=lambda item: (-item[1], item[0]))[:limit]
        return dict(best)

    def hints(self, query: str) -> L0Hints:
        tokens = _phrase(query)
        token_set = set(tokens)
        matched: set[str] = set()
        deciding: dict[str, list[str]] = defaultdict(list)  # source -> the strong matches that name it
        titles: list[str] = []
        for source in self._title_matches(tokens, token_set):
            titles.append(title := self.index.documents[source].title)
            matched.add(source)
            deciding[source].append(f"title '{title}'")
        keywords: list[str] = []
        for phrase in self._phrases_in(tokens, self._keyword_starts):
            text = self._keyword_text[phrase]
            keywords.append(text)
            sources = self._keywords[phrase]
            matched.update(sources)
            if _is_specific(text) and self.is_a_name(text):
                for source in sources:
                    deciding[source].append(f"keyword '{text}'")
        entities = [
            text
            for p in self._phrases_in(tokens, self._entity_starts)
            if _entity_case_ok(text := self._entity_text[p], query)
        ]

        # A category name merely occurring in the query ("node", "prometheus") is not a match of any entry: in
        # alert texts such words are everywhere, and a wrong filter that still finds fair candidates is not retried.
        # A plain word or a fragment shared with other documents' names boosts, and never narrows the search.
        by_domain: dict[str, set[str]] = defaultdict(set)
        for source, reasons in deciding.items():
            if category := self.index.documents[source].category:
                by_domain[category].update(f"{reason} ({source})" for reason in reasons)
        coverage = self.title_coverage(query)
        best = max(coverage.values(), default=None)
        leaders = {self.index.documents[s].category for s, share in coverage.items() if share == best}
        return L0Hints(
            matched_titles=sorted(set(titles)),
            matched_keywords=sorted(set(keywords)),
            domains=sorted(by_domain),
            domain_matches={domain: sorted(reasons) for domain, reasons in sorted(by_domain.items())},
            entities=sorted(set(entities)),
            matched_sources=sorted(matched),
            title_coverage=coverage,
            # The domain of the best-covered title; none when titles of two domains are covered alike.
            coverage_domain=next(iter(leaders)) if len(leaders) == 1 else None,
        )

    def outside(self, domain: str, hints: L0Hints) -> dict[str, str]:
        """The documents ``hints`` matched by a title or a specific keyword (an identifier or a phrase; a plain word
        only boosts) whose category is not ``domain``: source -> its category ("" for none), in
        ``matched_sources``' order. What a filter to ``domain`` would cut away of what L0 itself found.

        Example:
            >>> provider.outside("om", provider.hints("OpenMetrics 1.0 to 2.0"))  # doctest: +SKIP
            {'guides/open_metrics_2_0_migration.md': 'guides'}
        """
        documents = self.index.documents
        titles = set(hints.matched_titles)
        specific = {
            source
            for keyword in hints.matched_keywords
            if _is_specific(keyword)
            for source in self._keywords.get(_phrase(keyword), ())
        }
        return {
            s: c
            for s in hints.matched_sources
            if (e := documents.get(s)) is not None
            and (s in specific or e.title in titles)
            and (c := e.category or "") != domain
        }

    def is_a_name(self, keyword: str) -> bool:
        """True when ``keyword`` is no proper fragment of any document's names (file name, specific keywords): a
        name, not a piece shared with names (``NotReady`` is a piece of ``KubeNodeNotReady``; ``StatefulSet`` of
        ``KubeStatefulSetReplicasMismatch``)."""
        pieces = _name_pieces(keyword)
        if (known := self._names_cache.get(pieces)) is not None:
            return known
        holders = set.intersection(*(self._piece_sources.get(p, set()) for p in pieces)) if pieces else set()
        fragment = any(
            name != pieces and _contains(name, pieces) for source in sorted(holders) for name in self._names[source]
        )
        self._names_cache[pieces] = named = bool(pieces) and not fragment  # a benign race: the same value each time
        return named

    def _title_matches(self, tokens: tuple[str, ...], token_set: set[str]) -> list[str]:
        hits: dict[int, int] = defaultdict(int)
        for word in token_set:
            for i in self._title_words.get(word, ()):
                hits[i] += 1
        matched = []
        for i, count in sorted(hits.items()):
            source, title, title_words, distinct = self._titles[i]
            # A title occurs in the query only if all its words do: most titles are ruled out by that set test.
            if (distinct >= 2 and count == distinct) or (title_words <= token_set and _contains(tokens, title)):
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
