"""``kb-retrieval eval``: offline evaluation of golden cases against recorded fixtures (no services): the command
is :mod:`kb_retrieval.evaluation.runner`'s, its options loaded only when it runs."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    """Run the offline evaluation."""
    from kb_retrieval.evaluation.runner import run_eval_command

    return run_eval_command(args)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], command: str | None) -> None:
    """The ``eval`` command's options."""
    p = sub.add_parser("eval", help="offline evaluation of golden cases against recorded fixtures (no services)")
    if command in (None, "eval"):  # its options load with it; `lookup --server` stays a light process
        from kb_retrieval.evaluation.runner import add_eval_arguments

        add_eval_arguments(p)
    p.set_defaults(func=run)
