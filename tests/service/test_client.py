"""``kb-retrieval lookup --server URL``: the same output as in process, through a running server, from a process
that loads no pipeline."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from kb_retrieval.bench.milvus_server import pick_free_ports
from kb_retrieval.terminal import lookup_text
from tests.conftest import REPO
from tests.service.conftest import CONNECTIONS, MYSQL_ONLY, REDIS_ALERT, categories, without_timings
from tests.support.cli_probe import lookup_in_fresh_process

pytestmark = pytest.mark.timeout(600)
KUBE = "KubePodCrashLooping: Pod payments/payments-api is in waiting state (reason: CrashLoopBackOff)."


def cli(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kb_retrieval.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def untimed(text: str) -> str:
    """The person's view without the lookup's own time (``..., 73 ms`` in its first line)."""
    return re.sub(r", [0-9.]+ ms$", "", text, count=1, flags=re.M)


def test_text_and_json_output_are_what_an_in_process_lookup_prints(served, in_process):
    text = cli("lookup", "--server", served.url, REDIS_ALERT)
    assert text.returncode == 0, text.stderr
    expected = lookup_text(in_process.lookup(REDIS_ALERT), in_process.settings.scoring)  # the person's view
    assert untimed(text.stdout) == untimed(expected + "\n")
    full = cli("lookup", "--server", served.url, "--full", REDIS_ALERT)
    whole = lookup_text(in_process.lookup(REDIS_ALERT), in_process.settings.scoring, full=True)
    assert untimed(full.stdout) == untimed(whole + "\n") and len(full.stdout) > len(text.stdout)
    as_json = cli("lookup", "--json", REDIS_ALERT, env={"KB_SERVER_URL": served.url})  # the URL from the env
    assert as_json.returncode == 0, as_json.stderr
    assert as_json.stdout.count("\n") == 1
    assert without_timings(json.loads(as_json.stdout)) == without_timings(in_process.lookup(REDIS_ALERT).to_json_dict())


def test_stdin_and_a_queries_file_go_through_the_server(served, tmp_path):
    piped = cli("lookup", "--server", served.url, "--json", "-", stdin=KUBE)
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["evidenceBlocks"][0]["source"] == "kubernetes/pod-crashloopbackoff.md"
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"case_id": "redis-1", "query": REDIS_ALERT}) + "\n\n" + json.dumps({"query": KUBE}))
    batch = cli("lookup", "--server", served.url, "--queries", str(queries))
    assert batch.returncode == 0, batch.stderr
    lines = [json.loads(line) for line in batch.stdout.splitlines()]
    assert [line["caseId"] for line in lines] == ["redis-1", f"{queries}:3"]
    assert next(iter(lines[0])) == "caseId"
    assert [line["evidenceBlocks"][0]["source"] for line in lines] == [
        "redis/memory-usage-high.md",
        "kubernetes/pod-crashloopbackoff.md",
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"query": REDIS_ALERT}) + "\n" + json.dumps({"query": "   "}) + "\n")
    refused = cli("lookup", "--server", served.url, "--queries", str(bad))
    assert refused.returncode == 2 and refused.stdout == ""  # checked before the first lookup, as in process
    assert f"{bad}:2: query is empty" in refused.stderr


def test_the_client_passes_filters(served):
    from kb_retrieval.service.client import LookupClient, ServerError

    client = LookupClient(served.url)
    assert categories(client.lookup_json(CONNECTIONS, filters=MYSQL_ONLY)) == {"mysql"}
    assert len(categories(client.lookup_json(CONNECTIONS))) > 1
    text = client.lookup_text(CONNECTIONS, filters=MYSQL_ONLY)
    assert "mysql/too-many-connections.md" in text and "redis/" not in text
    with pytest.raises(ServerError, match="answered 422: invalid filters: filter key 'team' is not a field"):
        client.lookup_json(CONNECTIONS, filters={"filters": [{"key": "team", "value": "sre"}]})


def test_the_client_loads_nothing_heavy(served):
    lookup_in_fresh_process(
        ["--server", served.url, "--json", "RedisMemoryHigh on cache-01"], env={**os.environ, "PYTHONPATH": str(REPO)}
    )


def test_server_errors_are_one_line(served):
    port = pick_free_ports(1)[0]
    nobody = cli("lookup", "--server", f"http://127.0.0.1:{port}", "RedisMemoryHigh")
    assert nobody.returncode == 2 and nobody.stdout == ""
    assert nobody.stderr.startswith(f"error: cannot reach the kb-retrieval server at http://127.0.0.1:{port}")
    assert nobody.stderr.count("\n") == 1
    too_long = cli("lookup", "--server", served.url, "x" * 4001)
    assert too_long.returncode == 2 and "answered 422: query is 4001 characters" in too_long.stderr
    scheme = cli("lookup", "--server", "127.0.0.1:8765", "RedisMemoryHigh")
    assert scheme.returncode == 2 and "server URL must be http://host:port" in scheme.stderr
