"""The memory lookup plan: the same answers as a search in Milvus, from a mirror that follows other processes."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import pytest

from kb_retrieval.config import KBSettings
from kb_retrieval.retrieval.bm25 import Bm25Postings, analyse
from kb_retrieval.retrieval.l1.base import to_candidate
from kb_retrieval.retrieval.l1.memory import MemoryMirror, choose_plan
from kb_retrieval.retrieval.scope import FieldTest
from tests.conftest import SAMPLE_KB, SHARED
from tests.indexing.test_lite_processes import _cli, lite_server  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.unit
def test_bm25_scores_are_milvus_lites_to_the_bit():
    """An independent implementation to pin against: Milvus Lite's own per-segment BM25 index."""
    from milvus_lite.analyzer.sparse import compute_tf
    from milvus_lite.analyzer.standard import StandardAnalyzer
    from milvus_lite.index.sparse_inverted import SparseInvertedIndex

    rng = random.Random(3)
    words = [f"w{i}" for i in range(60)] + ["redi", "memori", "kube_pod", "replica"]
    texts = [" ".join(rng.choices(words, k=rng.randint(0, 40))) for _ in range(300)]
    analyzer = StandardAnalyzer()
    lite = SparseInvertedIndex()
    lite.build([compute_tf(analyzer.analyze(t)) for t in texts])
    ours = Bm25Postings(texts)
    for query in ["redi memori memori", "kube_pod replica w3", "w1 w2 w3 w4 w5 w6", "absent"]:
        ids, dists = lite.search([compute_tf(analyzer.analyze(query))], top_k=len(texts))
        expected = {int(i): -float(d) for i, d in zip(ids[0], dists[0], strict=True) if i >= 0 and d < 0}
        rows, scores = ours.scores(query)
        assert dict(zip(rows.tolist(), scores.tolist(), strict=True)) == expected
        # Among equal scores, Lite's order: the row a query term reached first.
        ranked = [int(r) for r in rows[np.argsort(-scores, kind="stable")]]
        assert ranked == [int(i) for i in ids[0] if i >= 0 and i in expected]


@pytest.mark.unit
def test_bm25_top_is_the_stable_sort_of_every_score():
    """``top`` (a partition, ties at the cut kept) returns what sorting every scored row gives, ties in first-reach
    order, with and without a mask of allowed rows; few distinct words make many equal scores."""
    rng = random.Random(5)
    words = ["alpha", "beta", "gamma", "delta", "kube_pod", "redi"]
    texts = [" ".join(rng.choices(words, k=rng.randint(0, 6))) for _ in range(400)]
    postings = Bm25Postings(texts)
    within = np.asarray([rng.random() < 0.4 for _ in texts])
    for query in ["alpha", "gamma beta alpha", "redi redi kube_pod", "delta absent", "absent"]:
        rows, scores = postings.scores(query)
        ranked = rows[np.argsort(-scores, kind="stable")]
        for k in (1, 3, 20, 1000):
            top_rows, top_scores = postings.top(query, k)
            assert top_rows.tolist() == ranked[:k].tolist()
            assert top_scores.tolist() == scores[np.argsort(-scores, kind="stable")][:k].tolist()
            inside = ranked[within[ranked]]
            assert postings.top(query, k, within)[0].tolist() == inside[:k].tolist()
        assert postings.top(query, 0)[0].tolist() == []


@pytest.mark.unit
def test_analyse_is_the_standard_analyser():
    assert analyse("KubePodCrashLooping: pod api-7f9 (95%)") == ["kubepodcrashlooping", "pod", "api", "7f9", "95"]


