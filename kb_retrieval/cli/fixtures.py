"""``kb-retrieval fixtures record``: run the live pipeline once per golden case and write one fixture each, for
the offline evaluator."""

from __future__ import annotations

import argparse
from pathlib import Path

from kb_retrieval.cli_args import add_lookup_arguments, settings_from_args
from kb_retrieval.reporting import LOCAL_REPORTS_DIR


def run(args: argparse.Namespace) -> int:
    """Record one fixture per golden case of ``args.golden``."""
    from kb_retrieval.evaluation.recorder import record_fixtures

    out = Path(args.out) if args.out else Path(LOCAL_REPORTS_DIR, "fixtures", Path(args.golden).stem)
    count = record_fixtures(Path(args.golden), out, settings_from_args(args), progress=True)
    print(f"recorded {count} fixtures in {out.as_posix()}")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], command: str | None) -> None:
    """The ``fixtures`` command's options."""
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
    r.set_defaults(func=run)
