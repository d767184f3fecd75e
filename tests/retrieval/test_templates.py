"""Alert-template placeholders: the query encoder reads an alert text without them (``drop_template_placeholders``);
BM25, L0 and the trace keep the query as it was. The rule is pinned on strings, then through whole lookups on the
sample KB and the public runbooks corpus (real Milvus Lite, the real model)."""

from __future__ import annotations

import pytest

import kb_retrieval.engine as engine_module
from kb_retrieval.engine import KnowledgeLookup
from kb_retrieval.retrieval.exact import query_identifiers
from kb_retrieval.retrieval.templates import without_placeholders


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Alertmanager {{ $labels.namespace }}/{{ $labels.pod}} failed to send {{ $value | humanizePercentage }}.",
            ("Alertmanager / failed to send.", 3),
        ),
        (
            'has failed to evaluate {{ printf "%.0f" $value }} rules in the last 5m.',
            ("has failed to evaluate rules in the last 5m.", 1),
        ),
        ("disk at $value percent on {{$labels.instance}}", ("disk at percent on", 2)),
        ("RedisMemoryHigh on cache-01: used_memory 95%", ("RedisMemoryHigh on cache-01: used_memory 95%", 0)),
    ],
)
def test_placeholders_are_dropped_and_counted(text, expected):
    assert without_placeholders(text) == expected


@pytest.mark.unit
def test_a_query_of_placeholders_only_is_kept_whole():
    assert without_placeholders("{{ $labels.alertname }}") == ("{{ $labels.alertname }}", 1)


@pytest.mark.unit
def test_no_identifier_comes_from_a_placeholder():
    assert query_identifiers("kube_pod_status_ready is {{ $labels.some_label }} and $labels.other_label") == [
        "kube_pod_status_ready"
    ]


def _encoder_texts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts the lookup's query encoder is given, recorded around the real call."""
    seen: list[str] = []
    real = engine_module.embed_query

    def recording(model, text):
        seen.append(text)
        return real(model, text)

    monkeypatch.setattr(engine_module, "embed_query", recording)
    return seen


ALERT = "Redis memory is high. Redis {{ $labels.instance }} uses {{ $value | humanizePercentage }} of maxmemory."


def test_the_encoder_reads_the_alert_without_placeholders_and_the_trace_says_so(sample_lookup, monkeypatch):
    seen = _encoder_texts(monkeypatch)
    result = sample_lookup.lookup(ALERT)
    assert seen == ["Redis memory is high. Redis uses of maxmemory."]
    assert result.query_transform.normalized_query == ALERT  # BM25 and L0 read it as it was
    assert "query encoder: read without its 2 alert-template placeholders" in result.query_transform.notes
    assert result.found and result.evidence_blocks[0].source.startswith("redis/")


def test_the_setting_off_gives_the_encoder_the_whole_query(sample_settings, monkeypatch):
    lookup = KnowledgeLookup(sample_settings.model_copy(update={"drop_template_placeholders": False}))
    try:
        seen = _encoder_texts(monkeypatch)
        result = lookup.lookup(ALERT)
    finally:
        lookup.close()
    assert seen == [ALERT]
    assert not any(note.startswith("query encoder") for note in result.query_transform.notes)


def test_an_alert_text_whose_placeholders_hid_its_runbook_finds_it(runbooks_lookup):
    """The public alert text of PrometheusOperatorSyncFailed: with its three placeholders the encoder put it under
    the evidence threshold (found=false, its runbook second); without them its runbook leads."""
    result = runbooks_lookup.lookup(
        "Last controller reconciliation failed Controller {{ $labels.controller }} in {{ $labels.namespace }} "
        "namespace fails to reconcile {{ $value }} objects."
    )
    assert result.found
    assert result.evidence_blocks[0].source.endswith("PrometheusOperatorSyncFailed.md")
