"""``kb-retrieval ingest``: index knowledge-base folders into Milvus (incremental), or take one out."""

from __future__ import annotations

import argparse
import sys

from kb_retrieval.cli_args import add_location_arguments, settings_from_args
from kb_retrieval.knowledge.loader import INGESTED_SUFFIXES


def run(args: argparse.Namespace) -> int:
    """Ingest ``args.kb_dirs`` (after removing ``args.remove_root``); 1 when no document was ingested."""
    # This process is the CLI's own: LlamaIndex's package __init__ files (its indices, chat engines...; ~1-2 s of
    # imports) run only if something asks for them, which ingest never does (kb_retrieval.deferred_imports).
    from kb_retrieval.deferred_imports import defer_package_inits

    defer_package_inits()
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


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], command: str | None) -> None:
    """The ``ingest`` command's options."""
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
    p.set_defaults(func=run)
