"""``kb-retrieval``: ingest, stats, lookup, serve, traces, fixtures record, eval, compare, golden draft, bench, demo.

Every command honours ``--state-dir`` / ``KB_STATE_DIR``; flags override ``KB_*`` environment settings.
Heavy modules load only in the commands that need them, so ``kb-retrieval eval`` stays service-free.

Exit status: 0 done; 1 nothing to do or a check failed (an ingest that found no document, ``eval --fail-under``);
2 a user error (bad argument, input or setting, unreachable Milvus, a damaged, read-only or full state dir), printed
as one line with secrets masked and never a traceback; 3 ``serve`` cannot listen on its address (the port is in
use); 130 interrupted; 141 the reader of the output went away (``| head``), like a command ended by SIGPIPE.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import import_module, metadata
from pathlib import Path
from typing import Any

from kb_retrieval.cli_args import (
    CliError,
    add_location_arguments,
    add_lookup_arguments,
    describe_environment_error,
    describe_settings_error,
    mask_message,
    positive_int,
    register_secret,
    require_extra,
    settings_from_args,
)
from kb_retrieval.config import Settings
from kb_retrieval.knowledge.loader import INGESTED_SUFFIXES
from kb_retrieval.log_format import _MaskingFormatter
from kb_retrieval.output import result_json
from kb_retrieval.reporting import LOCAL_REPORTS_DIR, display_path

SAMPLE_KB = Path(__file__).parent / "sample_kb"
DEMO_QUESTIONS = (
    "RedisMemoryHigh: Redis memory usage above 90% of maxmemory on redis-cache-01:6379",
    "How do I choose a garbage collector for a latency-sensitive JVM service?",
    "MySQLReplicationLag: replica db-replica-2 is 340 seconds behind the primary",
    "pods keep restarting with CrashLoopBackOff after a deploy",
    "How do I tune Kafka consumer group rebalancing?",
)
#: The question the demo suggests trying next: one the sample KB answers (the demo's own no-answer case is Kafka).
DEMO_NEXT_QUESTION = "disk full on a node"
#: Modules of the ``bench`` extra that ``kb-retrieval bench`` needs (the runtime install lacks them).
BENCH_MODULES = ("matplotlib", "llama_index.retrievers.bm25", "psutil")
STDIN = "-"
#: Modules of the ``serve`` extra that ``kb-retrieval serve`` needs.
SERVE_MODULES = ("fastapi", "uvicorn", "mcp")
#: ``serve``'s exit status when its address cannot be bound (uvicorn's own for a failed start-up, kept).
EXIT_ADDRESS_IN_USE = 3
#: Where ``lookup`` sends its queries when set (``--server`` overrides it), and the token it sends with them.
SERVER_URL_ENV = "KB_SERVER_URL"
SERVER_TOKEN_ENV = "KB_SERVER_TOKEN"
#: The ``compare`` command lives with the sidecar; loaded by name, so the core never imports the sidecar package.
COMPARE_MODULE = "sidecar.compare"


# --- commands --------------------------------------------------------------------------------------------


def cmd_ingest(args: argparse.Namespace) -> int:
    from kb_retrieval.indexing.ingest import ingest, remove_root

    settings = settings_from_args(args)
    if not args.kb_dirs and not args.remove_root:
        print("error: give a knowledge-base folder to ingest, or --remove-root ROOT", file=sys.stderr)
        return 2
    for root in args.remove_root:
        removed = remove_root(root, settings)
        message = f"removed root {root}: {removed.documents_removed} documents, {removed.chunks_removed} chunks"
        print(message, file=sys.stderr if args.json else sys.stdout)
    if not args.kb_dirs:
        return 0
    summary = ingest(args.kb_dirs, settings, progress=not args.json)
    for folder in summary.empty_kb_dirs:
        print(f"warning: no document found in {folder}", file=sys.stderr)
    if args.json:
        print(summary.model_dump_json())
    else:
        print(
            f"documents: {summary.documents} (added {summary.documents_added}, updated {summary.documents_updated}, "
            f"removed {summary.documents_removed}, unchanged {summary.documents_unchanged})\n"
            f"chunks: added {summary.chunks_added}, updated {summary.chunks_updated} "
            f"(replacing {summary.chunks_replaced}), removed {summary.chunks_removed}, "
            f"unchanged {summary.chunks_unchanged} (embedded {summary.chunks_embedded})\n"
            f"skipped files: {summary.skipped_files}{' (each named in a warning above)' if summary.skipped else ''}\n"
            f"seconds: {summary.seconds}"
        )
    if summary.documents == 0:  # a wrong folder, or one holding no file of an ingested type: say so, and fail scripts
        print(
            f"error: no document ingested (no {', '.join(INGESTED_SUFFIXES)} document in the folders given)",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from kb_retrieval.indexing.doc_vectors import doc_vectors_collection_name, doc_vectors_off_reason
    from kb_retrieval.indexing.l0_index import L0Index
    from kb_retrieval.indexing.milvus import connect, count_rows, ensure_collection, features_off
    from kb_retrieval.retrieval.hybrid import choose_lexical_mode
    from kb_retrieval.retrieval.l1.memory import choose_plan, estimated_mirror_mb

    settings = settings_from_args(args)
    require_knowledge_base(settings)
    client = connect(settings)
    ensure_collection(client, settings, create=False)
    l0 = L0Index.load_from_milvus(client, settings)
    off = features_off(client, settings)
    if not l0.enabled:
        off["l0_hints"] = l0.off_reason or "no L0 index"
    lexical_mode, lexical_reason = choose_lexical_mode(client, settings, None)
    if lexical_reason:
        off["milvus_bm25"] = lexical_reason
    chunks = count_rows(client, settings)
    plan, plan_reason = choose_plan(client, settings, custom_path=False)
    if plan == "memory" and estimated_mirror_mb(chunks, settings) > settings.memory_plan_max_mb:
        plan, plan_reason = "milvus", f"the mirror would pass memory_plan_max_mb ({settings.memory_plan_max_mb:g} MB)"
    # Counted, not read: the vectors themselves are for lookups.
    doc_vectors_off = doc_vectors_off_reason(client, settings)
    if doc_vectors_off:
        off["document_ranking"] = doc_vectors_off
    docs_name = doc_vectors_collection_name(settings)
    doc_vectors = 0 if doc_vectors_off else count_rows(client, settings, collection=docs_name)
    categories: dict[str, int] = {}
    for entry in l0.documents.values():
        key = entry.category or "(none)"
        categories[key] = categories.get(key, 0) + 1
    stats: dict[str, Any] = {
        "collection": settings.collection,
        "milvus": "server" if settings.is_milvus_server() else "lite",
        "uri": settings.mask(settings.resolved_milvus_uri()),
        "chunks": chunks,
        "documents": len(l0.documents),
        "knowledge_bases": len({e.kb for e in l0.documents.values()}),
        "categories": dict(sorted(categories.items())),
        "metric": settings.metric,
        "dim": settings.dim,
        "lexical_mode": lexical_mode,
        "lookup_plan": plan,
        "lookup_plan_reason": plan_reason,
        "document_vectors": doc_vectors,
        "features_off": dict(sorted(off.items())),
    }
    if args.json:
        print(json.dumps(stats, sort_keys=True))
        return 0
    kind = "Milvus server" if stats["milvus"] == "server" else "Milvus Lite"
    rows = [
        ("collection", f"{stats['collection']} ({kind}, {stats['uri']})"),
        ("chunks", str(stats["chunks"])),
        ("documents", f"{stats['documents']} from {stats['knowledge_bases']} knowledge-base folder(s)"),
        ("categories", ", ".join(f"{name} {count}" for name, count in stats["categories"].items()) or "(none)"),
        ("vectors", f"{stats['dim']} dimensions, {stats['metric']}"),
        ("lexical", stats["lexical_mode"]),
        ("lookup plan", f"{plan} ({plan_reason})"),
        ("document vectors", f"{stats['document_vectors']} documents (title, summary, text)"),
        *((f"{feature} off", reason) for feature, reason in stats["features_off"].items()),
    ]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    return 0


def require_knowledge_base(settings: Any) -> None:
    """Stop with one line when the state dir holds no knowledge base (no Milvus Lite data dir, milvus.db): a
    mistyped ``--state-dir`` is said, not created empty."""
    if settings.milvus_uri:
        return  # a Milvus server, or a Lite file named on purpose: connecting says what is wrong
    database = Path(settings.resolved_milvus_uri())
    if not database.exists():  # a file, or the data dir milvus-lite makes of it
        raise CliError(
            f"no knowledge base in {settings.state_dir} ({database.name} not found): check --state-dir, or run "
            f"`{_command_name()} ingest KB_DIR --state-dir {settings.state_dir}` first"
        )


@dataclass(frozen=True)
class QueryCase:
    """One query to look up, and where it came from (its case id, else file:line)."""

    case_id: str
    query: str


def cmd_lookup(args: argparse.Namespace) -> int:
    if args.query is not None and args.queries is not None:
        raise CliError("give a QUERY or --queries FILE.jsonl, not both")
    if args.query is None and args.queries is None:
        raise CliError("give a QUERY (or - to read it from stdin) or --queries FILE.jsonl")
    settings = settings_from_args(args)
    # Every query is checked before anything is looked up or printed.
    if args.queries is not None:
        cases = read_queries(args.queries, settings.max_query_chars)
    else:
        query = sys.stdin.read().strip() if args.query == STDIN else args.query  # no trailing newline in traces
        _check_query(query, "stdin" if args.query == STDIN else "QUERY", settings.max_query_chars)
        cases = [QueryCase("", query)]
    server_url = args.server or os.environ.get(SERVER_URL_ENV) or _serving(settings)
    if server_url:  # a running `kb-retrieval serve` answers: nothing heavy is imported here
        return _lookup_through_server(server_url, cases, args)
    require_knowledge_base(settings)

    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.terminal import lookup_text
    from kb_retrieval.traces import TraceStore

    lookup = KnowledgeLookup(settings, trace_store=TraceStore.from_settings(settings))
    try:
        for case in cases:
            result = lookup.lookup(case.query)
            if args.queries is not None:
                print(result_json(result.to_json_dict(), case.case_id), flush=True)
            elif args.json:
                print(result_json(result.to_json_dict()))
            else:
                width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
                print(lookup_text(result, settings.scoring, full=args.full, width=width))
    finally:
        lookup.close()
    return 0


def _serving(settings: Settings) -> str | None:
    """The URL of the ``serve`` holding this state dir (:mod:`kb_retrieval.service.discovery`), else None."""
    from kb_retrieval.service.discovery import find_server

    found = find_server(settings)
    if found is None:
        return None
    if found.token_required and not os.environ.get(SERVER_TOKEN_ENV):
        raise CliError(
            f"the state dir is held by kb-retrieval serve (pid {found.pid}) at {found.url}, which wants a token: "
            f"set {SERVER_TOKEN_ENV}"
        )
    logging.getLogger("kb_retrieval").info("looking up through kb-retrieval serve (pid %s) at %s", found.pid, found.url)
    return found.url


def _lookup_through_server(url: str, cases: list[QueryCase], args: argparse.Namespace) -> int:
    """``lookup`` against a running ``kb-retrieval serve``: the same lines an in-process lookup prints."""
    from kb_retrieval.service.client import LookupClient, ServerError

    token = os.environ.get(SERVER_TOKEN_ENV, "")
    register_secret(token)
    try:
        client = LookupClient(url, token)
        for case in cases:
            if args.queries is not None:
                print(result_json(client.lookup_json(case.query), case.case_id), flush=True)
            elif args.json:
                print(result_json(client.lookup_json(case.query)))
            else:
                width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
                print(client.lookup_text(case.query, full=args.full, width=width))
    except ServerError as exc:
        raise CliError(str(exc)) from None
    return 0


def read_queries(source: str, max_query_chars: int = 4000) -> list[QueryCase]:
    """The cases of a JSON Lines file (``-``: stdin), each with a non-empty ``query``; any bad line is an error
    naming ``file:line``. Blank lines are skipped. The case id is the line's ``case_id``, else ``file:line``."""
    if source == STDIN:
        name, text = "stdin", sys.stdin.read()
    else:
        path = Path(source)
        if not path.is_file():
            raise CliError(f"queries file {'is not a file' if path.exists() else 'not found'}: {path}")
        try:
            name, text = source, path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"{path}: cannot read it as UTF-8 text ({exc})") from None
    cases = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CliError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("query"), str):
            raise CliError(f"{where}: field 'query' missing or not a string")
        _check_query(record["query"], where, max_query_chars)
        case_id = record.get("case_id")
        cases.append(QueryCase(case_id if isinstance(case_id, str) and case_id else where, record["query"]))
    if not cases:
        raise CliError(f"{name}: no query in it")
    return cases


