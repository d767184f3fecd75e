"""From an Alertmanager webhook alert to the query a lookup searches.

The query reads like an alert an engineer pastes: ``<alertname>: <summary> <description> (label: value, ...)``.
Labels are kept when they name *what* is wrong (a job, a service, a device, a queue) and dropped when they only say
*where* or *who* (``instance``, ``pod``, ``node``, replica, cluster, team, severity): host names, pod hashes and
addresses match nothing in a runbook and only add noise to BM25 and the embedding. A value that looks like an
address or an id (``10.0.0.5:9100``, a UUID, a long hex hash) is dropped whatever its label. The alert's
summary and description usually name the instance anyway, so nothing an engineer would search for is lost.

Example:
    >>> alert_query({"alertname": "RedisMemoryHigh", "instance": "10.0.0.5:9121", "job": "redis"},
    ...             {"summary": "Redis memory above 90%"})
    'RedisMemoryHigh: Redis memory above 90% (job: redis)'
"""

from __future__ import annotations

import re

#: Labels that say where or for whom an alert fired, not what: left out of the query.
NOISE_LABELS = frozenset(
    {
        "alertname",  # the query's head already
        "instance",
        "pod",
        "pod_name",
        "node",
        "hostname",
        "host",
        "ip",
        "endpoint",
        "uid",
        "id",
        "container_id",
        "image_id",
        "pod_template_hash",
        "controller_revision_hash",
        "prometheus",
        "prometheus_replica",
        "replica",
        "receiver",
        "monitor",
        "cluster",
        "region",
        "zone",
        "datacenter",
        "env",
        "environment",
        "team",
        "owner",
        "severity",
        "priority",
        "tier",
        "runbook_url",
    }
)
#: Annotations whose text describes the problem, in the order they are read (``message``: kube-prometheus rules).
TEXT_ANNOTATIONS = ("summary", "description", "message")
_ID_LIKE = re.compile(
    r"^(?:"
    r"\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?"  # IPv4, with a port
    r"|\[?[0-9a-f:]+:[0-9a-f:]*\]?(?::\d+)?"  # IPv6
    r"|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"  # UUID
    r"|[0-9a-f]{12,}"  # a hash or container id
    r"|[\w.-]+:\d{2,5}"  # host:port
    r")$",
    re.IGNORECASE,
)


def is_noise_label(name: str, value: str) -> bool:
    """True for a label that says where or who, or whose value is an address or an id."""
    return name in NOISE_LABELS or name.startswith("__") or not value.strip() or bool(_ID_LIKE.match(value.strip()))


def alert_query(labels: dict[str, str], annotations: dict[str, str]) -> str:
    """The query for one alert (``""`` when it has no name, text or label worth searching)."""
    name = labels.get("alertname", "").strip()
    texts = []
    for key in TEXT_ANNOTATIONS:
        text = " ".join(annotations.get(key, "").split())
        if text and text not in texts:
            texts.append(text)
    kept = [f"{key}: {value.strip()}" for key, value in sorted(labels.items()) if not is_noise_label(key, value)]
    body = " ".join(texts)
    query = f"{name}: {body}" if name and body else name or body
    if kept:
        query = f"{query} ({', '.join(kept)})" if query else ", ".join(kept)
    return query
