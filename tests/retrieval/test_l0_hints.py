"""L0 hints over a hand-built index, and the query transform that turns them into an optional category filter."""

from __future__ import annotations

import pytest

from kb_retrieval.indexing.l0_index import L0Entry, L0Index
from kb_retrieval.retrieval.l0_hints import L0HintProvider, title_terms
from kb_retrieval.retrieval.query_transform import EmptyQueryError, transform_query

pytestmark = pytest.mark.unit


def entry(
    title: str, category: str | None, keywords: list[str] | None = None, entities: list[str] | None = None
) -> L0Entry:
    return L0Entry(kb="kb", title=title, category=category, keywords=keywords or [], entities=entities or [])


INDEX = L0Index(
    documents={
        "redis/memory.md": entry(
            "Redis memory high",
            "redis",
            ["RedisMemoryHigh", "INFO memory", "maxmemory", "Mitigation"],
            ["cache-01"],
        ),
        "redis/latency.md": entry("Redis latency spikes", "redis", ["RedisLatencyHigh", "Mitigation", "the"]),
        "mysql/slow.md": entry("Slow query log analysis", "mysql", ["MySQLSlowQueries", "eviction", "Mitigation"]),
        "mysql/repl.md": entry("Replication lag", "mysql", ["MySQLReplicationLag", "Mitigation"], ["db-primary"]),
        "jvm/gc.md": entry("Old gen GC pressure", "jvm", ["JvmGcPressure", "heap"]),
        "linux/disk.md": entry("Disk full", "linux", ["NodeFilesystemAlmostFull"]),
    }
)


@pytest.fixture(scope="module")
def provider() -> L0HintProvider:
    return L0HintProvider(INDEX)


def test_camelcase_alert_keyword_gives_its_domain(provider: L0HintProvider) -> None:
    hints = provider.hints("RedisMemoryHigh firing on prod")
    assert hints.matched_keywords == ["RedisMemoryHigh"]
    assert hints.domains == ["redis"]
    assert hints.matched_sources == ["redis/memory.md"]


def test_multi_word_keyword_matches_as_contiguous_phrase(provider: L0HintProvider) -> None:
    hints = provider.hints("what does INFO memory tell me")
    assert hints.matched_keywords == ["INFO memory"]
    assert hints.domains == ["redis"]
    assert provider.hints("memory info please").matched_keywords == []  # wrong order
    assert provider.hints("info about memory").matched_keywords == []  # not contiguous


def test_entity_match_is_reported(provider: L0HintProvider) -> None:
    hints = provider.hints("latency on cache-01 and db-primary")
    assert hints.entities == ["cache-01", "db-primary"]
    assert provider.hints("cache 02 is fine").entities == []


def test_whole_title_in_query_matches(provider: L0HintProvider) -> None:
    hints = provider.hints("runbook for disk full on node")
    assert hints.matched_titles == ["Disk full"]
    assert hints.domains == ["linux"]


def test_title_matches_when_all_content_words_present_in_any_order(provider: L0HintProvider) -> None:
    hints = provider.hints("analysis of the slow log for a query")
    assert hints.matched_titles == ["Slow query log analysis"]
    assert hints.domains == ["mysql"]
    assert provider.hints("slow log analysis").matched_titles == []  # "query" missing


def test_generic_keyword_shared_by_many_documents_is_ignored(provider: L0HintProvider) -> None:
    hints = provider.hints("mitigation steps")
    assert hints.matched_keywords == []
    assert hints.domains == []
    assert hints.matched_sources == []


def test_stopword_keyword_is_ignored(provider: L0HintProvider) -> None:
    assert provider.hints("the").matched_keywords == []


def test_plain_word_keyword_of_few_documents_boosts_but_sets_no_domain(provider: L0HintProvider) -> None:
    hints = provider.hints("set maxmemory higher")
    assert hints.matched_keywords == ["maxmemory"]
    assert hints.matched_sources == ["redis/memory.md"]  # the reranker boosts it
    assert hints.domains == []  # one plain word does not narrow the search to a domain


