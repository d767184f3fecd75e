"""``kb-retrieval lookup``: a query (or a JSON Lines file of them) looked up in process, or through the running
``kb-retrieval serve`` that holds the state dir (then nothing heavy is imported here)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from kb_retrieval.cli.common import require_knowledge_base, set_lookup_environment, start_up_gc
from kb_retrieval.cli_args import CliError, add_lookup_arguments, register_secret, settings_from_args
from kb_retrieval.config import KBSettings
from kb_retrieval.output import result_json

STDIN = "-"
#: Where ``lookup`` sends its queries when set (``--server`` overrides it), and the token it sends with them.
SERVER_URL_ENV = "KB_SERVER_URL"
SERVER_TOKEN_ENV = "KB_SERVER_TOKEN"


@dataclass(frozen=True)
class QueryCase:
    """One query to look up, and where it came from (its case id, else file:line)."""

    case_id: str
    query: str


def run(args: argparse.Namespace) -> int:
    """Look up the query or the ``--queries`` file: every query is checked before anything is printed."""
    if args.query is not None and args.queries is not None:
        raise CliError("give a QUERY or --queries FILE.jsonl, not both")
    if args.query is None and args.queries is None:
        raise CliError("give a QUERY (or - to read it from stdin) or --queries FILE.jsonl")
    settings = settings_from_args(args)
    # Every query is checked before anything is looked up or printed.
    if args.queries is not None:
        cases = read_queries(args.queries, settings.retrieval.max_query_chars)
    else:
        query = sys.stdin.read().strip() if args.query == STDIN else args.query  # no trailing newline in traces
        _check_query(query, "stdin" if args.query == STDIN else "QUERY", settings.retrieval.max_query_chars)
        cases = [QueryCase("", query)]
    server_url = args.server or os.environ.get(SERVER_URL_ENV) or _serving(settings)
    if server_url:  # a running `kb-retrieval serve` answers: nothing heavy is imported here
        return _lookup_through_server(server_url, cases, args)
    require_knowledge_base(settings)

    set_lookup_environment()
    with start_up_gc():
        # This process is the CLI's: LlamaIndex's package __init__ files (its indices, chat engines...) run only if
        # something asks for them, which a lookup through the memory plan never does (kb_retrieval.deferred_imports).
        from kb_retrieval.deferred_imports import defer_package_inits, keep_pandas_out

        defer_package_inits()
        keep_pandas_out()
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


def _serving(settings: KBSettings) -> str | None:
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


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], command: str | None) -> None:
    """The ``lookup`` command's options."""
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
    p.set_defaults(func=run)
