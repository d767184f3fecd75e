"""kubectl's short resource names read as the kinds they name (``sts/kafka`` is a StatefulSet). The rule is pinned
on strings, then through whole lookups on the public runbooks corpus (real Milvus Lite, the real model), in an
on-call engineer's own words (written for these tests, not taken from the public query sets)."""

from __future__ import annotations

import pytest

from kb_retrieval.retrieval.query_transform import transform_query
from kb_retrieval.retrieval.short_names import expand_short_names


@pytest.mark.unit
@pytest.mark.parametrize(
    ("query", "expected", "readings"),
    [
        # kubectl's <short>/<name> notation: every short name, the kind written before it, the short name kept
        ("sts/kafka lagging", "StatefulSet sts/kafka lagging", ["sts -> StatefulSet"]),
        ("po/web-1 restarting", "Pod po/web-1 restarting", ["po -> Pod"]),
        ("ns/monitoring is terminating", "namespace ns/monitoring is terminating", ["ns -> namespace"]),
        # alone: the short names that are no word and no unit, and ns unless a number comes before it
        (
            "kubectl get pvc shows Pending",
            "kubectl get PersistentVolumeClaim pvc shows Pending",
            ["pvc -> PersistentVolumeClaim"],
        ),
        ("ns analytics over quota", "namespace ns analytics over quota", ["ns -> namespace"]),
        ("the ds and the sts", "the DaemonSet ds and the StatefulSet sts", ["ds -> DaemonSet", "sts -> StatefulSet"]),
        ("sts web, sts db", "StatefulSet sts web, StatefulSet sts db", ["sts -> StatefulSet"]),  # one reading each
    ],
)
def test_a_short_name_that_is_one_gets_its_kind(query: str, expected: str, readings: list[str]) -> None:
    assert expand_short_names(query) == (expected, readings)


@pytest.mark.unit
@pytest.mark.parametrize(
    "query",
    [
        "p99 went from 800 ns to 2 ms",  # nanoseconds
        "a 500ns pause",
        "no leader elected",  # words first: no, limits, quota, po alone
        "no/low traffic since 09:00",
        "memory limits reached, quota exhausted",
        "StatefulSet test/sts has not matched",  # a name after a slash, not a kind
        "dns lookups slow on pods",  # inside longer tokens
        "sts-0 and pvc_data and data.ns",
        "PVC stuck Pending",  # kubectl's names are lower case; PVC is the knowledge base's word already
    ],
)
def test_a_short_name_that_can_be_something_else_is_left_as_written(query: str) -> None:
    assert expand_short_names(query) == (query, [])


@pytest.mark.unit
def test_the_transform_notes_the_readings_and_keeps_the_original_query() -> None:
    transform = transform_query("sts/kafka in ns streaming", None, 2000)
    assert transform.original_query == "sts/kafka in ns streaming"
    assert transform.normalized_query == "StatefulSet sts/kafka in namespace ns streaming"
    assert transform.notes == ["kubectl short names read as kinds: sts -> StatefulSet, ns -> namespace"]
    off = transform_query("sts/kafka in ns streaming", None, 2000, read_short_names=False)
    assert off.normalized_query == "sts/kafka in ns streaming"
    assert off.notes == []


GENERATION = "sts/zookeeper in ns coordination: observedGeneration 7 while metadata.generation is 9 since the rollback"


def test_a_statefulset_named_the_kubectl_way_finds_its_runbook(runbooks_lookup) -> None:
    """Read as written, ``sts`` is three letters: the Deployment's generation runbook came first and the lookup
    found no evidence; read as a StatefulSet, the StatefulSet's runbook leads, with evidence."""
    result, ranking = runbooks_lookup.lookup_ranked(GENERATION)
    assert result.found
    assert ranking[0].source == "content/runbooks/kubernetes/KubeStatefulSetGenerationMismatch.md"
    assert result.evidence_blocks[0].source == ranking[0].source
    assert "kubectl short names read as kinds: sts -> StatefulSet, ns -> namespace" in result.query_transform.notes
    as_written, ranking = runbooks_lookup.with_settings(read_short_names=False).lookup_ranked(GENERATION)
    assert as_written.query_transform.normalized_query == GENERATION
    assert not as_written.found
    assert ranking[0].source != "content/runbooks/kubernetes/KubeStatefulSetGenerationMismatch.md"


def test_a_short_name_the_knowledge_base_uses_itself_keeps_its_match(runbooks_lookup) -> None:
    """The runbooks name the HorizontalPodAutoscaler ``Hpa`` (KubeHpaMaxedOut): the short name stays beside the kind,
    so its title match holds (read as the kind alone, this lookup found no evidence)."""
    result, ranking = runbooks_lookup.lookup_ranked("hpa/checkout stuck at maxReplicas for an hour in ns shop")
    assert result.found
    assert ranking[0].source == "content/runbooks/kubernetes/KubeHpaMaxedOut.md"
    assert any(reason.startswith("l0_title_terms:") for reason in result.evidence_blocks[0].hit_reasons)
