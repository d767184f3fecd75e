"""Real traffic instead of golden cases: the queries of the trace store replayed through the current settings and an
alternative (setting overrides, or another state dir), and what changed per query; or the same queries as draft
golden cases for a person to confirm. No labels needed.

A trace row keeps the query in full, hashed or redacted (``KB_TRACE_QUERY``): a hashed or redacted query cannot be
replayed and is skipped, counted. A query asked several times is replayed once. The replayed lookups write no trace
rows (their own store is in memory), so a comparison never feeds the traffic it reads. The same trace rows give the
same report, byte for byte.

Example:
    >>> at = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
    >>> queries = traffic_queries([("RedisMemoryHigh", at), ("sha256:" + "0" * 64, at), ("RedisMemoryHigh", at)])
    >>> queries.queries, queries.private, queries.repeats
    (['RedisMemoryHigh'], 1, 1)
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kb_retrieval.reporting import BarChart, ChartFiles, inline, json_text, markdown_table

if TYPE_CHECKING:
    from kb_retrieval.models import LookupResult

#: How a trace row keeps a query it does not keep in full (``TraceStore.stored_query``: ``hash`` and ``redact``).
_PRIVATE = re.compile(r"sha256:[0-9a-f]{64}|\[redacted: \d+ characters\]")
#: What a comparison looks at per query, in the report's order.
ASPECTS = ("found", "first document", "evidence set")


def is_private(query: str) -> bool:
    """Whether a trace row's query is a hash or a redaction, not a query that can be replayed.

    Example:
        >>> is_private("[redacted: 41 characters]"), is_private("disk full on node-3")
        (True, False)
    """
    return _PRIVATE.fullmatch(query) is not None


@dataclass
class TrafficQueries:
    """The distinct replayable queries of some trace rows, oldest first, and what was left out."""

    queries: list[str] = field(default_factory=list)
    rows: int = 0
    """Trace rows read (after ``since``)."""
    private: int = 0
    """Rows whose query was hashed or redacted (``KB_TRACE_QUERY``): skipped."""
    repeats: int = 0
    """Rows whose query an earlier row already asked."""
    beyond_limit: int = 0
    """Distinct queries left out by ``limit`` (the oldest)."""


def traffic_queries(
    rows: Iterable[tuple[str, dt.datetime]], since: dt.datetime | None = None, limit: int | None = None
) -> TrafficQueries:
    """The queries of ``rows`` (``(query, created_at)`` in the order written) to replay: each distinct query once, at
    its first appearance; with ``limit``, the most recent ``limit`` of them (still oldest first)."""
    out = TrafficQueries()
    seen: dict[str, None] = {}
    for query, created_at in rows:
        if since is not None and _aware(created_at) < since:
            continue
        out.rows += 1
        if is_private(query):
            out.private += 1
        elif query in seen:
            out.repeats += 1
        else:
            seen[query] = None
    queries = list(seen)
    if limit is not None and len(queries) > limit:
        out.beyond_limit = len(queries) - limit
        queries = queries[-limit:]
    out.queries = queries
    return out


def parse_since(text: str) -> dt.datetime:
    """``--since``: an ISO date or date-time (UTC unless it says otherwise).

    Example:
        >>> parse_since("2026-12-01").isoformat()
        '2026-12-01T00:00:00+00:00'
    """
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--since {text!r} is not an ISO date or date-time (e.g. 2026-12-01 or 2026-12-01T08:00)"
        ) from None
    return _aware(value)


def _aware(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def outcome(result: LookupResult) -> dict[str, Any]:
    """What a comparison reads of one result: found, the first document, the evidence set (in rank order)."""
    sources = list(dict.fromkeys(block.source for block in result.evidence_blocks))
    return {"found": result.found, "first": sources[0] if sources else None, "evidence": sources}


def changes(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Which of :data:`ASPECTS` differ between two outcomes (the evidence set compared as a set)."""
    differ = {
        "found": a["found"] != b["found"],
        "first document": a["first"] != b["first"],
        "evidence set": set(a["evidence"]) != set(b["evidence"]),
    }
    return [aspect for aspect in ASPECTS if differ[aspect]]


def sidecar_outcome(entry: dict[str, Any], max_documents: int) -> dict[str, Any]:
    """The sidecar's run beside a lookup (its trace entry) as an outcome: its first ``max_documents`` documents. A
    stock retriever has no threshold: it "finds" whenever it returns anything; a run that did not complete finds
    nothing, its status kept."""
    sources = [c["source"] for c in entry.get("top_candidates", [])][:max_documents] if entry["status"] == "ok" else []
    out = {"found": bool(sources), "first": sources[0] if sources else None, "evidence": sources}
    return out if entry["status"] == "ok" else {**out, "status": entry["status"]}


