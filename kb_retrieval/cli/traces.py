"""``kb-retrieval traces``: the latest recorded ``tool_invocation`` rows, newest first."""

from __future__ import annotations

import argparse
import json
import sys

from kb_retrieval.cli_args import add_location_arguments, positive_int, settings_from_args


def run(args: argparse.Namespace) -> int:
    """Print the latest rows (``--json``: one object per row, with its retrieval details)."""
    from kb_retrieval.traces import TraceStore, row_dict

    settings = settings_from_args(args)
    store = TraceStore.from_settings(settings)
    try:
        rows = store.latest(args.limit)
    finally:
        store.close()
    if args.json:
        for row in rows:
            print(json.dumps(row_dict(row), ensure_ascii=False, sort_keys=True))
        return 0
    for row in rows:
        details = row.retrieval_details or {}
        sources = [b.get("source") for b in details.get("evidence_blocks", [])]
        fallback = details.get("fallback_reason")
        print(
            f"#{row.id} {row_dict(row, details=False)['created_at']} {row.duration_ms:.0f} ms {row.evidence_status} "
            f"layer={row.retrieval_layer} relevance={details.get('relevance_level')}"
            + (f" fallback={fallback}" if fallback else "")
            + f"\n    query: {row.query}\n    evidence: {', '.join(s for s in sources if s) or '(none)'}"
        )
    if not rows:
        print(f"no tool_invocation rows in {settings.mask(settings.resolved_trace_db_url())}", file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], command: str | None) -> None:
    """The ``traces`` command's options."""
    p = sub.add_parser("traces", help="the latest recorded tool_invocation rows")
    p.add_argument("--limit", type=positive_int, default=20, help="rows to show, newest first (default 20)")
    p.add_argument("--json", action="store_true", help="one JSON object per row, with its retrieval_details")
    add_location_arguments(p)
    p.set_defaults(func=run)
