"""The ``kb-retrieval`` argument parser: the global options, and each command's own options from its module."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kb_retrieval.cli import bench, compare, demo, evaluate, fixtures, golden, ingest, lookup, serve, stats, traces

#: The first line of ``kb-retrieval --help``.
DESCRIPTION = (
    "kb-retrieval: ingest, stats, lookup, serve, traces, fixtures record, eval, compare, golden draft, bench, demo."
)
#: The commands in the order ``--help`` lists them (``evaluate`` is ``eval``'s module); each module has
#: ``add_parser(sub, command)`` and ``run(args)``.
COMMANDS = (ingest, stats, lookup, serve, traces, fixtures, evaluate, compare, golden, bench, demo)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; ``command`` (the subcommand about to run) lets rarely used ones load their options lazily."""
    parser = argparse.ArgumentParser(prog="kb-retrieval", description=DESCRIPTION)
    parser.add_argument("-V", "--version", action=_VersionAction)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub, command)
    return parser


class _VersionAction(argparse.Action):
    """``--version``: the installed package's metadata is read when the option is given, not each time the parser
    is built (finding a distribution scans every folder on ``sys.path``)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show program's version number and exit")
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        parser._print_message(f"{parser.prog} {_version()}\n", sys.stdout)
        parser.exit()


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("kb-retrieval")
    except metadata.PackageNotFoundError:  # run from a source tree without installing
        from kb_retrieval import __version__

        return __version__
