"""kubectl's short resource names in a query, read as the kinds they name.

An on-call engineer writes what kubectl prints and accepts: ``sts/kafka``, ``deploy/checkout-api``,
``ds/node-exporter``, ``pvc data-kafka-0``, ``ns analytics``. The knowledge base names the kinds
(``StatefulSet``, ``Deployment``, ``namespace``); to the query encoder, BM25 and L0 ``sts`` is three unknown
letters. The short names are Kubernetes' own (``kubectl api-resources``, column SHORTNAMES), a closed list, so this
is a reading of the query, not a word list fitted to queries: where a short name is one, its kind is written before
it. The short name stays, since a knowledge base may use it too (``KubeHpaMaxedOut``, ``kubectl get pvc``): read
without it, "hpa/checkout at maxReplicas" lost its title match and was told no evidence.

A short name is read as a kind only where it can be nothing else:

- in kubectl's ``<short>/<name>`` notation (``sts/kafka``, ``ns/monitoring``), for every short name;
- standing alone, for the short names that are no word and no unit (``sts``, ``pvc``, ``hpa``), and ``ns``
  unless a number comes before it (``500 ns`` is nanoseconds).

Never inside a longer token (``pods``, ``dns``, ``statefulset``), and never ``no`` (``no/low traffic``), ``limits``
or ``quota``, which are words first: they are left out of the list. The trace notes each reading.

Example:
    >>> expand_short_names("sts/kafka in ns streaming")
    ('StatefulSet sts/kafka in namespace ns streaming', ['sts -> StatefulSet', 'ns -> namespace'])
    >>> expand_short_names("p99 went from 800 ns to 2 ms")
    ('p99 went from 800 ns to 2 ms', [])
"""

from __future__ import annotations

import re

#: kubectl's short names (``kubectl api-resources``; not no, limits, quota: words first) -> the kind as the
#: knowledge base writes it.
SHORT_NAMES: dict[str, str] = {
    "cm": "ConfigMap",
    "cj": "CronJob",
    "crd": "CustomResourceDefinition",
    "crds": "CustomResourceDefinition",
    "csr": "CertificateSigningRequest",
    "deploy": "Deployment",
    "ds": "DaemonSet",
    "ep": "Endpoints",
    "hpa": "HorizontalPodAutoscaler",
    "ing": "Ingress",
    "netpol": "NetworkPolicy",
    "ns": "namespace",
    "pdb": "PodDisruptionBudget",
    "po": "Pod",
    "pv": "PersistentVolume",
    "pvc": "PersistentVolumeClaim",
    "rs": "ReplicaSet",
    "sa": "ServiceAccount",
    "sc": "StorageClass",
    "sts": "StatefulSet",
    "svc": "Service",
}

#: The short names read as kinds standing alone too: no English word, no unit, no common acronym of another sense.
_ALONE = frozenset({"cj", "crd", "crds", "csr", "ds", "hpa", "netpol", "pdb", "pv", "pvc", "sts", "svc"})

# A short name as a whole token (not inside a longer word, a path or a host name), with what follows it.
_SHORT = re.compile(r"(?<![\w./-])(" + "|".join(sorted(SHORT_NAMES, key=len, reverse=True)) + r")(?![\w.-])(/\w)?")
_NUMBER_BEFORE = re.compile(r"\d\s*$")


def expand_short_names(query: str) -> tuple[str, list[str]]:
    """``query`` with its kind before each short name that is one, and the readings (``sts -> StatefulSet``),
    each once, in query order."""
    readings: dict[str, None] = {}

    def kind(match: re.Match[str]) -> str:
        short, slash = match.group(1), match.group(2)
        alone = short in _ALONE or (short == "ns" and not _NUMBER_BEFORE.search(query[: match.start()]))
        if not slash and not alone:
            return match.group(0)
        readings.setdefault(f"{short} -> {SHORT_NAMES[short]}", None)
        return f"{SHORT_NAMES[short]} {short}{slash or ''}"

    expanded = _SHORT.sub(kind, query)
    return expanded, list(readings)