def test_specific_match_wins_over_generic_word_for_the_domain(provider: L0HintProvider) -> None:
    hints = provider.hints("RedisMemoryHigh with eviction")
    assert hints.matched_keywords == ["RedisMemoryHigh", "eviction"]  # both reported
    assert hints.domains == ["redis"]  # but only the alert name decides
    assert set(hints.matched_sources) == {"redis/memory.md", "mysql/slow.md"}
    assert provider.hints("eviction").domains == []  # alone, the generic word does not decide either
    assert provider.hints("RedisMemoryHigh with eviction").domain_matches == {
        "redis": ["keyword 'RedisMemoryHigh' (redis/memory.md)"]
    }


def test_two_specific_matches_in_two_categories_give_two_domains(provider: L0HintProvider) -> None:
    hints = provider.hints("RedisLatencyHigh and JvmGcPressure at once")
    assert hints.domains == ["jvm", "redis"]
    assert hints.matched_keywords == ["JvmGcPressure", "RedisLatencyHigh"]


def test_category_name_alone_is_not_a_domain(provider: L0HintProvider) -> None:
    # "node" or "prometheus" occur in alerts of every component: only a matched entry gives a domain.
    hints = provider.hints("is MySQL down")
    assert hints.matched_keywords == [] and hints.matched_titles == []
    assert hints.domains == []


def test_matching_is_case_insensitive(provider: L0HintProvider) -> None:
    assert provider.hints("redismemoryhigh").domains == ["redis"]
    assert provider.hints("REDIS MEMORY HIGH now").matched_titles == ["Redis memory high"]
    assert provider.hints("info MEMORY").matched_keywords == ["INFO memory"]
    assert provider.hints("CACHE-01").entities == ["cache-01"]


def test_max_keyword_documents_threshold() -> None:
    # "Mitigation" is in 4 documents: ignored at 3, counted (as a weak plain word) at 4.
    assert L0HintProvider(INDEX, max_keyword_documents=3).hints("mitigation").matched_keywords == []
    hints = L0HintProvider(INDEX, max_keyword_documents=4).hints("mitigation")
    assert hints.matched_keywords == ["Mitigation"]
    assert set(hints.matched_sources) == {"redis/memory.md", "redis/latency.md", "mysql/slow.md", "mysql/repl.md"}
    assert hints.domains == []  # a plain word boosts; it never sets a domain


def test_document_keywords(provider: L0HintProvider) -> None:
    assert ("info", "memory") in provider.document_keywords("redis/memory.md")
    assert provider.document_keywords("missing.md") == set()


# --- transform_query -----------------------------------------------------------------------------------------------


def test_one_domain_sets_category_filter(provider: L0HintProvider) -> None:
    transform = transform_query("RedisMemoryHigh on cache-01", provider, max_query_chars=2000)
    assert transform.category_filter == "redis"
    assert "exactly one" in transform.filter_reason and "redis" in transform.filter_reason
    assert transform.hints.matched_keywords == ["RedisMemoryHigh"]
    assert transform.hints.entities == ["cache-01"]
    assert not transform.truncated and transform.notes == []


SPEC_AND_GUIDE = L0Index(
    documents={
        "specs/om.md": entry("OpenMetrics 1.0", "om", ["OpenMetrics 1.0", "OpenMetrics", "memory"]),
        "guides/migration.md": entry("Migration to 2.0", "guides", ["OpenMetrics", "exposition"]),
        "guides/other.md": entry("Tuning", "guides", ["memory"]),
    }
)


def test_no_filter_when_l0_also_matched_a_document_outside_the_domain() -> None:
    # The title "OpenMetrics 1.0" names the spec (domain om); the specific keyword "OpenMetrics" also matches the
    # guide of another domain: a filter to om would cut away a document L0 matched itself, so none is set.
    provider = L0HintProvider(SPEC_AND_GUIDE)
    transform = transform_query("moving from OpenMetrics 1.0 to 2.0", provider, max_query_chars=2000)
    assert transform.hints.domains == ["om"]
    assert transform.category_filter is None
    assert transform.filter_reason == "not narrowed to om: L0 also matched guides/migration.md (domain guides)"


