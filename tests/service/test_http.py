"""The HTTP API of a running ``kb-retrieval serve`` (a real subprocess over Milvus Lite): every endpoint, the 4xx
cases, and that an answer is what the same lookup gives in process."""

from __future__ import annotations

import json

import httpx
import pytest

from kb_retrieval.cli import main
from kb_retrieval.output import result_json
from tests.service.conftest import CONNECTIONS, HOSTILE_SOURCE, MYSQL_ONLY, REDIS_ALERT, categories, without_timings

pytestmark = pytest.mark.timeout(900)


def post(served, path: str, payload: object, **kwargs) -> httpx.Response:
    return httpx.post(served.url + path, json=payload, timeout=120, **kwargs)


def assert_error(response: httpx.Response, status: int, *fragments: str) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]
    assert "\n" not in message and "Traceback" not in response.text
    for fragment in fragments:
        assert fragment in message
    return message


def test_healthz_reports_the_collection_its_chunks_and_lexical_mode(served, in_process):
    from kb_retrieval.indexing.milvus import count_rows

    response = httpx.get(served.url + "/healthz", timeout=30)
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["collection"] == "kb_chunks" and body["milvus"] == "lite"
    assert body["chunks"] == count_rows(in_process.client, in_process.settings) > 0
    assert body["lexical_mode"] == in_process.lexical_mode


def test_lookup_answers_exactly_what_lookup_json_prints(served, in_process):
    response = post(served, "/v1/lookup", {"query": REDIS_ALERT})
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert response.text == result_json(body)  # the CLI's own serialisation, byte for byte
    assert body["evidenceBlocks"][0]["source"] == "redis/memory-usage-high.md"
    here = in_process.lookup(REDIS_ALERT).to_json_dict()
    assert without_timings(body) == without_timings(here)
    assert list(body) == list(here)  # the same fields in the same order


