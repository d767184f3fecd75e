"""``kb-retrieval compare --from-traces`` and ``kb-retrieval golden draft --from-traces``: the command lines of
:mod:`kb_retrieval.evaluation.traffic`.

Command lines (wired by ``kb_retrieval.cli``, which adds ``--state-dir/--uri/--collection/--mode``)::

    kb-retrieval compare --from-traces [--since 2026-12-01] [--limit N] (--set KEY=VALUE ... | --against DIR |
        --sidecar)
        [--out reports/local/compare] [--name traffic]
    kb-retrieval golden draft --from-traces [--since ...] [--limit N] [--top 3] [--out FILE.jsonl]

The queries come from the state's trace store (``KB_TRACE_DB_URL``); the current side is the settings the flags and
``KB_*`` give, the alternative the same with ``--set`` overrides, the knowledge base in another state dir
(``--against``), or the stock LlamaIndex retriever run beside each lookup (``--sidecar``). Exit codes: 0 written;
2 bad arguments (nothing written).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kb_retrieval.cli_args import CliError, add_lookup_arguments, positive_int
from kb_retrieval.reporting import LOCAL_REPORTS_DIR, display_path

DEFAULT_OUT_DIR = f"{LOCAL_REPORTS_DIR}/compare"
DEFAULT_NAME = "traffic"
DEFAULT_DRAFT = f"{LOCAL_REPORTS_DIR}/golden/draft-from-traces.jsonl"


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """``--from-traces``, ``--since``, ``--limit``: which trace rows to replay."""
    parser.add_argument(
        "--from-traces",
        action="store_true",
        help="replay the queries of the trace store (hashed or redacted ones skipped, counted) instead of a golden set",
    )
    parser.add_argument("--since", metavar="DATE", help="trace rows from this ISO date or date-time on (UTC)")
    parser.add_argument("--limit", type=positive_int, metavar="N", help="the N most recent distinct queries")


def add_compare_traffic_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``compare --from-traces`` options (beside the golden-set ones, which it does not use)."""
    add_trace_arguments(parser)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="sets",
        help="with --from-traces: the alternative is the current settings with this one changed (repeatable)",
    )
    parser.add_argument(
        "--against",
        metavar="DIR",
        help="with --from-traces: the alternative is the knowledge base in this state dir",
    )
    parser.add_argument(
        "--sidecar",
        action="store_true",
        help="with --from-traces: the alternative is the stock LlamaIndex retriever run beside each lookup",
    )


def add_golden_arguments(parser: argparse.ArgumentParser) -> None:
    """``golden draft``'s options."""
    sub = parser.add_subparsers(dest="golden_command", required=True, metavar="SUBCOMMAND")
    draft = sub.add_parser("draft", help="draft golden cases from the trace store's queries, for a person to confirm")
    add_trace_arguments(draft)
    draft.add_argument("--top", type=positive_int, default=3, help="documents proposed per query (default 3)")
    draft.add_argument(
        "--out", default=DEFAULT_DRAFT, metavar="FILE.jsonl", help=f"where the draft cases go (default {DEFAULT_DRAFT})"
    )
    add_lookup_arguments(draft)