@pytest.mark.unit
def test_a_rows_candidate_is_made_once_and_each_search_gets_its_own(tmp_path):
    """The mirror keeps one candidate per row and rescores it: every search's candidates are what to_candidate makes
    of the hit, and a stage changing one does not change the next search's."""
    settings = KBSettings(state_dir=tmp_path, dim=2)
    meta = {"title": "Redis", "keywords": ["RedisMemoryHigh"], "entities": [], "position": 0, "chunk_count": 2}
    rows = [
        {"id": f"c{i}", "content": f"chunk {i}", "source": "redis.md", "category": "redis", "metadata": dict(meta)}
        for i in range(2)
    ]
    mirror = MemoryMirror(settings, rows, np.asarray([[1.0, 0.0], [0.6, 0.8]], dtype=np.float32), [])
    for query in ([1.0, 0.0], [0.0, 1.0], [1.0, 0.0]):
        found = mirror.search(query, 2, None, None).candidates
        assert sorted(c.chunk_id for c in found) == ["c0", "c1"]
        for candidate in found:
            row = rows[int(candidate.chunk_id[1:])]
            fresh = to_candidate(
                settings,
                chunk_id=row["id"],
                raw_score=candidate.score,
                fields=row,
                content=row["content"],
                path="memory",
            )
            assert candidate == fresh
            candidate.keywords.append("changed by a stage")

    lite = KBSettings(state_dir=tmp_path)
    assert choose_plan(None, lite, custom_path=False)[0] == "memory"  # type: ignore[arg-type]
    assert choose_plan(None, lite, custom_path=True)[0] == "milvus"  # type: ignore[arg-type]
    sdk = KBSettings(state_dir=tmp_path, vector_store_mode="sdk")
    plan, reason = choose_plan(None, sdk, custom_path=False)  # type: ignore[arg-type]
    assert plan == "milvus" and "vector_store_mode 'sdk'" in reason
    forced = KBSettings(state_dir=tmp_path, vector_store_mode="sdk", lookup_plan="memory")
    assert choose_plan(None, forced, custom_path=False)[0] == "memory"  # type: ignore[arg-type]

    class Server:
        def get_server_version(self) -> str:
            return "v2.3.5"

    server = KBSettings(state_dir=tmp_path, milvus_uri="http://127.0.0.1:1")
    plan, reason = choose_plan(Server(), server, custom_path=False)  # type: ignore[arg-type]
    assert plan == "milvus" and "server" in reason


def _scoped_mirror(tmp_path) -> MemoryMirror:
    settings = KBSettings(state_dir=tmp_path, dim=2)
    rows = [
        {"id": f"c{i}", "content": f"chunk {i}", "source": f"{cat}-{i % 2}.md", "category": cat, "metadata": {}}
        for i, cat in enumerate(["redis", "redis", "mysql", "mysql", "linux", "linux"])
    ]
    vectors = np.asarray([[1.0, i / 10] for i in range(len(rows))], dtype=np.float32)
    return MemoryMirror(settings, rows, vectors, ["redi memori"] * len(rows))


def _kept(mirror: MemoryMirror, *tests: FieldTest) -> list[str]:
    return [mirror.ids[i] for i in np.flatnonzero(mirror.scope_mask(tests))]


@pytest.mark.unit
def test_a_scope_of_field_tests_is_a_row_mask(tmp_path):
    mirror = _scoped_mirror(tmp_path)
    assert _kept(mirror, FieldTest("id", frozenset({"c1"}), negated=True)) == ["c0", "c2", "c3", "c4", "c5"]
    assert _kept(mirror, FieldTest("id", frozenset({"c1", "c4", "absent"}))) == ["c1", "c4"]
    assert _kept(mirror, FieldTest("category", frozenset({"mysql"}))) == ["c2", "c3"]
    assert _kept(mirror, FieldTest("category", frozenset({"mysql", "redis"}), negated=True)) == ["c4", "c5"]
    assert _kept(mirror, FieldTest("source", frozenset({"redis-1.md", "linux-1.md"}))) == ["c1", "c5"]
    and_ = (FieldTest("category", frozenset({"redis", "linux"})), FieldTest("id", frozenset({"c0"}), negated=True))
    assert _kept(mirror, *and_) == ["c1", "c4", "c5"]
    assert _kept(mirror) == mirror.ids