def test_accept_text_plain_gives_the_agent_text(served, in_process):
    from kb_retrieval.result import agent_text

    response = post(served, "/v1/lookup", {"query": REDIS_ALERT}, headers={"accept": "text/plain"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert response.text == agent_text(in_process.lookup(REDIS_ALERT))
    assert "[1] source: redis/memory-usage-high.md" in response.text


def test_setting_overrides_apply_to_that_lookup_only(served):
    one = post(served, "/v1/lookup", {"query": REDIS_ALERT, "settings": {"max_evidence_blocks": 1}}).json()
    assert len(one["evidenceBlocks"]) == 1
    plain = post(served, "/v1/lookup", {"query": REDIS_ALERT, "settings": {"document_ranking": False}}).json()
    assert all(entry["ranking"] == {} for entry in plain["rerankTrace"]["entries"])
    again = post(served, "/v1/lookup", {"query": REDIS_ALERT}).json()
    assert len(again["evidenceBlocks"]) > 1 and any(e["ranking"] for e in again["rerankTrace"]["entries"])


def test_content_interleave_is_a_request_setting(served, in_process):
    """A retrieval test compares the document ranking's own order with the content interleave (on by default)."""
    default = post(served, "/v1/lookup", {"query": REDIS_ALERT}).json()
    response = post(served, "/v1/lookup", {"query": REDIS_ALERT, "settings": {"content_interleave": False}})
    assert response.status_code == 200, response.text
    plain = response.json()
    here = in_process.with_settings(content_interleave=False).lookup(REDIS_ALERT).to_json_dict()
    assert without_timings(plain) == without_timings(here)
    # On this knowledge base the interleave moves a document of this query: the setting reached the lookup.
    assert [b["source"] for b in plain["evidenceBlocks"]] != [b["source"] for b in default["evidenceBlocks"]]


def test_filters_scope_the_lookup_as_in_process(served, in_process):
    from llama_index.core.vector_stores import MetadataFilters

    unscoped = post(served, "/v1/lookup", {"query": CONNECTIONS}).json()
    assert len(categories(unscoped)) > 1, categories(unscoped)
    response = post(served, "/v1/lookup", {"query": CONNECTIONS, "filters": MYSQL_ONLY})
    assert response.status_code == 200, response.text
    scoped = response.json()
    assert categories(scoped) == {"mysql"}
    assert scoped["evidenceBlocks"][0]["source"] == "mysql/too-many-connections.md"
    here = in_process.lookup(CONNECTIONS, filters=MetadataFilters.model_validate(MYSQL_ONLY)).to_json_dict()
    assert without_timings(scoped) == without_timings(here)
    # Nested, with the default operator (==), in, != and contains on a frontmatter list: redis or mysql documents,
    # less the one Redis runbook the query finds first, or any document whose entities name kubectl.
    redis_first = next(b["source"] for b in unscoped["evidenceBlocks"] if b["category"] == "redis")
    nested = {
        "condition": "or",
        "filters": [
            {
                "filters": [
                    {"key": "category", "value": ["mysql", "redis"], "operator": "in"},
                    {"key": "source", "value": redis_first, "operator": "!="},
                ]
            },
            {"key": "entities", "value": "kubectl", "operator": "contains"},
        ],
    }
    response = post(served, "/v1/lookup", {"query": CONNECTIONS, "filters": nested})
    assert response.status_code == 200, response.text
    sources = [block["source"] for block in response.json()["evidenceBlocks"]]
    assert sources and redis_first not in sources
    here = in_process.lookup(CONNECTIONS, filters=MetadataFilters.model_validate(nested)).to_json_dict()
    assert without_timings(response.json()) == without_timings(here)


def test_bad_filters_are_422_naming_what_is_wrong(served):
    def refused(filters: object, *fragments: str) -> str:
        return assert_error(post(served, "/v1/lookup", {"query": CONNECTIONS, "filters": filters}), 422, *fragments)

    one = {"key": "category", "value": "mysql"}
    supported = "(supported: ==, !=, >, >=, <, <=, in, nin, contains)"
    refused(
        {"filters": [{**one, "operator": "like"}]}, "filters.filters.0.operator: 'like' is not supported", supported
    )
    refused(
        {"filters": [one, {"filters": [{**one, "operator": "text_match"}]}]}, "filters.filters.1.filters.0.operator"
    )
    refused(
        {"filters": [{"key": "team", "value": "sre"}]},
        "invalid filters: filter key 'team' is not a field of the collection (known: ",
        "category",
    )
    refused({"filters": [{**one, "operator": ">"}]}, "filter 'category' >: needs a number, got 'mysql'")
    refused({"filters": [{**one, "operatr": "=="}]}, "filters.filters.0.operatr: unknown field")
    refused({"filters": [{"key": "category"}]}, "filters.filters.0.value: Field required")
    refused({"filters": [{"key": "category", "value": {"$ne": 1}}]}, "filters.filters.0.value: must be a string")
    refused({"filters": [one], "condition": "xor"}, "filters.condition")
    refused({"filters": "category=mysql"}, "filters.filters")
    refused("category == mysql", "filters")


def test_bad_requests_are_4xx_with_a_one_line_message(served):
    assert_error(post(served, "/v1/lookup", {"query": ""}), 422, "query", "empty")
    assert_error(post(served, "/v1/lookup", {"query": " \n\t\x00 "}), 422, "empty")
    assert_error(post(served, "/v1/lookup", {"query": "x" * 4001}), 422, "4001 characters", "at most 4000")
    assert_error(post(served, "/v1/lookup", {}), 422, "query: Field required")
    assert_error(post(served, "/v1/lookup", {"query": 7}), 422, "query")
    assert_error(post(served, "/v1/lookup", ["RedisMemoryHigh"]), 422)
    assert_error(post(served, "/v1/lookup", {"query": "q", "extra": 1}), 422, "extra: unknown field")
    assert_error(
        post(served, "/v1/lookup", {"query": "q", "settings": {"milvus_uri": "http://elsewhere"}}),
        422,
        "settings.milvus_uri: cannot be changed per request: the pipeline holds one Milvus client",
        "max_evidence_blocks",
    )
    # Each refused setting says why (overrides.py), never pydantic's "Extra inputs are not permitted".
    for name, why in (
        ("alpha", "settings.alpha: not supported: the dense/BM25 balance is lexical_weight"),
        ("lookup_timeout_s", "settings.lookup_timeout_s: a setting of the server, not of one request: set KB_LOOKUP"),
        ("embed_model", "settings.embed_model: cannot be changed per request: the query model is loaded once"),
        ("topk", "settings.topk: no such setting (the settings a request may change: top_k"),
    ):
        response = post(served, "/v1/lookup", {"query": "q", "settings": {name: 1}})
        assert_error(response, 422, why)
        assert "Extra inputs" not in response.text
    assert_error(post(served, "/v1/lookup", {"query": "q", "settings": {"top_k": 0}}), 422, "settings.top_k")
    assert_error(post(served, "/v1/lookup", {"query": "q", "settings": {"top_k": "many"}}), 422, "settings.top_k")
    bad_json = httpx.post(
        served.url + "/v1/lookup", content=b"{not json", headers={"content-type": "application/json"}, timeout=30
    )
    assert_error(bad_json, 422, "JSON")
    too_big = httpx.post(
        served.url + "/v1/lookup",
        content=json.dumps({"query": "x" * 1_100_000}).encode(),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert_error(too_big, 413, "KB_SERVER_MAX_BODY_BYTES")
    assert_error(httpx.get(served.url + "/v1/traces?limit=0", timeout=30), 422, "limit")
    assert_error(httpx.get(served.url + "/v1/traces?limit=501", timeout=30), 422, "limit")
    assert_error(post(served, "/v1/alertmanager", {"alerts": "none"}), 422, "alerts")
    wrong_method = httpx.get(served.url + "/v1/lookup", timeout=30)
    assert wrong_method.status_code == 405 and "Traceback" not in wrong_method.text


ALERTMANAGER_PAYLOAD = {
    "version": "4",
    "groupKey": '{}:{alertname="RedisMemoryHigh"}',
    "truncatedAlerts": 0,
    "status": "firing",
    "receiver": "kb-retrieval",
    "groupLabels": {},
    "commonLabels": {},
    "commonAnnotations": {},
    "externalURL": "http://alertmanager:9093",
    "alerts": [
        {
            "status": "firing",
            "labels": {
                "alertname": "RedisMemoryHigh",
                "instance": "10.2.3.4:9121",
                "job": "redis-exporter",
                "severity": "warning",
            },
            "annotations": {
                "summary": "Redis memory usage above 90% of maxmemory",
                "description": "redis-cache-01 uses 93.4% of maxmemory",
            },
            "startsAt": "2026-12-01T10:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph",
            "fingerprint": "a1b2c3d4e5f60718",
        },
        {
            "status": "resolved",
            "labels": {"alertname": "MySQLReplicationLag", "instance": "db-replica-02:9104"},
            "annotations": {"summary": "replica behind its source"},
            "fingerprint": "0f0f0f0f0f0f0f0f",
        },
        {
            "status": "firing",
            "labels": {
                "alertname": "KubePodCrashLooping",
                "namespace": "payments",
                "pod": "payments-api-7d9f8b6c4-x2k8q",
                "container": "api",
            },
            "annotations": {
                "description": 'Pod payments/payments-api is in waiting state (reason: "CrashLoopBackOff").'
            },
            "fingerprint": "1122334455667788",
        },
    ],
}


def test_alertmanager_webhook_answers_each_alert_in_payload_order(served):
    response = post(served, "/v1/alertmanager", ALERTMANAGER_PAYLOAD)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["receiver"], body["alerts"], body["looked_up"], body["skipped"]) == ("kb-retrieval", 3, 2, 1)
    redis, mysql, kube = body["results"]
    assert [r["fingerprint"] for r in body["results"]] == ["a1b2c3d4e5f60718", "0f0f0f0f0f0f0f0f", "1122334455667788"]
    assert redis["alertname"] == "RedisMemoryHigh" and redis["status"] == "firing"
    assert redis["query"].startswith("RedisMemoryHigh: Redis memory usage above 90% of maxmemory")
    assert "job: redis-exporter" in redis["query"]
    assert "10.2.3.4" not in redis["query"] and "warning" not in redis["query"]  # where/severity: noise
    assert redis["result"]["evidenceBlocks"][0]["source"] == "redis/memory-usage-high.md"
    assert mysql["status"] == "resolved" and mysql["result"] is None and "resolved" in mysql["skipped"]
    assert "x2k8q" not in kube["query"] and "namespace: payments" in kube["query"]
    assert kube["result"]["evidenceBlocks"][0]["source"] == "kubernetes/pod-crashloopbackoff.md"


def test_traces_endpoint_and_command_read_the_latest_rows(served, capsys):
    marker = "ConsoleMarkupInjection: alert console shows markup (trace check)"
    assert post(served, "/v1/lookup", {"query": marker}).status_code == 200
    rows = httpx.get(served.url + "/v1/traces?limit=3", timeout=30).json()["rows"]
    assert len(rows) == 3 and rows[0]["query"] == marker  # newest first, the row of the lookup just answered
    assert [r["id"] for r in rows] == sorted((r["id"] for r in rows), reverse=True)
    assert rows[0]["retrieval_details"]["evidence_blocks"][0]["source"] == HOSTILE_SOURCE
    short = httpx.get(served.url + "/v1/traces?limit=1&details=false", timeout=30).json()["rows"][0]
    assert "retrieval_details" not in short and short["id"] == rows[0]["id"]
    # The command reads the same table (SQLite in the state dir) while the server runs.
    assert main(["traces", "--state-dir", str(served.state_dir), "--limit", "2", "--json"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in printed] == [r["id"] for r in rows[:2]] and printed[0]["query"] == marker
    assert main(["traces", "--state-dir", str(served.state_dir), "--limit", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"#{rows[0]['id']} ") and f"query: {marker}" in text and HOSTILE_SOURCE in text


def test_access_log_is_one_json_line_per_request_without_query_strings(served):
    httpx.get(served.url + "/healthz?probe=secret-value", timeout=30)
    lines = [json.loads(line) for line in served.log().splitlines() if line.startswith("{")]
    assert any(entry["path"] == "/v1/lookup" and entry["status"] == 200 for entry in lines)
    health = [entry for entry in lines if entry["path"] == "/healthz"]
    assert health and "secret-value" not in served.log()
    assert {"method", "path", "status", "ms", "client"} <= set(health[-1])


@pytest.mark.unit
def test_serve_refuses_a_public_address_without_a_token(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KB_SERVER_TOKEN", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a bearer token" in err and "KB_SERVER_TOKEN" in err
    assert not (tmp_path / "milvus.db").exists()  # refused before anything was opened