def _check_query(query: str, where: str, max_query_chars: int) -> None:
    """The lookup's own check (``normalize_query``, what ``transform_query`` runs), up front so a bad query fails
    before any output; light, so a lookup through a server loads nothing heavy."""
    from kb_retrieval.retrieval.query_check import EmptyQueryError, normalize_query

    try:
        normalize_query(query, max_query_chars)
    except EmptyQueryError as exc:
        raise CliError(f"{where}: {exc}") from None


def cmd_serve(args: argparse.Namespace) -> int:
    require_extra("serve", SERVE_MODULES, "serve")
    from pydantic import ValidationError

    from kb_retrieval.service.server import AddressInUseError, ServeError, run_server
    from kb_retrieval.service.settings import ServeSettings

    flags = {"host": args.host, "port": args.port, "token": args.token, "workers": args.workers}
    try:
        serve = ServeSettings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as error:
        names = {field: f"KB_SERVER_{field.upper()}" for field in ServeSettings.model_fields}
        raise CliError(describe_settings_error(error, names | {k: f"--{k}" for k, v in flags.items() if v})) from None
    register_secret(serve.token.get_secret_value())
    try:
        return run_server(settings_from_args(args), serve)
    except AddressInUseError as exc:
        _user_error(str(exc))
        return EXIT_ADDRESS_IN_USE
    except ServeError as exc:
        raise CliError(str(exc)) from None


