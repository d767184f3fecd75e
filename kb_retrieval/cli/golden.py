"""``kb-retrieval golden draft``: draft golden cases from the trace store's queries."""

from __future__ import annotations

import argparse

from kb_retrieval.cli.common import require_knowledge_base


def run(args: argparse.Namespace) -> int:
    """Write the draft golden cases."""
    from kb_retrieval.evaluation.traffic_command import run_golden_draft

    return run_golden_draft(args, require_knowledge_base)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], command: str | None) -> None:
    """The ``golden`` command's options."""
    p = sub.add_parser("golden", help="golden cases: draft them from the trace store's queries (golden draft)")
    if command == "golden":
        from kb_retrieval.evaluation.traffic_command import add_golden_arguments

        add_golden_arguments(p)
    p.set_defaults(func=run)