@pytest.mark.unit
def test_a_scoped_mirror_search_is_the_search_of_the_rows_in_scope(tmp_path):
    """Dense and fused searches under a scope return what the same search restricted to the rows in scope returns."""
    mirror = _scoped_mirror(tmp_path)
    scope = (FieldTest("category", frozenset({"redis", "mysql"})), FieldTest("id", frozenset({"c3"}), negated=True))
    inside = ["c0", "c1", "c2"]
    query = [0.0, 1.0]
    assert [c.chunk_id for c in mirror.search(query, 2, None, None, scope).candidates] == ["c2", "c1"]
    assert mirror.search(query, 6, None, None, scope).candidates == mirror.search(query, 6, None, inside).candidates
    assert [c.chunk_id for c in mirror.search(query, 6, "redis", ["c0", "c3", "c4"], scope).candidates] == ["c0"]
    fused = mirror.hybrid_search(query, "redi", None, ["c3", "c4"], top_k=1, lexical_top_k=6, scope=scope)
    assert sorted(fused.bm25) == inside and {c.chunk_id for c in fused.candidates} == set(inside)


@pytest.mark.unit
def test_only_a_scope_the_mirror_evaluates_stays_in_memory(tmp_path):
    """The one place that decides: field tests on fields the mirror holds stay in memory; any other scope (a JSON
    key, ``or``: no tests; a field the mirror does not hold) goes to Milvus; no mirror, always Milvus."""
    from kb_retrieval.retrieval.l1.retriever import L1Retriever
    from kb_retrieval.retrieval.scope import Scope

    mirror = _scoped_mirror(tmp_path)
    retriever = L1Retriever(None, mirror.settings, None, memory=mirror)  # type: ignore[arg-type]
    assert retriever.mirror_for(None) is mirror
    assert retriever.mirror_for(Scope('id != "c1"', (FieldTest("id", frozenset({"c1"}), negated=True),))) is mirror
    assert retriever.mirror_for(Scope('metadata["team"] == "sre"', None)) is None
    assert retriever.mirror_for(Scope('content == "x"', (FieldTest("content", frozenset({"x"})),))) is None
    retriever.memory = None
    assert retriever.mirror_for(Scope('id != "c1"', (FieldTest("id", frozenset({"c1"}), negated=True),))) is None


def _both_plans(lookup, embed_model):
    from kb_retrieval.engine import KnowledgeLookup

    def build(plan: str):
        settings = lookup.settings.model_copy(update={"lookup_plan": plan})
        return KnowledgeLookup(settings, embed_model=embed_model, client=lookup.client, trace_store=lookup.traces)

    return build("memory"), build("milvus")


def _answer(lookup, query: str) -> tuple:
    result, ranking = lookup.lookup_ranked(query)
    blocks = [(b.source, b.hit_reasons, round(b.similarity, 6)) for b in result.evidence_blocks]
    return result.found, result.evidence_status, blocks, [(c.chunk_id, round(c.score, 6)) for c in ranking]


def _same_answers(lookup, embed_model, queries: list[str]) -> None:
    memory, milvus = _both_plans(lookup, embed_model)
    assert memory.plan == "memory" and milvus.plan == "milvus"
    for query in queries:
        assert _answer(memory, query) == _answer(milvus, query), query
    result = memory.lookup(queries[0])
    assert {a.path for a in result.retrieval_trace.attempts} == {"memory"}
    assert all(a.milvus_calls == 0 for a in result.retrieval_trace.attempts)


def test_memory_plan_answers_as_milvus_on_the_sample_kb(sample_lookup, embed_model):
    queries = [json.loads(line)["query"] for line in (REPO / "golden" / "sample-kb.jsonl").read_text().splitlines()]
    assert len(queries) >= 20
    _same_answers(sample_lookup, embed_model, queries)