def compare_traffic(
    queries: TrafficQueries,
    replay: Callable[[str], tuple[dict[str, Any], dict[str, Any]]],
    *,
    labels: tuple[str, str],
    source: dict[str, Any],
) -> dict[str, Any]:
    """Each query through both sides (``replay``: the two :func:`outcome` s of a query); the report as data (what
    :func:`traffic_markdown` draws)."""
    cases: list[dict[str, Any]] = []
    for number, query in enumerate(queries.queries, start=1):
        a, b = replay(query)
        cases.append(
            {
                "n": number,
                "query": query,
                "a": a,
                "b": b,
                "changed": changes(a, b),
                "b_adds": [source for source in b["evidence"] if source not in a["evidence"]],
                "b_drops": [source for source in a["evidence"] if source not in b["evidence"]],
            }
        )
    return {
        "a": labels[0],
        "b": labels[1],
        "source": source,
        "trace_rows": queries.rows,
        "replayed": len(queries.queries),
        "skipped": {
            "private": queries.private,
            "repeats": queries.repeats,
            "beyond_limit": queries.beyond_limit,
        },
        "changed": {aspect: sum(aspect in case["changed"] for case in cases) for aspect in ASPECTS},
        "found": {side: sum(case[side]["found"] for case in cases) for side in ("a", "b")},
        "cases": cases,
    }


def traffic_json(report: dict[str, Any]) -> str:
    """The comparison report as canonical JSON (byte-identical for the same traces)."""
    return json_text(report)


def traffic_chart(report: dict[str, Any]) -> BarChart:
    """How many replayed queries changed, per aspect (found, first document, evidence set)."""
    changed = [report["changed"][aspect] for aspect in ASPECTS]
    return BarChart(
        "traffic-changes.png",
        f"What changed on {report['replayed']} replayed queries: {report['a']} vs {report['b']}",
        list(ASPECTS),
        {"changed": changed, "same": [report["replayed"] - n for n in changed]},
        value_label="queries",
        stacked=True,
        colors={"changed": "#c0392b", "same": "#95a5a6"},
    )


def traffic_markdown(report: dict[str, Any], charts: ChartFiles) -> str:
    """The comparison report in Markdown: the counts, the skipped queries, per query what changed."""
    skipped = report["skipped"]
    lines = [
        "# Comparison on real traffic",
        "",
        f"A: {inline(report['a'])}; B: {inline(report['b'])}. {report['trace_rows']} trace rows read "
        f"({inline(json.dumps(report['source'], sort_keys=True))}), {report['replayed']} distinct queries replayed; "
        f"skipped: {skipped['private']} hashed or redacted (KB_TRACE_QUERY), {skipped['repeats']} repeats, "
        f"{skipped['beyond_limit']} beyond --limit.",
        "",
        f"Found: A {report['found']['a']}, B {report['found']['b']} of {report['replayed']}. Changed: "
        + ", ".join(f"{aspect} {report['changed'][aspect]}" for aspect in ASPECTS)
        + ".",
        "",
        *charts.markdown(),
        "",
        "## Per query",
        "",
    ]
    rows = [
        [
            str(case["n"]),
            inline(case["query"][:120]),
            ", ".join(case["changed"]) or "same",
            _side(case["a"]),
            _side(case["b"]),
            inline(", ".join([*(f"+{s}" for s in case["b_adds"]), *(f"-{s}" for s in case["b_drops"])])) or "-",
        ]
        for case in report["cases"]
    ]
    header = ["#", "query", "changed", "A: first (evidence)", "B: first (evidence)", "B adds (+) / drops (-)"]
    lines += markdown_table(header, rows)
    return "\n".join(lines) + "\n"


def _side(side: dict[str, Any]) -> str:
    if not side["found"]:
        return "not found"
    others = len(side["evidence"]) - 1
    return inline(side["first"]) + (f" (+{others})" if others else "")


def draft_cases(
    queries: TrafficQueries, lookup: Callable[[str], LookupResult], top: int, prefix: str = "draft"
) -> list[dict[str, Any]]:
    """Draft golden cases: each query with the documents the current settings put first (at most ``top``) as
    ``expected_docs`` to confirm, or none for a query without evidence (a no-answer case, to confirm as well)."""
    cases = []
    width = max(3, len(str(len(queries.queries))))
    for number, query in enumerate(queries.queries, start=1):
        result = outcome(lookup(query))
        cases.append(
            {
                "case_id": f"{prefix}-{number:0{width}d}",
                "scenario": "traffic",
                "query": query,
                "expected_docs": result["evidence"][:top],
                "acceptable_docs": [],
                "expected_keywords": [],
                "expected_breadcrumbs": [],
                "tags": ["draft", "from-traces", "to-confirm" if result["found"] else "noanswer-to-confirm"],
            }
        )
    return cases


def cases_jsonl(cases: Sequence[dict[str, Any]]) -> str:
    """Draft golden cases, one JSON object per line."""
    return "".join(json.dumps(case, ensure_ascii=False) + "\n" for case in cases)