def test_a_plain_word_of_another_domain_does_not_stop_the_filter(provider: L0HintProvider) -> None:
    # "eviction", a plain keyword of a mysql page, boosts it but does not keep the query from its redis domain.
    transform = transform_query("RedisMemoryHigh with eviction", provider, max_query_chars=2000)
    assert set(transform.hints.matched_sources) == {"redis/memory.md", "mysql/slow.md"}
    assert transform.category_filter == "redis"
    spec = L0HintProvider(SPEC_AND_GUIDE)
    assert spec.outside("om", spec.hints("OpenMetrics 1.0 memory")) == {"guides/migration.md": "guides"}


def test_outside_names_what_a_filter_would_cut_away(provider: L0HintProvider) -> None:
    # Matched by name (RedisMemoryHigh: redis; the title "Disk full": linux) and by a plain word (eviction: mysql).
    hints = provider.hints("RedisMemoryHigh and disk full with eviction")
    assert provider.outside("redis", hints) == {"linux/disk.md": "linux"}
    assert provider.outside("linux", hints) == {"redis/memory.md": "redis"}
    assert provider.outside("redis", provider.hints("RedisMemoryHigh maxmemory")) == {}


def test_two_domains_give_no_filter_and_say_ambiguous(provider: L0HintProvider) -> None:
    transform = transform_query("RedisLatencyHigh and JvmGcPressure", provider, max_query_chars=2000)
    assert transform.category_filter is None
    assert "ambiguous" in transform.filter_reason
    assert transform.hints.domains == ["jvm", "redis"]


def test_no_domain_and_no_provider(provider: L0HintProvider) -> None:
    assert transform_query("something unrelated", provider, 2000).category_filter is None
    transform = transform_query("RedisMemoryHigh", None, 2000)
    assert transform.category_filter is None
    assert transform.filter_reason == "no L0 domain"
    assert transform.hints.domains == []


def test_blank_domain_is_not_a_filter() -> None:
    index = L0Index(documents={"a.md": entry("Alpha", "  ", ["AlphaAlert"])})
    transform = transform_query("AlphaAlert", L0HintProvider(index), 2000)
    assert transform.category_filter is None


@pytest.mark.parametrize("query", ["", "   ", "\n\t \n", "\x00\x01\x7f", " \u200b\x1b "])
def test_empty_query_raises(provider: L0HintProvider, query: str) -> None:
    with pytest.raises(EmptyQueryError):
        transform_query(query, provider, max_query_chars=2000)


def test_non_string_query_raises(provider: L0HintProvider) -> None:
    with pytest.raises(EmptyQueryError, match="string"):
        transform_query(None, provider, max_query_chars=2000)  # type: ignore[arg-type]


def test_huge_query_truncated_with_note(provider: L0HintProvider) -> None:
    query = "RedisMemoryHigh " + "x" * 1_000_000
    transform = transform_query(query, provider, max_query_chars=2000)
    assert transform.truncated
    assert len(transform.original_query) == 2000
    assert len(transform.normalized_query) <= 2000
    assert transform.notes and str(len(query)) in transform.notes[0] and "2000" in transform.notes[0]
    assert transform.category_filter == "redis"  # the start of the query still counts


def test_query_at_limit_not_truncated(provider: L0HintProvider) -> None:
    transform = transform_query("a" * 100, provider, max_query_chars=100)
    assert not transform.truncated and transform.notes == []


def test_control_characters_removed_mixed_scripts_kept(provider: L0HintProvider) -> None:
    query = "Redis\x00 память\x07 内存\x1b 🔥 ok\nnext\tline"
    transform = transform_query(query, provider, max_query_chars=2000)
    assert transform.normalized_query == "Redis память 内存 🔥 ok next line"
    assert transform.original_query == query


