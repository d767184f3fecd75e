"""In-process BM25 on the milvus plan (``lexical_mode = in_process_bm25``, as on a Milvus 2.3 server): the BM25 and
exact-identifier chunks the dense search may miss are read by key with their vectors beside the dense search (not
after it), later lookups score them from the kept vectors without a request, and the candidates are the ones two
searches in a row gave (the dense one, then one restricted to the chunks it missed)."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.indexing.embeddings import embed_query
from kb_retrieval.indexing.ingest import ingest
from kb_retrieval.retrieval.hybrid import HybridRetriever
from kb_retrieval.retrieval.l1.base import one_version_per_source
from tests.conftest import SAMPLE_KB

QUERIES = [
    "MySQL replica is many seconds behind the primary",
    "the checkout service logs getaddrinfo ENOTFOUND since the deploy",
    "RedisMemoryHigh: memory above 90% of maxmemory on cache-01",
    "disk almost full on db host",
]


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, embed_model) -> KnowledgeLookup:
    """A collection without full-text search (no analysed text field), searched in Milvus: BM25 runs in process."""
    settings = KBSettings(
        state_dir=tmp_path_factory.mktemp("in-process"),
        vector_store_mode="sdk",
        lexical_text_field="",
        freshness_check_s=3600,  # the index-version check stays out of the counts
    )
    ingest([SAMPLE_KB], settings, embed_model=embed_model)
    lookup = KnowledgeLookup(settings, embed_model=embed_model)
    assert lookup.lexical_mode == "in_process_bm25" and lookup.plan == "milvus"
    return lookup


def two_searches_in_a_row(hybrid: HybridRetriever, embedding: list[float], query: str, category: str | None):
    """What the in-process mode returned before: the dense search, then one restricted to the chunks it missed."""
    s = hybrid.settings
    dense = hybrid.dense.search(embedding, category).candidates
    exact, _ = hybrid._exact(query)
    hits = hybrid.lexical.search(query, s.retrieval.lexical_top_k, category)
    known = {c.chunk_id for c in dense}
    missing = [c for c in exact if c not in known]
    missing += [h.chunk_id for h in hits if h.chunk_id not in known and h.score >= s.lexical_rescore_min]
    missing = list(dict.fromkeys(missing))
    extra = hybrid.dense.search(embedding, category, ids=missing).candidates if missing else []
    return one_version_per_source(dense + extra), len(missing)


def rows_kept(hybrid: HybridRetriever, embedding: list[float], category: str | None = None) -> None:
    """What an earlier lookup leaves: the rows of the dense search's hits kept (the sdk path's dense search then
    returns ids and scores only, and reads no row)."""
    hybrid.dense.search(embedding, category, kept=hybrid.kept)


@pytest.mark.parametrize("category", [None, "mysql"])
def test_the_dense_search_returns_ids_and_its_rows_come_from_kept_chunks(in_process, embed_model, category):
    """On the sdk path the dense search asks for ids and scores only: the rows it lacks are read by key once and
    kept; the candidates are the ones a search returning the fields gives, field for field."""
    lookup = in_process.with_settings()
    for query in QUERIES:
        embedding = embed_query(embed_model, query)
        expected = lookup.dense.search(embedding, category)
        calls = []
        for _ in range(2):
            slow = SlowSearches(lookup.client, delay_s=0.0)
            try:
                found = lookup.dense.search(embedding, category, kept=lookup.hybrid.kept)
            finally:
                slow.restore()
            calls.append(slow.names)
            assert [c.model_dump() for c in found.candidates] == [c.model_dump() for c in expected.candidates]
        assert calls[1] == ["dense"] and calls[0] in (["dense"], ["dense", "read"])  # read once, if not kept yet
    assert len(lookup.hybrid.kept) > 0


def test_a_full_store_of_kept_chunks_searches_with_the_fields(in_process, embed_model):
    bounded = in_process.with_settings(memory_plan_max_mb=0.01)  # two chunks' worth (~4.6 KB each)
    embedding = embed_query(embed_model, QUERIES[0])
    expected = bounded.dense.search(embedding)
    first = bounded.dense.search(embedding, kept=bounded.hybrid.kept)
    assert bounded.hybrid.kept.full and len(bounded.hybrid.kept) == 2
    slow = SlowSearches(bounded.client, delay_s=0.0)
    try:
        second = bounded.dense.search(embedding, kept=bounded.hybrid.kept)
    finally:
        slow.restore()
    assert slow.names == ["dense"] and first.reads == 1 and second.reads == 0
    for found in (first, second):
        assert [c.model_dump() for c in found.candidates] == [c.model_dump() for c in expected.candidates]


def test_a_hit_deleted_before_its_row_is_read_is_left_out(in_process, embed_model):
    lookup = in_process.with_settings()
    embedding = embed_query(embed_model, QUERIES[0])
    expected = [c.chunk_id for c in lookup.dense.search(embedding).candidates]
    original = lookup.client.query

    def without_the_first(*args, **kwargs):  # the first hit's row is gone by the time it is read
        return [row for row in original(*args, **kwargs) if row[lookup.settings.schema_fields.id_field] != expected[0]]

    lookup.client.query = without_the_first
    try:
        found = lookup.dense.search(embedding, kept=lookup.hybrid.kept)
    finally:
        lookup.client.query = original
    assert [c.chunk_id for c in found.candidates] == expected[1:]


@pytest.mark.parametrize("top_k", [20, 1])
@pytest.mark.parametrize("category", [None, "mysql"])
def test_candidates_are_those_of_two_searches_in_a_row(in_process, embed_model, top_k, category):
    lookup = in_process.with_settings(top_k=top_k)
    for query in QUERIES * 2:  # the second time the chunks read by key are scored from their kept vectors
        embedding = embed_query(embed_model, query)
        expected, added = two_searches_in_a_row(lookup.hybrid, embedding, query, category)
        found = lookup.hybrid.search(embedding, query, category)
        assert [c.chunk_id for c in found.candidates] == [c.chunk_id for c in expected]
        # Milvus Lite scores a restricted search with one matrix product over the chunks it is restricted to, so a
        # chunk's score can differ in the last float32 bit with the set (the server scores each chunk on its own:
        # there they are equal, tests/indexing/test_milvus_server.py).
        for got, want in zip(found.candidates, expected, strict=True):
            assert got.score == pytest.approx(want.score, abs=1e-6)
        assert found.lexical_added == added


class SlowSearches:
    """Wraps the client's ``search`` and ``query``: each call takes at least ``delay_s``; records each call's start
    and end, and what it was: ``dense`` (a search), ``restricted`` (a search restricted to ids), ``read`` (a query
    by key). A search sent ahead (``_async``) starts when it is sent and ends when its answer is taken, at least
    ``delay_s`` later."""

    def __init__(self, client, delay_s: float) -> None:
        self.spans: list[tuple[float, float]] = []
        self.names: list[str] = []
        self._lock = threading.Lock()
        self._originals = {"search": client.search, "query": client.query}
        self._client = client
        self.delay_s = delay_s
        client.search = self._wrap("search")
        client.query = self._wrap("query")

    def _wrap(self, method: str):
        original = self._originals[method]

        def call(*args, **kwargs):
            start = time.monotonic()
            if kwargs.get("_async"):
                return _Later(original(*args, **kwargs), lambda: self._done(method, kwargs, start))
            try:
                return original(*args, **kwargs)
            finally:
                self._done(method, kwargs, start)

        return call

    def _done(self, method: str, kwargs: dict, start: float) -> None:
        time.sleep(max(0.0, self.delay_s - (time.monotonic() - start)))
        by_ids = " in [" in (kwargs.get("filter") or "")
        with self._lock:
            self.spans.append((start, time.monotonic()))
            self.names.append("read" if method == "query" else "restricted" if by_ids else "dense")

    def restore(self) -> None:
        self._client.search = self._originals["search"]
        self._client.query = self._originals["query"]


class _Later:
    """A search future whose answer is taken through ``done`` (the call's end)."""

    def __init__(self, future, done) -> None:
        self._future = future
        self._done = done

    def result(self, **kwargs):
        try:
            return self._future.result(**kwargs)
        finally:
            self._done()


def test_the_read_by_key_runs_alongside_the_dense_search(in_process, embed_model):
    query = QUERIES[1]  # an exact identifier and BM25 hits: chunks to score besides the dense search
    lookup = in_process.with_settings(top_k=1)
    embedding = embed_query(embed_model, query)
    rows_kept(lookup.hybrid, embedding)
    slow = SlowSearches(lookup.client, delay_s=0.3)
    try:
        found = lookup.hybrid.search(embedding, query, None)
    finally:
        slow.restore()
    assert sorted(slow.names) == ["dense", "read"] and found.milvus_calls == 2 and found.lexical_added > 0
    (a_start, a_end), (b_start, b_end) = slow.spans
    # The two calls overlap (each held 0.3 s): the lookup waits for one call's time, not two in a row.
    assert a_start < b_end and b_start < a_end


def test_the_dense_search_goes_out_before_bm25_and_the_read_after_it(in_process, embed_model, monkeypatch):
    """The dense search is sent before BM25 runs (no thread of ours waits for it: BM25 runs while Milvus searches),
    and the read by key of the chunks BM25 brings goes out once BM25 has run, while the dense search is still out."""
    query = QUERIES[1]
    lookup = in_process.with_settings(top_k=1)
    bm25: list[tuple[float, float]] = []
    original = type(lookup.lexical).search

    def timed(index, *args, **kwargs):
        started = time.monotonic()
        try:
            time.sleep(0.05)  # a slow BM25
            return original(index, *args, **kwargs)
        finally:
            bm25.append((started, time.monotonic()))

    embedding = embed_query(embed_model, query)
    rows_kept(lookup.hybrid, embedding)
    monkeypatch.setattr(type(lookup.lexical), "search", timed)
    slow = SlowSearches(lookup.client, delay_s=0.2)
    try:
        lookup.hybrid.search(embedding, query, None)
    finally:
        slow.restore()
    assert len(bm25) == 1 and sorted(slow.names) == ["dense", "read"]
    spans = dict(zip(slow.names, slow.spans, strict=True))
    (bm25_start, bm25_end), (dense_start, dense_end), (read_start, _) = bm25[0], spans["dense"], spans["read"]
    assert dense_start <= bm25_start and bm25_end <= read_start < dense_end


def test_the_sdk_path_needs_no_worker_thread_for_the_dense_search(in_process, embed_model, monkeypatch):
    """On the sdk path the dense search is sent from the searching thread itself, a read by key beside it or not:
    no hand-off to a second pool (each hand-off a thread wake-up on the lookup's path)."""
    from kb_retrieval.retrieval.deadline import DENSE_BESIDE

    def no_worker(*args, **kwargs):
        raise AssertionError("the dense search was handed to a worker")

    monkeypatch.setattr(DENSE_BESIDE, "submit", no_worker)
    lookup = in_process.with_settings(top_k=1)
    for query in QUERIES:
        embedding = embed_query(embed_model, query)
        first = lookup.hybrid.search(embedding, query, None)  # chunks to read beside it, the first time
        again = lookup.hybrid.search(embedding, query, None)  # all kept: nothing beside it
        assert [c.chunk_id for c in again.candidates] == [c.chunk_id for c in first.candidates]


def test_a_lookup_makes_one_round_trip_per_attempt(in_process):
    """Every attempt's Milvus calls overlap: at most one dense search and one read by key, at the same time."""
    for query in QUERIES:
        in_process.lookup(query)  # warm: the evidence documents' sections are cached
        slow = SlowSearches(in_process.client, delay_s=0.2)
        try:
            result = in_process.lookup(query)
        finally:
            slow.restore()
        attempts = result.retrieval_trace.attempts
        assert len(slow.spans) == sum(a.milvus_calls for a in attempts) <= 2 * len(attempts)
        assert slow.names.count("dense") == len(attempts)
        spans = sorted(slow.spans)
        overlapping = sum(1 for (_, end), (start, _) in itertools.pairwise(spans) if start < end)
        assert "restricted" not in slow.names
        assert overlapping == len(spans) - len(attempts)  # each attempt's read overlaps its dense search


def test_no_bm25_or_identifier_chunks_means_one_search(in_process, embed_model):
    from kb_retrieval.retrieval.bm25 import LexicalIndex

    texts = [(c, f"{c} text", "") for c in ("a", "b")]  # BM25 finds nothing for the query
    hybrid = HybridRetriever(in_process.dense, LexicalIndex.build(texts), in_process.settings, exact=in_process.exact)
    query = QUERIES[0]
    embedding = embed_query(embed_model, query)
    rows_kept(hybrid, embedding)
    slow = SlowSearches(in_process.client, delay_s=0.0)
    try:
        found = hybrid.search(embedding, query, None)
    finally:
        slow.restore()
    assert slow.names == ["dense"] and found.milvus_calls == 1 and found.lexical_added == 0


def test_a_failed_read_keeps_the_dense_candidates(in_process, embed_model, caplog):
    query = QUERIES[1]
    lookup = in_process.with_settings(top_k=1)
    embedding = embed_query(embed_model, query)
    rows_kept(lookup.hybrid, embedding)
    original = lookup.client.query

    def failing(*args, **kwargs):
        if " in [" in (kwargs.get("filter") or ""):
            raise RuntimeError("read by key down")
        return original(*args, **kwargs)

    lookup.client.query = failing
    try:
        found = lookup.hybrid.search(embedding, query, None)
    finally:
        lookup.client.query = original
    assert [c.chunk_id for c in found.candidates] == [c.chunk_id for c in lookup.dense.search(embedding).candidates]
    assert "scoring lexical candidates failed: read by key down" in caplog.text


def test_chunks_read_once_are_scored_from_their_kept_vectors(in_process, embed_model):
    """A second search of the same query sends the dense search alone and finds what the first found; a reload of
    the retrieval state (a new BM25 index) starts the kept vectors anew."""
    query = QUERIES[1]
    lookup = in_process.with_settings(top_k=1)
    embedding = embed_query(embed_model, query)
    runs = []
    for _ in range(2):
        slow = SlowSearches(lookup.client, delay_s=0.0)
        try:
            runs.append((lookup.hybrid.search(embedding, query, None), sorted(slow.names)))
        finally:
            slow.restore()
    (first, first_calls), (second, second_calls) = runs
    # The first: the dense search, the read of BM25's hits (beside it) and of the dense hit's row (after it, unless
    # the read beside it, being a BM25 hit too, kept it first).
    assert first_calls in (["dense", "read"], ["dense", "read", "read"]) and first.milvus_calls == len(first_calls)
    assert second_calls == ["dense"] and len(lookup.hybrid.kept) > 0
    assert second.milvus_calls == 1 and second.lexical_added == first.lexical_added > 0
    assert [c.chunk_id for c in second.candidates] == [c.chunk_id for c in first.candidates]
    assert [c.score for c in second.candidates] == pytest.approx([c.score for c in first.candidates], abs=1e-6)
    kept = lookup.hybrid.kept
    assert lookup.refresh(force=True)  # a reload: a new state, a new pipeline with nothing kept yet
    assert len(lookup.hybrid.kept) == 0 and lookup.hybrid.kept is not kept and len(kept) > 0


def test_kept_vectors_stop_at_the_memory_bound(in_process, embed_model):
    embedding = embed_query(embed_model, QUERIES[1])
    unbounded = in_process.with_settings(top_k=1)
    unbounded.hybrid.search(embedding, QUERIES[1], None)
    assert len(unbounded.hybrid.kept) > 2
    bounded = in_process.with_settings(top_k=1, memory_plan_max_mb=0.01)  # two chunks' worth (~4.6 KB each)
    assert bounded.hybrid.kept.max_chunks == 2
    bounded.hybrid.search(embedding, QUERIES[1], None)
    assert len(bounded.hybrid.kept) == 2


def test_a_failed_read_keeps_the_chunks_scored_from_kept_vectors(in_process, embed_model, caplog):
    query = QUERIES[1]
    lookup = in_process.with_settings(top_k=1)
    embedding = embed_query(embed_model, query)
    first = lookup.hybrid.search(embedding, query, None)
    added = [c.chunk_id for c in first.candidates[1:]]  # top_k 1: the rest came from the read
    assert len(added) >= 2
    lookup.hybrid.kept._vectors.pop(added[0])  # one chunk to read again, the others kept
    original = lookup.client.query

    def failing(*args, **kwargs):
        raise RuntimeError("read by key down")

    lookup.client.query = failing
    try:
        found = lookup.hybrid.search(embedding, query, None)
    finally:
        lookup.client.query = original
    assert [c.chunk_id for c in found.candidates] == [first.candidates[0].chunk_id, *added[1:]]
    assert "scoring lexical candidates failed: read by key down" in caplog.text
