"""Rare-term evidence: a plain word or UpperCamel name held by one document only, which names it in its title or a
heading, is L1 evidence of that document (``rare_term:<token>``); a word several documents hold is not. The matcher is
pinned with small fakes, then the whole lookup on a small knowledge base and on the public runbooks corpus (real
Milvus Lite, the real model)."""

from __future__ import annotations

import pytest

from kb_retrieval.retrieval.evidence import build_evidence_blocks, is_ranking_fill
from kb_retrieval.retrieval.exact import ExactIdentifierIndex, named_terms, query_words
from kb_retrieval.retrieval.rerank import RuleReranker
from kb_retrieval.retrieval.stage import candidate_node
from tests.support.candidates import cand
from tests.support.kb import ingested, write_kb


def _index() -> ExactIdentifierIndex:
    return ExactIdentifierIndex.build(
        [
            ("w1", "watchdog.md", "Watchdog heartbeat\nThe Watchdog alert fires all the time on purpose."),
            ("w2", "watchdog.md", "If the Watchdog stops, the pipeline is broken."),
            ("c1", "conntrack.md", "conntrack entries\nThe conntrack table of the node is nearly full."),
            ("k1", "kubelet-a.md", "kubelet restarts and the kubelet log"),
            ("k2", "kubelet-b.md", "the kubelet is down; also reconciling objects"),
            ("r1", "reconcile.md", "reconcile errors\nfailed to reconcile"),
            ("u1", "used.md", "nothing here names opsgenie in a heading"),
        ]
    )


NAMES = named_terms(
    {
        "watchdog.md": ["Watchdog", "Watchdog heartbeat"],
        "conntrack.md": ["Conntrack table full", "conntrack entries"],
        "kubelet-a.md": ["Kubelet restarts"],
        "kubelet-b.md": ["Kubelet down"],
        "reconcile.md": ["Reconcile errors"],
        "used.md": ["Alert delivery"],
    }
)


@pytest.mark.unit
def test_query_words_leave_out_identifiers_instances_numbers_stopwords_and_placeholders():
    query = "Watchdog on pg-replica-2 stopped 2024 with kube_pod_info {{ $labels.node }} from opsgenie"
    assert query_words(query) == ["Watchdog", "stopped", "opsgenie"]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("query", "source"), [("the Watchdog page stopped", "watchdog.md"), ("conntrack complaining", "conntrack.md")]
)
def test_a_word_in_one_document_that_names_it_is_a_rare_term(query, source):
    hits = _index().match_rare_terms(query, NAMES)
    assert [h.sources for h in hits] == [(source,)]
    assert set(hits[0].chunk_ids) == {
        c for c, s in (("w1", "watchdog.md"), ("w2", "watchdog.md"), ("c1", "conntrack.md")) if s == source
    }


@pytest.mark.unit
def test_common_words_words_only_used_and_words_of_a_common_stem_are_not_rare_terms():
    index = _index()
    assert index.match_rare_terms("kubelet keeps restarting", NAMES) == []  # two documents hold it
    assert index.match_rare_terms("no page reaches opsgenie", NAMES) == []  # held by one, named by none
    assert index.match_rare_terms("operator cannot reconcile", NAMES) == []  # reconciling: its stem is in two
    assert [h.token for h in index.match_rare_terms("operator cannot reconcile", NAMES, max_df=2)] == ["reconcile"]
    assert index.match_rare_terms("the Watchdog page stopped", NAMES, max_df=0) == []


@pytest.mark.unit
def test_a_rare_term_makes_evidence_with_its_own_hit_reason():
    nodes = [
        candidate_node(cand("w1", "watchdog.md", 0.30), exact_terms=["Watchdog"]),
        candidate_node(cand("b", "b.md", 0.30)),
    ]
    ranked = RuleReranker().postprocess_nodes(nodes, query_str="the Watchdog page stopped")
    blocks = build_evidence_blocks(ranked, evidence_threshold=0.42, max_blocks=5)
    assert [b.source for b in blocks] == ["watchdog.md", "b.md"]  # b only follows the ranking: no evidence
    assert [is_ranking_fill(b) for b in blocks] == [False, True]
    assert "rare_term:Watchdog" in blocks[0].hit_reasons
    assert not any(r.startswith("exact_match:") for r in blocks[0].hit_reasons)


DOCS = {
    "alerting/heartbeat.md": (
        "# Dead man's switch\n\n## Watchdog\n\nThe Watchdog alert fires all the time on purpose: it proves the whole "
        "alerting pipeline works. When the Watchdog stops arriving at the receiver, check Alertmanager's routes.\n"
    ),
    "network/conntrack.md": (
        "# Connection tracking table full\n\n## conntrack entries\n\nWhen conntrack runs out of entries the kernel "
        "drops new connections. Raise nf_conntrack_max or find the client opening connections in a loop.\n"
    ),
    "kubernetes/kubelet-restarts.md": (
        "# Kubelet restarting\n\n## Diagnosis\n\nThe kubelet restarts when it runs out of memory; read the kubelet "
        "journal on the node.\n"
    ),
    "kubernetes/kubelet-down.md": (
        "# Kubelet down\n\n## Diagnosis\n\nThe kubelet process is not running on the node; restart the kubelet and "
        "check its certificates.\n"
    ),
    "storage/disk-full.md": "# Disk full\n\n## Mitigation\n\nFree space on the volume or grow it.\n",
}


@pytest.fixture(scope="module")
def small_lookup(tmp_path_factory: pytest.TempPathFactory, embed_model):
    from kb_retrieval.engine import KnowledgeLookup

    kb = tmp_path_factory.mktemp("rare-kb")
    write_kb(kb, DOCS)
    lookup = KnowledgeLookup(ingested([kb], tmp_path_factory.mktemp("rare-state"), embed_model))
    yield lookup
    lookup.close()


@pytest.mark.parametrize(
    ("query", "source", "reason"),
    [
        ("our pager has been quiet since lunch, no Watchdog page", "alerting/heartbeat.md", "rare_term:Watchdog"),
        ("the box keeps complaining about conntrack", "network/conntrack.md", "rare_term:conntrack"),
    ],
)
def test_a_term_of_one_document_makes_it_evidence(small_lookup, query, source, reason):
    result = small_lookup.lookup(query)
    assert result.found
    blocks = {b.source: b for b in result.evidence_blocks}
    assert source in blocks
    assert reason in blocks[source].hit_reasons


def test_a_term_of_many_documents_is_no_rare_term(small_lookup):
    result = small_lookup.lookup("the kubelet keeps complaining")
    assert not any(r.startswith("rare_term:") for b in result.evidence_blocks for r in b.hit_reasons)


def test_a_plain_word_one_runbook_names_leads_in_the_runbooks_corpus(runbooks_lookup):
    # "misscheduled": one runbook holds it and names it in its title; its sibling (NotScheduled) led without it.
    result = runbooks_lookup.lookup(
        "DaemonSet pods are misscheduled. 3 Pods of DaemonSet monitoring/node-exporter are running where they are not "
        "supposed to run."
    )
    assert result.found
    top = result.evidence_blocks[0]
    assert top.source == "content/runbooks/kubernetes/KubeDaemonSetMisScheduled.md"
    assert "rare_term:misscheduled" in top.hit_reasons