def cmd_traces(args: argparse.Namespace) -> int:
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


def cmd_fixtures_record(args: argparse.Namespace) -> int:
    from kb_retrieval.evaluation.recorder import record_fixtures

    out = Path(args.out) if args.out else Path(LOCAL_REPORTS_DIR, "fixtures", Path(args.golden).stem)
    count = record_fixtures(Path(args.golden), out, settings_from_args(args), progress=True)
    print(f"recorded {count} fixtures in {out.as_posix()}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.indexing.ingest import ingest
    from kb_retrieval.terminal import why
    from kb_retrieval.traces import TraceStore

    settings = settings_from_args(args)
    print(f"== ingesting the sample knowledge base into Milvus ({settings.mask(settings.resolved_milvus_uri())})")
    summary = ingest([SAMPLE_KB], settings, progress=True)
    print(
        f"   {summary.documents} documents, {summary.chunks_added + summary.chunks_updated + summary.chunks_unchanged} "
        f"chunks ({summary.chunks_embedded} embedded this run) in {summary.seconds}s"
    )
    lookup = KnowledgeLookup(settings, trace_store=TraceStore.from_settings(settings))
    for question in args.questions or DEMO_QUESTIONS:
        result = lookup.lookup(question)
        print(f"\n== lookup_knowledge: {question}")
        trace = result.retrieval_trace
        print(
            f"   found={result.found} relevance={result.relevance_level} layer={result.retrieval_layer} "
            f"filter={result.query_transform.category_filter} fallback={trace.fallback_reason} "
            f"path={trace.path_served} {result.elapsed_ms:.0f} ms"
        )
        if not result.found:
            print(f"   {result.message}")
        for i, block in enumerate(result.evidence_blocks[:3], start=1):
            print(f"   [{i}] {block.source}  ({block.breadcrumb})  score={block.score:.3f}")
            print(f"       why: {why(block)}")
    where = settings.mask(settings.resolved_trace_db_url())
    try:
        print(f"\n{lookup.traces.count()} tool_invocation rows in {where}")
    except SQLAlchemyError as exc:  # the lookups answered regardless; their lost rows were logged
        print(f"\ntrace store {where} unavailable ({type(exc).__name__}): {lookup.traces.failures} rows not recorded")
    lookup.close()
    print("\n" + demo_next_steps(settings.state_dir))
    return 0


def demo_next_steps(state_dir: Path) -> str:
    """The three commands a newcomer tries after the demo, pointed at the demo's own state dir."""
    state, command = shlex.quote(state_dir.as_posix()), _command_name()
    steps = [
        (f'{command} lookup --state-dir {state} "{DEMO_NEXT_QUESTION}"', "ask your own question"),
        (f"{command} ingest path/to/your/kb --state-dir .kb-state/mine", "index your own knowledge base"),
        (f'{command} lookup --state-dir .kb-state/mine --full "your question"', "and look it up"),
    ]
    width = max(len(step) for step, _ in steps)
    return "Next, try:\n" + "\n".join(f"  {step:<{width}}  # {why}" for step, why in steps)


def _command_name() -> str:
    """How the user ran this CLI, for commands to copy: ``.venv/bin/kb-retrieval`` after ``make demo``."""
    argv0 = sys.argv[0] if sys.argv else ""
    if Path(argv0).name == "kb-retrieval" and os.sep in argv0:
        return display_path(argv0)
    return "kb-retrieval"


def cmd_bench(args: argparse.Namespace) -> int:
    require_extra("bench", BENCH_MODULES, "bench")
    from kb_retrieval.bench.run import run_bench

    shared = Path(args.shared)
    if not (shared / "golden").is_dir() or not (shared / "corpora").is_dir():
        raise CliError(f"shared corpora and golden sets not found under {shared} (--shared)")
    parts = {"quality", "speed", "scale"} if args.only is None else {args.only}
    readme = Path("README.md") if Path("README.md").is_file() else None
    run_bench(shared, Path(args.out), Path(args.state_dir or ".kb-state/bench"), parts=parts, readme=readme)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    if args.from_traces:  # real traffic instead of a golden set: no sidecar needed
        from kb_retrieval.evaluation.traffic_command import run_compare_traffic

        return run_compare_traffic(args, require_knowledge_base)
    if not args.golden:
        raise CliError("compare needs --golden FILE.jsonl, or --from-traces to replay the trace store's queries")
    return int(import_module(COMPARE_MODULE).run_compare_command(args))


def cmd_golden(args: argparse.Namespace) -> int:
    from kb_retrieval.evaluation.traffic_command import run_golden_draft

    return run_golden_draft(args, require_knowledge_base)


def cmd_eval(args: argparse.Namespace) -> int:
    from kb_retrieval.evaluation.runner import run_eval_command

    return run_eval_command(args)


# --- parser ----------------------------------------------------------------------------------------------


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; ``command`` (the subcommand about to run) lets rarely used ones load their options lazily."""
    parser = argparse.ArgumentParser(prog="kb-retrieval", description=__doc__.split("\n")[0].replace("``", ""))
    parser.add_argument("-V", "--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("ingest", help="index knowledge-base folders into Milvus (incremental)")
    p.add_argument(
        "kb_dirs",
        nargs="*",
        metavar="KB_DIR",
        help=f"a folder of documents ({', '.join(INGESTED_SUFFIXES)}; other files are skipped and named); several "
        "allowed; a folder inside one already ingested is refused",
    )
    p.add_argument(
        "--remove-root",
        action="append",
        default=[],
        metavar="ROOT",
        help="take a knowledge-base folder (as ingested) out of the collection: its documents, L0 entries and "
        "document vectors; several allowed; runs before any folder given is ingested",
    )
    add_location_arguments(p)
    p.add_argument(
        "--batch-size", type=int, metavar="N", help="texts embedded per model call (KB_EMBED_BATCH_SIZE; default 32)"
    )
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="threads of the passage encoder (KB_EMBED_THREADS; default: every core)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("stats", help="what the collection and the L0 index hold")
    add_location_arguments(p)
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object (for scripts)")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("lookup", help="run lookup_knowledge for a query (or a JSONL file of queries)")
    p.add_argument(
        "query", nargs="?", metavar="QUERY", help="a question or an alert text; - reads it from stdin (whole)"
    )
    p.add_argument(
        "--queries",
        metavar="FILE.jsonl",
        help="one JSON object with a 'query' field per line (- for stdin); prints one JSON result per line with its "
        "caseId (the line's case_id, else FILE:LINE); every line is checked before the first lookup",
    )
    p.add_argument("--json", action="store_true", help="print the full result as JSON (for scripts)")
    p.add_argument(
        "--full", action="store_true", help="print every evidence document's text, not only the first's matches"
    )
    p.add_argument(
        "--server",
        metavar="URL",
        help="send the lookups to a running `kb-retrieval serve` (e.g. http://127.0.0.1:8765) instead of loading the "
        f"pipeline here; same output ({SERVER_URL_ENV}; its token from {SERVER_TOKEN_ENV})",
    )
    add_lookup_arguments(p)
    p.set_defaults(func=cmd_lookup)

    p = sub.add_parser("serve", help="one warm process for HTTP and MCP clients, Alertmanager and a test page")
    p.add_argument("--host", help="address to bind (KB_SERVER_HOST; default 127.0.0.1: other addresses need a token)")
    p.add_argument("--port", type=int, help="port (KB_SERVER_PORT; default 8765; 0: any free port)")
    p.add_argument(
        "--token",
        help="bearer token clients must send (KB_SERVER_TOKEN, preferred: a flag shows in the process list)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        help="worker processes (KB_SERVER_WORKERS; default 1): lookups are CPU-bound, one process uses one core",
    )
    add_lookup_arguments(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("traces", help="the latest recorded tool_invocation rows")
    p.add_argument("--limit", type=positive_int, default=20, help="rows to show, newest first (default 20)")
    p.add_argument("--json", action="store_true", help="one JSON object per row, with its retrieval_details")
    add_location_arguments(p)
    p.set_defaults(func=cmd_traces)

    p = sub.add_parser("fixtures", help="fixtures for the offline evaluator")
    fsub = p.add_subparsers(dest="fixtures_command", required=True, metavar="SUBCOMMAND")
    r = fsub.add_parser("record", help="run the live pipeline once per golden case and write one fixture each")
    r.add_argument("--golden", required=True, metavar="FILE.jsonl", help="golden cases, JSON Lines")
    r.add_argument(
        "--out",
        metavar="DIR",
        help=f"folder the fixtures are written to (default: {LOCAL_REPORTS_DIR}/fixtures/<golden file's name>)",
    )
    add_lookup_arguments(r)
    r.set_defaults(func=cmd_fixtures_record)

    p = sub.add_parser("eval", help="offline evaluation of golden cases against recorded fixtures (no services)")
    if command in (None, "eval"):  # its options load with it; `lookup --server` stays a light process
        from kb_retrieval.evaluation.runner import add_eval_arguments

        add_eval_arguments(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser(
        "compare",
        help="the current path against the stock sidecar retriever per golden case, or (--from-traces) the trace "
        "store's queries through the current settings and an alternative",
    )
    if command == "compare":  # only then is the sidecar imported: `eval` and `lookup` never load it
        from kb_retrieval.evaluation.traffic_command import add_compare_traffic_arguments

        import_module(COMPARE_MODULE).add_compare_arguments(p)
        add_compare_traffic_arguments(p)
        add_lookup_arguments(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("golden", help="golden cases: draft them from the trace store's queries (golden draft)")
    if command == "golden":
        from kb_retrieval.evaluation.traffic_command import add_golden_arguments

        add_golden_arguments(p)
    p.set_defaults(func=cmd_golden)

    p = sub.add_parser("bench", help="quality against the stock retrievers on ../shared, and speed ('bench' extra)")
    p.add_argument("--shared", default="../shared", help="folder holding corpora/ and golden/ (default ../shared)")
    p.add_argument("--out", default="reports/bench", help="report folder (default reports/bench)")
    p.add_argument("--state-dir", help="where the benchmark indexes live (default .kb-state/bench)")
    p.add_argument(
        "--only",
        choices=["quality", "speed", "scale"],
        help="run one part and keep the others' figures (scale: lookup latency at 1k-100k chunks on Milvus Lite "
        "and on a Milvus server, KB_BENCH_MILVUS_URI or one the bench starts)",
    )
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("demo", help="ingest the bundled sample KB into Milvus Lite and answer a few questions")
    p.add_argument("questions", nargs="*", metavar="QUESTION", help="questions to ask (default: five samples)")
    add_lookup_arguments(p)
    p.set_defaults(func=cmd_demo)
    return parser


def _version() -> str:
    try:
        return metadata.version("kb-retrieval")
    except metadata.PackageNotFoundError:  # run from a source tree without installing
        from kb_retrieval import __version__

        return __version__


# --- running ---------------------------------------------------------------------------------------------


def _first_line_only(record: logging.LogRecord) -> bool:
    """A log filter: the record's message cut to its first line (what failed, without the traceback after it)."""
    text = record.getMessage()
    if "\n" in text:
        record.msg, record.args = text.split("\n", 1)[0], ()
    return True


#: What the command-line process sets for itself before any model library is imported (the library never touches
#: the environment): offline Hugging Face, and no tokenizer thread pools to fork.
CLI_ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
#: Bits the command-line process adds to its umask: no group or other access to anything it creates.
PRIVATE_UMASK = 0o077


def main(argv: Sequence[str] | None = None) -> int:
    for name, value in CLI_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    # What the commands write (the Milvus Lite files, written as late as a first load; traces; snapshots) holds the
    # knowledge base and its queries: the owner's only, whatever umask the shell has (000 included).
    umask = os.umask(PRIVATE_UMASK)
    os.umask(umask | PRIVATE_UMASK)
    try:
        return _run(list(sys.argv[1:] if argv is None else argv))
    finally:
        os.umask(umask)  # called in process (tests, notebooks): the caller's umask back


def _run(argv: list[str]) -> int:
    args = build_parser(next((a for a in argv if not a.startswith("-")), None)).parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(_MaskingFormatter(args.verbose))
    if not args.verbose:  # pymilvus writes the traceback into the message text of its RPC errors
        logging.getLogger("pymilvus.decorators").addFilter(_first_line_only)
    try:
        return int(args.func(args))
    except CliError as exc:
        return _user_error(str(exc))
    except BrokenPipeError:
        _discard_stdout()
        return 141
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        message = _user_error_message(exc)
        if message is None:
            raise
        return _user_error(message)


def _user_error(message: str) -> int:
    print(f"error: {mask_message(message)}", file=sys.stderr)
    return 2


def _user_error_message(exc: Exception) -> str | None:
    """The one line to print for an error caused by input or environment, or None for a bug (a traceback)."""
    from pydantic import ValidationError

    from kb_retrieval.knowledge.loader import KnowledgeBaseError

    if isinstance(exc, ValidationError) and exc.title in ("KBSettings", "Settings"):
        return describe_settings_error(exc)
    if type(exc).__name__ == "SettingsError":  # pydantic-settings could not parse a variable (not JSON)
        return describe_environment_error(exc)
    names = {
        "MilvusUnavailableError",
        "MilvusLiteLockedError",
        "SchemaMismatchError",
        "EmptyQueryError",
        "GoldenCaseError",
        "FixtureError",
        "TraceStoreError",
        "LiteDataError",
    }
    if isinstance(exc, KnowledgeBaseError | ValidationError) or type(exc).__name__ in names:
        return str(exc)
    if type(exc).__name__ == "MilvusException":  # Milvus refused a call (a full disk under Lite, a server error)
        from kb_retrieval.indexing.milvus import describe_milvus_error

        return describe_milvus_error(exc)
    if isinstance(exc, OSError):  # a path that cannot be created or read, a permission, a full disk
        return f"{exc.strerror or type(exc).__name__}: {exc.filename}" if exc.filename else str(exc)
    return None


def _discard_stdout() -> None:
    """Point stdout at /dev/null: the reader is gone, and the interpreter's final flush must not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (captured output): nothing left to flush to
        pass


if __name__ == "__main__":
    sys.exit(main())
