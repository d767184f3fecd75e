"""Pure logic of the service: the query built from an alert, which addresses count as loopback, the override model,
the HTTP parser and event loop uvicorn runs with."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kb_retrieval.service.alertmanager import alert_query, is_noise_label
from kb_retrieval.service.settings import ServeSettings, is_loopback

pytestmark = pytest.mark.unit


def test_an_alert_query_keeps_what_is_wrong_and_drops_where_it_fired():
    query = alert_query(
        {
            "alertname": "NodeFilesystemAlmostFull",
            "instance": "node-exporter-7:9100",
            "device": "/dev/sda1",
            "mountpoint": "/var",
            "severity": "critical",
            "pod": "node-exporter-x2k8q",
            "container_id": "3f4e5d6c7b8a9f0e1d2c3b4a",
        },
        {"summary": "Filesystem /var is 95% full", "description": "Filesystem /var is 95% full", "message": ""},
    )
    assert query == "NodeFilesystemAlmostFull: Filesystem /var is 95% full (device: /dev/sda1, mountpoint: /var)"


@pytest.mark.parametrize(
    ("labels", "annotations", "expected"),
    [
        ({}, {}, ""),
        ({"alertname": "Watchdog"}, {}, "Watchdog"),
        ({}, {"description": "disk   full\non   /var"}, "disk full on /var"),
        ({"job": "mysqld"}, {}, "job: mysqld"),
        ({"alertname": "X", "__name__": "up", "uid": "1f0e"}, {"message": "m"}, "X: m"),
    ],
)
def test_alert_query_edge_cases(labels, annotations, expected):
    assert alert_query(labels, annotations) == expected


@pytest.mark.parametrize(
    ("name", "value", "noise"),
    [
        ("job", "redis", False),
        ("service", "10.0.0.5:6379", True),
        ("target", "db-01.prod:9104", True),
        ("trace", "123e4567-e89b-12d3-a456-426614174000", True),
        ("queue", "orders", False),
        ("namespace", "", True),
        ("cluster", "eu-1", True),
    ],
)
def test_noise_labels(name, value, noise):
    assert is_noise_label(name, value) is noise


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.10", False),
        ("example.org", False),
    ],
)
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback


def test_overrides_are_the_settings_own_types_and_limits():
    from kb_retrieval.service.models import LookupRequest

    request = LookupRequest(query="q", settings={"top_k": 5, "document_ranking": False})
    assert request.overrides() == {"top_k": 5, "document_ranking": False}
    assert LookupRequest(query="q").overrides() == {}
    assert LookupRequest(query="q", settings={"content_interleave": False}).overrides() == {"content_interleave": False}
    for bad in (
        {"top_k": 201},
        {"evidence_threshold": 1.5},
        {"state_dir": "/tmp"},
        {"max_evidence_blocks": 0},
        {"content_interleave": "sometimes"},
    ):
        with pytest.raises(ValidationError):
            LookupRequest(query="q", settings=bad)
    with pytest.raises(ValidationError, match="query is empty"):
        LookupRequest(query=" \x00 ")


def test_a_request_scope_is_a_llamaindex_metadatafilters_the_scope_translates():
    from llama_index.core.vector_stores import MetadataFilters

    from kb_retrieval.retrieval.scope import scope_expr
    from kb_retrieval.service.models import LookupRequest

    filters = LookupRequest(
        query="q",
        filters={
            "condition": "or",
            "filters": [
                {"key": "category", "value": "mysql"},
                {"filters": [{"key": "priority", "value": 2, "operator": ">="}], "condition": "not"},
            ],
        },
    ).filters
    assert isinstance(filters, MetadataFilters) and isinstance(filters.filters[1], MetadataFilters)
    expr = scope_expr(filters, scalar={"category": "category"}, json_field="metadata", json_keys={"priority"})
    assert expr == 'category == "mysql" or (not (metadata["priority"] >= 2))'
    for bad in (
        {"filters": [{"key": "category", "value": "x", "operator": "text_match"}]},  # LlamaIndex's, not a scope's
        {"filters": [{"key": "category", "value": "x", "extra": 1}]},
        {"filters": [{"key": "category", "value": ["x", 1]}]},
        {"filters": [{"key": "category", "value": True}]},
    ):
        with pytest.raises(ValidationError):
            LookupRequest(query="q", filters=bad)


def test_settling_the_heap_freezes_what_start_up_built_and_still_collects_later_garbage():
    import gc
    import weakref

    from kb_retrieval.service.serving import settle_heap

    class Cycle:
        pass

    try:
        settle_heap()
        assert gc.get_freeze_count() > 0
        later = Cycle()
        later.me = later  # garbage made after start-up, reachable only through its own cycle
        gone = weakref.ref(later)
        del later
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()


@pytest.mark.parametrize(
    ("installed", "expected"),
    [({"httptools", "uvloop"}, "httptools on uvloop"), (set(), "h11 on asyncio"), ({"uvloop"}, "h11 on uvloop")],
)
def test_the_http_stack_auto_is_what_uvicorn_picks_from_what_is_installed(monkeypatch, installed, expected):
    from kb_retrieval.service import serving

    monkeypatch.setattr(serving, "_importable", lambda name: name in installed)
    monkeypatch.setattr(serving.sys, "platform", "linux")
    assert serving.http_stack(ServeSettings()) == expected


def test_the_server_runs_the_chosen_parser_and_loop():
    from kb_retrieval.service.serving import make_server

    config = make_server(object(), ServeSettings(http="h11", loop="asyncio")).config
    assert (config.http, config.loop) == ("h11", "asyncio")
    with pytest.raises(ValidationError):
        ServeSettings(http="zttp")