def test_title_terms_split_identifiers_stem_and_drop_stopwords() -> None:
    assert title_terms("KubePersistentVolumeFillingUp") == {"kube", "persist", "volum", "fill", "up"}
    assert title_terms("The volumes are filling") == {"volum", "fill"}


def test_title_coverage_weighs_rare_title_terms_and_needs_two_shared() -> None:
    index = L0Index(
        documents={
            "pv-full.md": entry("KubePersistentVolumeFillingUp", "kubernetes"),
            "pv-errors.md": entry("KubePersistentVolumeErrors", "kubernetes"),
            "quota.md": entry("KubeQuotaExceeded", "kubernetes"),
            "alerting.md": entry("Alerting", "docs"),
        }
    )
    coverage = L0HintProvider(index).hints("PersistentVolume is filling up. Alerting works.").title_coverage
    # "kube" is in three titles of four, so the rare words carry a title: FillingUp is nearly covered, while
    # Errors shares two words but misses its rarest one ("errors"), which leaves it under half.
    assert list(coverage) == ["pv-full.md"] and 0.8 < coverage["pv-full.md"] < 1.0
    assert L0HintProvider(index).title_coverage("PersistentVolume is filling up", minimum=0.4) == {
        "pv-full.md": coverage["pv-full.md"],
        "pv-errors.md": pytest.approx(0.47, abs=0.01),
    }
    assert "alerting.md" not in coverage  # a one-word title is not covered by one shared word
    assert "quota.md" not in coverage  # nothing but "kube" shared
    assert L0HintProvider(index).title_coverage("PersistentVolume filling up", minimum=0.9) == {}


FRAGMENTS = L0Index(
    documents={
        # Keywords as the loader derives them: identifiers of the file name and the title, then the title.
        "k8s/KubeNodeNotReady.md": entry(
            "Kube Node Not Ready", "kubernetes", ["KubeNodeNotReady", "Kube Node Not Ready"]
        ),
        "k8s/KubePodNotReady.md": entry("Kube Pod Not Ready", "kubernetes", ["KubePodNotReady", "Kube Pod Not Ready"]),
        "operator/PrometheusOperatorNotReady.md": entry(
            "Prometheus Operator NotReady",
            "prometheus-operator",
            ["PrometheusOperatorNotReady", "NotReady", "Prometheus Operator NotReady"],
        ),
        "operator/PrometheusOperatorSyncFailed.md": entry(
            "Prometheus Operator Sync Failed", "prometheus-operator", ["PrometheusOperatorSyncFailed"]
        ),
    }
)


def test_a_shared_keyword_fragment_sets_no_domain() -> None:
    """``NotReady``, one runbook's keyword, is a piece of three runbooks' names: it boosts its runbook, and the
    query about a node is not narrowed to the operator's domain (where the node runbook is not)."""
    provider = L0HintProvider(FRAGMENTS)
    hints = provider.hints("kubectl get nodes shows a node NotReady")
    assert hints.matched_keywords == ["NotReady"]
    assert hints.matched_sources == ["operator/PrometheusOperatorNotReady.md"]
    assert hints.domains == []
    assert transform_query("kubectl get nodes shows a node NotReady", provider, 4000).category_filter is None
    assert not provider.is_a_name("NotReady")
    # The whole alert name names its runbook, and the filter reason says which match set the domain.
    transform = transform_query("PrometheusOperatorNotReady firing", provider, 4000)
    assert transform.category_filter == "prometheus-operator"
    assert "keyword 'PrometheusOperatorNotReady' (operator/PrometheusOperatorNotReady.md)" in transform.filter_reason


def test_title_coverage_names_the_domain_of_the_best_covered_title() -> None:
    provider = L0HintProvider(FRAGMENTS)
    hints = provider.hints("node went NotReady in kubectl get nodes")
    assert next(iter(hints.title_coverage)) == "k8s/KubeNodeNotReady.md"
    assert hints.coverage_domain == "kubernetes"
    assert L0HintProvider(FRAGMENTS).hints("nothing of the sort").coverage_domain is None
