"""``kb-retrieval``: ingest, stats, lookup, fixtures record, eval, demo.

Every command honours ``--state-dir`` / ``KB_STATE_DIR``; flags override ``KB_*`` environment settings.
Heavy modules load only in the commands that need them, so ``kb-retrieval eval`` stays service-free.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kb_retrieval.config import Settings

SAMPLE_KB = Path(__file__).parent / "sample_kb"
DEMO_QUESTIONS = (
    "RedisMemoryHigh: Redis memory usage above 90% of maxmemory on redis-cache-01:6379",
    "How do I choose a garbage collector for a latency-sensitive JVM service?",
    "MySQLReplicationLag: replica db-replica-2 is 340 seconds behind the primary",
    "pods keep restarting with CrashLoopBackOff after a deploy",
    "How do I tune Kafka consumer group rebalancing?",
)


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    for flag, key in (
        ("state_dir", "state_dir"),
        ("uri", "milvus_uri"),
        ("collection", "collection"),
        ("mode", "vector_store_mode"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            overrides[key] = value
    return Settings(**overrides)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", help="state directory (KB_STATE_DIR; default ./.kb-state)")
    parser.add_argument("--uri", help="Milvus URI: a local path (Milvus Lite) or http://host:port (KB_MILVUS_URI)")
    parser.add_argument("--collection", help="Milvus collection name (KB_COLLECTION)")


def _lookup_flags(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("--mode", choices=["auto", "vectorstore", "sdk", "spring-ai"], help="vector-store path")


# --- commands --------------------------------------------------------------------------------------------


def cmd_ingest(args: argparse.Namespace) -> int:
    from kb_retrieval.indexing.ingest import ingest

    summary = ingest(args.kb_dirs, _settings(args), progress=not args.json and sys.stderr.isatty())
    if args.json:
        print(summary.model_dump_json())
        return 0
    print(
        f"documents: {summary.documents} (added {summary.documents_added}, updated {summary.documents_updated}, "
        f"removed {summary.documents_removed}, unchanged {summary.documents_unchanged})\n"
        f"chunks: added {summary.chunks_added}, updated {summary.chunks_updated}, removed {summary.chunks_removed}, "
        f"unchanged {summary.chunks_unchanged} (embedded {summary.chunks_embedded})\n"
        f"skipped files: {summary.skipped_files}\n"
        f"seconds: {summary.seconds}"
    )
    for entry in summary.skipped:
        print(f"  skipped {entry.source}: {entry.reason}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from kb_retrieval.indexing.l0_index import L0Index
    from kb_retrieval.indexing.milvus import connect, ensure_collection

    settings = _settings(args)
    client = connect(settings)
    ensure_collection(client, settings, create=False)
    rows = int(client.get_collection_stats(settings.collection).get("row_count", 0))
    l0 = L0Index.load(settings.l0_index_path())
    categories: dict[str, int] = {}
    for entry in l0.documents.values():
        key = entry.category or "(none)"
        categories[key] = categories.get(key, 0) + 1
    stats = {
        "collection": settings.collection,
        "milvus": "server" if settings.is_milvus_server() else "lite",
        "chunks": rows,
        "documents": len(l0.documents),
        "knowledge_bases": len({e.kb for e in l0.documents.values()}),
        "categories": dict(sorted(categories.items())),
        "metric": settings.metric,
        "dim": settings.dim,
    }
    if args.json:
        print(json.dumps(stats, sort_keys=True))
    else:
        for key, value in stats.items():
            print(f"{key}: {value}")
    return 0


def cmd_lookup(args: argparse.Namespace) -> int:
    from kb_retrieval.engine import KnowledgeLookup, agent_text

    if args.query is None and args.queries is None:
        raise CliError("give a QUERY or --queries FILE.jsonl")
    queries = [args.query] if args.queries is None else _read_queries(Path(args.queries))
    lookup = KnowledgeLookup(_settings(args))
    for query in queries:
        result = lookup.lookup(query)
        if args.json or args.queries is not None:
            print(json.dumps(result.to_json_dict(), ensure_ascii=False))
        else:
            print(agent_text(result))
    return 0


def _read_queries(path: Path) -> list[str]:
    if not path.is_file():
        raise CliError(f"queries file not found: {path}")
    queries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CliError(f"{path}:{number}: not valid JSON ({exc.msg})") from exc
        if not isinstance(record, dict) or not isinstance(record.get("query"), str):
            raise CliError(f"{path}:{number}: field 'query' missing or not a string")
        queries.append(record["query"])
    return queries


def cmd_fixtures_record(args: argparse.Namespace) -> int:
    from kb_retrieval.evaluation.recorder import record_fixtures

    count = record_fixtures(Path(args.golden), Path(args.out), _settings(args))
    print(f"recorded {count} fixtures in {args.out}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.indexing.ingest import ingest

    settings = _settings(args)
    print(f"== ingesting the sample knowledge base into Milvus Lite ({settings.resolved_milvus_uri()})")
    summary = ingest([SAMPLE_KB], settings, progress=sys.stderr.isatty())
    print(
        f"   {summary.documents} documents, {summary.chunks_added + summary.chunks_updated + summary.chunks_unchanged} "
        f"chunks ({summary.chunks_embedded} embedded this run) in {summary.seconds}s"
    )
    lookup = KnowledgeLookup(settings)
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
            print(f"       hit reasons: {', '.join(block.hit_reasons)}")
    print(f"\n{lookup.traces.count()} tool_invocation rows in {settings.resolved_trace_db_url()}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from kb_retrieval.bench.run import run_bench

    shared = Path(args.shared)
    if not (shared / "golden").is_dir() or not (shared / "corpora").is_dir():
        raise CliError(f"shared corpora and golden sets not found under {shared} (--shared)")
    parts = {"quality", "speed"} if args.only is None else {args.only}
    readme = Path("README.md") if Path("README.md").is_file() else None
    run_bench(shared, Path(args.out), Path(args.state_dir or ".kb-state/bench"), parts=parts, readme=readme)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from sidecar.compare import run_compare_command

    return run_compare_command(args)


def cmd_eval(args: argparse.Namespace) -> int:
    from kb_retrieval.evaluation.runner import run_eval_command

    return run_eval_command(args)


# --- parser ----------------------------------------------------------------------------------------------


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; ``command`` (the subcommand about to run) lets rarely used ones load their options lazily."""
    parser = argparse.ArgumentParser(prog="kb-retrieval", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("ingest", help="index Markdown knowledge-base folders into Milvus (incremental)")
    p.add_argument("kb_dirs", nargs="+", metavar="KB_DIR")
    _common(p)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("stats", help="what the collection and the L0 index hold")
    _common(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("lookup", help="run lookup_knowledge for a query (or a JSONL file of queries)")
    p.add_argument("query", nargs="?", metavar="QUERY")
    p.add_argument("--queries", metavar="FILE.jsonl", help="one JSON object with a 'query' field per line")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    _lookup_flags(p)
    p.set_defaults(func=cmd_lookup)

    p = sub.add_parser("fixtures", help="fixtures for the offline evaluator")
    fsub = p.add_subparsers(dest="fixtures_command", required=True)
    r = fsub.add_parser("record", help="run the live pipeline once per golden case and write one fixture each")
    r.add_argument("--golden", required=True, metavar="FILE.jsonl")
    r.add_argument("--out", required=True, metavar="DIR")
    _lookup_flags(r)
    r.set_defaults(func=cmd_fixtures_record)

    p = sub.add_parser("eval", help="offline evaluation of golden cases against recorded fixtures (no services)")
    from kb_retrieval.evaluation.runner import add_eval_arguments

    add_eval_arguments(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("compare", help="the current path against the stock sidecar retriever, per golden case")
    if command == "compare":  # only then is the sidecar imported: `eval` and `lookup` never load it
        from sidecar.compare import add_compare_arguments

        add_compare_arguments(p)
        _lookup_flags(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("bench", help="quality against the stock retrievers on ../shared, and speed (dev extra)")
    p.add_argument("--shared", default="../shared", help="folder holding corpora/ and golden/ (default ../shared)")
    p.add_argument("--out", default="reports/bench", help="report folder (default reports/bench)")
    p.add_argument("--state-dir", help="where the benchmark indexes live (default .kb-state/bench)")
    p.add_argument("--only", choices=["quality", "speed"], help="run one part")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("demo", help="ingest the bundled sample KB into Milvus Lite and answer a few questions")
    p.add_argument("questions", nargs="*", metavar="QUESTION")
    _lookup_flags(p)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(next((a for a in argv if not a.startswith("-")), None)).parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if _is_user_error(exc):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        raise


def _is_user_error(exc: Exception) -> bool:
    from pydantic import ValidationError

    from kb_retrieval.knowledge.loader import KnowledgeBaseError

    names = {
        "MilvusUnavailableError",
        "MilvusLiteLockedError",
        "SchemaMismatchError",
        "EmptyQueryError",
        "GoldenCaseError",
        "FixtureError",
    }
    return isinstance(exc, KnowledgeBaseError | ValidationError) or type(exc).__name__ in names


if __name__ == "__main__":
    sys.exit(main())