def parse_sets(pairs: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` pairs as typed settings (each value read as its setting's type).

    Example:
        >>> parse_sets(["top_k=50", "document_ranking=false"])
        {'top_k': 50, 'document_ranking': False}
    """
    from pydantic import TypeAdapter, ValidationError

    from kb_retrieval.config import KBSettings

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().lower().removeprefix("kb_")
        if not sep or not key:
            raise CliError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set top_k=50")
        field = KBSettings.setting_field(key)
        if field is None:
            raise CliError(f"--set {key}: no such setting (the settings are listed in docs/reference.md)")
        try:
            out[key] = TypeAdapter(field.annotation or str).validate_python(value)
        except ValidationError as error:
            raise CliError(f"--set {key}={value}: {error.errors()[0]['msg']}") from None
    return out


def _queries(args: argparse.Namespace, settings: Any) -> Any:
    from kb_retrieval.evaluation.traffic import parse_since, traffic_queries
    from kb_retrieval.traces import TraceStore

    try:
        since = parse_since(args.since) if args.since else None
    except ValueError as error:
        raise CliError(str(error)) from None
    store = TraceStore.from_settings(settings)
    try:
        rows = [(row.query, row.created_at) for row in store.rows()]
    finally:
        store.close()
    queries = traffic_queries(rows, since, args.limit)
    if not queries.queries:
        raise CliError(
            f"no query to replay: {queries.rows} trace row(s) read"
            + (f" since {args.since}" if args.since else "")
            + f", {queries.private} hashed or redacted (KB_TRACE_QUERY)"
        )
    return queries


@contextlib.contextmanager
def _lookup(settings: Any) -> Iterator[Any]:
    """A lookup whose own lookups write no trace rows (a replay must not feed the traffic it reads)."""
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.traces import TraceStore

    lookup = KnowledgeLookup(settings, trace_store=TraceStore("sqlite://"))
    try:
        yield lookup
    finally:
        lookup.close()


def run_compare_traffic(args: argparse.Namespace, require_knowledge_base: Callable[[Any], None]) -> int:
    """``compare --from-traces``: the report files, and a one-line summary on stdout. ``require_knowledge_base``:
    the CLI's check that a state dir holds a knowledge base (it stops with one line when not)."""
    from kb_retrieval.cli_args import settings_from_args
    from kb_retrieval.evaluation.traffic import (
        compare_traffic,
        outcome,
        traffic_chart,
        traffic_json,
        traffic_markdown,
    )
    from kb_retrieval.overrides import UnsupportedOverrideError
    from kb_retrieval.reporting import write_report_files

    if sum(map(bool, (args.sets, args.against, args.sidecar))) != 1:
        raise CliError(
            "compare --from-traces needs one alternative: --set KEY=VALUE (repeatable), --against DIR or --sidecar"
        )
    sets = parse_sets(args.sets)
    settings = settings_from_args(args, **({"sidecar_enabled": True} if args.sidecar else {}))
    require_knowledge_base(settings)
    other = settings_from_args(args, state_dir=args.against) if args.against else None
    if other is not None:
        require_knowledge_base(other)
    queries = _queries(args, settings)
    source = {"since": args.since, "limit": args.limit}
    with contextlib.ExitStack() as stack:
        current = stack.enter_context(_lookup(settings))
        if args.sidecar:
            labels = ("current", "sidecar (stock LlamaIndex retriever)")
            replay = _with_sidecar(current, settings.evidence.max_evidence_blocks)
        else:
            if other is not None:
                alternative = stack.enter_context(_lookup(other))
                labels = ("current", f"state dir {display_path(args.against)}")
            else:
                try:
                    alternative = current.with_settings(**sets)
                except UnsupportedOverrideError:  # another model, plan, ...: a pipeline of its own
                    alternative = stack.enter_context(_lookup(settings_from_args(args, **sets)))
                labels = ("current", " ".join(f"{k}={v}" for k, v in sets.items()))

            def replay(query: str) -> tuple[dict[str, Any], dict[str, Any]]:
                return outcome(current.lookup(query)), outcome(alternative.lookup(query))

        print(f"replaying {len(queries.queries)} queries through {labels[0]} and {labels[1]}", file=sys.stderr)
        report = compare_traffic(queries, replay, labels=labels, source=source)
    files = write_report_files(
        args.out,
        args.name or DEFAULT_NAME,
        traffic_json(report),
        [traffic_chart(report)],
        lambda charts: traffic_markdown(report, charts),
    )
    changed = ", ".join(f"{aspect} {n}" for aspect, n in report["changed"].items())
    print(f"{report['replayed']} queries replayed ({queries.private} hashed or redacted skipped); changed: {changed}")
    print(files.summary())
    return 0


def _with_sidecar(lookup: Any, max_documents: int) -> Any:
    """Both sides from one lookup with the sidecar beside it: the lookup's outcome and the sidecar's."""
    from kb_retrieval.evaluation.traffic import outcome, sidecar_outcome
    from kb_retrieval.sidecar_protocol import disabled_entry

    def replay(query: str) -> tuple[dict[str, Any], dict[str, Any]]:
        details = lookup.lookup_detailed(query)
        entry = details.sidecar.trace_entry() if details.sidecar is not None else disabled_entry()
        return outcome(details.result), sidecar_outcome(entry, max_documents)

    return replay


def run_golden_draft(args: argparse.Namespace, require_knowledge_base: Callable[[Any], None]) -> int:
    """``golden draft --from-traces``: a JSON Lines file of draft cases (``require_knowledge_base`` as for
    :func:`run_compare_traffic`)."""
    from kb_retrieval.cli_args import settings_from_args
    from kb_retrieval.evaluation.traffic import cases_jsonl, draft_cases

    if not args.from_traces:
        raise CliError("golden draft needs --from-traces (the trace store's queries are what it drafts from)")
    settings = settings_from_args(args)
    require_knowledge_base(settings)
    queries = _queries(args, settings)
    with _lookup(settings) as lookup:
        cases = draft_cases(queries, lookup.lookup, args.top)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(cases_jsonl(cases), encoding="utf-8", newline="\n")
    print(
        f"wrote {len(cases)} draft case(s) to {display_path(out)} ({queries.private} hashed or redacted skipped): "
        "confirm or correct each expected_docs, then drop the 'draft' tag"
    )
    return 0