def test_memory_plan_answers_as_milvus_on_the_runbooks(runbooks_lookup, embed_model):
    queries = []
    for name in ("runbooks-alerts-dev.jsonl", "runbooks-paraphrase-dev.jsonl"):
        lines = (SHARED / "golden" / name).read_text().splitlines()
        queries += [json.loads(line)["query"] for line in lines[:30]]
    _same_answers(runbooks_lookup, embed_model, queries)


def _scoped_answer(lookup, query: str, filters) -> tuple:
    details = lookup.lookup_detailed(query, filters=filters)
    blocks = [(b.source, b.hit_reasons, round(b.similarity, 6)) for b in details.result.evidence_blocks]
    ranking = [(c.chunk_id, round(c.score, 6)) for c in details.ranking]
    return details.result.found, details.result.evidence_status, blocks, ranking


def test_a_scope_the_mirror_evaluates_answers_as_milvus_without_a_milvus_search(sample_lookup, embed_model):
    """Scopes of field tests (each operator, AND; the ranking fit's own ``id != chunk``): the memory plan gives the
    milvus plan's candidates, scores and evidence, makes no Milvus search and says so in the trace; a scope on a
    metadata key still goes to Milvus."""
    from llama_index.core.vector_stores.types import FilterOperator, MetadataFilter, MetadataFilters

    memory, milvus = _both_plans(sample_lookup, embed_model)
    query = "redis memory usage is high and keys are evicted"
    first = milvus.lookup_detailed(query).ranking[0]
    scopes = [
        [MetadataFilter(key="id", value=first.chunk_id, operator=FilterOperator.NE)],
        [MetadataFilter(key="category", value="redis")],
        [MetadataFilter(key="source", value=[first.source, "mysql/replication-lag.md"], operator=FilterOperator.IN)],
        [MetadataFilter(key="category", value=["redis"], operator=FilterOperator.NIN)],
        [
            MetadataFilter(key="category", value="redis"),
            MetadataFilter(key="source", value=first.source, operator=FilterOperator.NE),
        ],
    ]
    searches: list[str] = []
    client = sample_lookup.client

    def refused(name: str):
        def call(*args, **kwargs):
            searches.append(name)
            raise AssertionError(f"the memory plan sent a Milvus {name}")

        return call

    for filters in scopes:
        scope = MetadataFilters(filters=filters)
        expected = _scoped_answer(milvus, query, scope)
        assert expected[2], filters  # the scope keeps some evidence: a comparison, not two empty answers
        with pytest.MonkeyPatch.context() as patch:
            for name in ("search", "hybrid_search", "query"):  # (sections too: from the mirror's rows)
                patch.setattr(client, name, refused(name))
            assert _scoped_answer(memory, query, scope) == expected, filters
            attempts = memory.lookup(query, filters=scope).retrieval_trace.attempts
        assert {a.path for a in attempts} == {"memory"} and all(a.milvus_calls == 0 for a in attempts)
        assert {a.path for a in milvus.lookup(query, filters=scope).retrieval_trace.attempts} != {"memory"}
    assert searches == []
    metadata_key = MetadataFilters(filters=[MetadataFilter(key="title", value="Redis memory usage high")])
    assert {a.path for a in memory.lookup(query, filters=metadata_key).retrieval_trace.attempts} != {"memory"}


