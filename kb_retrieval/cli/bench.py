"""``kb-retrieval bench``: quality against the stock retrievers on ``../shared``, and speed (the ``bench`` extra)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kb_retrieval.bench import PARTS
from kb_retrieval.cli_args import CliError, require_extra

#: Modules of the ``bench`` extra that ``kb-retrieval bench`` needs (the runtime install lacks them).
BENCH_MODULES = ("matplotlib", "llama_index.retrievers.bm25", "psutil")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark parts asked for and write the report."""
    require_extra("bench", BENCH_MODULES, "bench")
    from kb_retrieval.bench.run import run_bench

    shared = Path(args.shared)
    if not (shared / "golden").is_dir() or not (shared / "corpora").is_dir():
        raise CliError(f"shared corpora and golden sets not found under {shared} (--shared)")
    parts = set(PARTS) if args.only is None else {args.only}
    readme = Path("README.md") if Path("README.md").is_file() else None
    run_bench(shared, Path(args.out), Path(args.state_dir or ".kb-state/bench"), parts=parts, readme=readme)
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], command: str | None) -> None:
    """The ``bench`` command's options."""
    p = sub.add_parser("bench", help="quality against the stock retrievers on ../shared, and speed ('bench' extra)")
    p.add_argument("--shared", default="../shared", help="folder holding corpora/ and golden/ (default ../shared)")
    p.add_argument("--out", default="reports/bench", help="report folder (default reports/bench)")
    p.add_argument("--state-dir", help="where the benchmark indexes live (default .kb-state/bench)")
    p.add_argument(
        "--only",
        choices=PARTS,
        help="run one part and keep the others' figures (scale: lookup latency at 1k-100k chunks on Milvus Lite "
        "and on a Milvus server, KB_BENCH_MILVUS_URI or one the bench starts; serve: kb-retrieval serve at 1/4/16 "
        "clients with 1 and N workers)",
    )
    p.set_defaults(func=run)
