"""``kb-retrieval compare``: the current path against the stock sidecar retriever per golden case (the sidecar's
command), or (``--from-traces``) the trace store's queries through the current settings and an alternative."""

from __future__ import annotations

import argparse
from importlib import import_module

from kb_retrieval.cli.common import require_knowledge_base
from kb_retrieval.cli_args import CliError, add_lookup_arguments

#: The ``compare`` command lives with the sidecar; loaded by name, so the core never imports the sidecar package.
COMPARE_MODULE = "sidecar.compare"


def run(args: argparse.Namespace) -> int:
    """Compare on a golden set (the sidecar) or on the trace store's queries."""
    if args.from_traces:  # real traffic instead of a golden set: no sidecar needed
        from kb_retrieval.evaluation.traffic_command import run_compare_traffic

        return run_compare_traffic(args, require_knowledge_base)
    if not args.golden:
        raise CliError("compare needs --golden FILE.jsonl, or --from-traces to replay the trace store's queries")
    return int(import_module(COMPARE_MODULE).run_compare_command(args))


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], command: str | None) -> None:
    """The ``compare`` command's options."""
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
    p.set_defaults(func=run)