def test_the_memory_plan_expands_documents_from_the_mirror_without_a_milvus_query(sample_lookup, embed_model):
    """Every evidence document's sections on the memory plan are the milvus plan's (read from Milvus), and come from
    the mirror's rows: no Milvus call at all, with the section cache empty."""
    from kb_retrieval.retrieval.expand import DocumentExpander, MirrorSectionStore, SectionStore

    memory, milvus = _both_plans(sample_lookup, embed_model)
    queries = [json.loads(line)["query"] for line in (REPO / "golden" / "sample-kb.jsonl").read_text().splitlines()]

    def sections(lookup, query: str) -> list[tuple[str, list]]:
        return [(b.source, b.sections) for b in lookup.lookup(query).evidence_blocks]

    expected = {query: sections(milvus, query) for query in queries[:12]}
    assert sum(len(s) for blocks in expected.values() for _, s in blocks) > 100  # documents were expanded
    (expander,) = [p for p in memory.pipeline.postprocessors if isinstance(p, DocumentExpander)]
    (plain,) = [p for p in milvus.pipeline.postprocessors if isinstance(p, DocumentExpander)]
    assert isinstance(expander.sections, MirrorSectionStore) and type(plain.sections) is SectionStore
    expander.sections._cache.clear()  # what teaching the fit read: every document is read again below
    calls: list[str] = []

    def refused(name: str):
        def call(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"the memory plan sent a Milvus {name}")

        return call

    with pytest.MonkeyPatch.context() as patch:
        for name in ("query", "search", "hybrid_search"):  # (the freshness check reads the version by key)
            patch.setattr(sample_lookup.client, name, refused(name))
        for query, blocks in expected.items():
            assert sections(memory, query) == blocks, query
    assert calls == []


@pytest.mark.timeout(600)
def test_the_mirror_sees_another_processs_ingest(lite_server, tmp_path, embed_model):  # noqa: F811
    """A long-lived lookup on the memory plan (``milvus-lite server``: a Lite engine, so ``auto`` mirrors it) finds
    what another process ingested within the freshness interval, without a restart."""
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.traces import TraceStore

    first = _cli("ingest", str(SAMPLE_KB / "redis"), "--uri", lite_server, "--state-dir", str(tmp_path / "a"))
    assert first.returncode == 0, first.stderr
    settings = KBSettings(state_dir=tmp_path / "here", milvus_uri=lite_server, freshness_check_s=1.0)
    lookup = KnowledgeLookup(settings, embed_model=embed_model, trace_store=TraceStore("sqlite://"))
    assert lookup.plan == "memory"
    query = "MySQLReplicationLag: replica db-replica-02 is 412 seconds behind its source"
    assert "replication-lag.md" not in [b.source for b in lookup.lookup(query).evidence_blocks]
    more = _cli("ingest", str(SAMPLE_KB / "mysql"), "--uri", lite_server, "--state-dir", str(tmp_path / "b"))
    assert more.returncode == 0, more.stderr
    ingested = time.monotonic()
    seen = None
    while seen is None and time.monotonic() - ingested < 10:
        result = lookup.lookup(query)
        if result.found and result.evidence_blocks[0].source == "replication-lag.md":
            seen = time.monotonic() - ingested
        time.sleep(0.1)
    # Seen by the same lookup object, without a restart (how soon is the bench's to measure, not a test's).
    assert seen is not None, "the memory plan did not see the other process's ingest within 10 s"
    assert lookup.memory is not None and "replication-lag.md" in {r["source"] for r in lookup.memory.rows}
    assert result.retrieval_trace.attempts[-1].path == "memory"
    assert any(r.startswith("lexical_bm25") for r in result.evidence_blocks[0].hit_reasons)
    lookup.close()


def test_with_settings_sizes_reach_the_memory_plans_fused_search(sample_lookup, embed_model):
    """``with_settings(top_k=...)`` (and ``lexical_top_k``) changes what the mirror's fused search returns, as it
    changes Milvus' hybrid search: one mirror serves every settings variant, each with its own sizes."""
    memory, milvus = _both_plans(sample_lookup, embed_model)
    assert memory.plan == "memory"
    query = "redis memory usage is high and keys are evicted"
    counts = {}
    for top_k, lexical_top_k in ((1, 1), (3, 2), (40, 40)):
        narrow_memory = memory.with_settings(top_k=top_k, lexical_top_k=lexical_top_k)
        narrow_milvus = milvus.with_settings(top_k=top_k, lexical_top_k=lexical_top_k)
        assert _answer(narrow_memory, query) == _answer(narrow_milvus, query), top_k
        (attempt,) = narrow_memory.lookup(query).retrieval_trace.attempts
        assert attempt.path == "memory"
        counts[top_k] = attempt.candidate_count
    assert counts[1] < counts[3] < counts[40], counts
