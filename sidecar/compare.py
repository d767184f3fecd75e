"""``kb-retrieval compare``: the current path and the sidecar side by side over a golden set (the command line).

The comparison itself is :mod:`sidecar.comparison`; the report files are :mod:`sidecar.report`. This module only
adds the options and runs the command, and imports nothing heavy until the command runs, so building the CLI's
parser costs nothing.

Command line (wired by ``kb_retrieval.cli``, which adds ``--state-dir/--uri/--collection/--mode``)::

    kb-retrieval compare --golden golden/sample-kb.jsonl [--out reports/local/compare] [--name NAME] [--k 5]

Exit codes: 0 report written (whatever the sidecar's status); 2 bad arguments or inputs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kb_retrieval.cli_args import positive_int
from kb_retrieval.reporting import LOCAL_REPORTS_DIR, golden_report_name, report_name_argument
from sidecar.models import DEFAULT_K

#: Default output directory (untracked; the committed baseline is reports/compare, written by ``make baselines``).
DEFAULT_OUT_DIR = f"{LOCAL_REPORTS_DIR}/compare"


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``compare`` options (not the common ``--state-dir/--uri/--collection/--mode``, which the CLI adds).

    Args:
        parser: The parser to extend; pair it with :func:`run_compare_command`.
    """
    parser.add_argument("--golden", metavar="FILE", help="golden cases, JSON Lines (or --from-traces)")
    parser.add_argument(
        "--out", default=DEFAULT_OUT_DIR, metavar="DIR", help=f"report directory (default: {DEFAULT_OUT_DIR})"
    )
    parser.add_argument(
        "--name",
        type=report_name_argument,
        help="report base name: writes NAME.json and NAME.md (default: the golden file's name without .jsonl)",
    )
    parser.add_argument(
        "--k",
        type=positive_int,
        default=DEFAULT_K,
        metavar="K",
        help=f"documents compared per path (default: {DEFAULT_K})",
    )


def run_compare_command(args: argparse.Namespace) -> int:
    """Run ``compare`` with parsed arguments: one lookup per case with the sidecar on, then both reports.

    The sidecar is switched on for this command's own lookups (running the comparison is the opt-in); its status
    per case is in the report, and a sidecar that cannot run is not an error.

    Returns:
        0 when the report was written; 2 for bad inputs (missing or malformed golden file).
    """
    from kb_retrieval.cli_args import settings_from_args
    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.evaluation.errors import EvaluationInputError
    from kb_retrieval.evaluation.golden import load_golden
    from sidecar.comparison import run_comparison
    from sidecar.report import render_summary_text, write_compare_report

    golden = Path(args.golden)
    try:
        load_golden(golden)  # fail on bad input before loading the model and connecting
    except (EvaluationInputError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    settings = settings_from_args(args, sidecar_enabled=True)
    lookup = KnowledgeLookup(settings)
    try:
        report = run_comparison(golden, lookup, args.k, progress=True)
    finally:
        lookup.close()
    files = write_compare_report(report, args.out, args.name or golden_report_name(golden))
    print(render_summary_text(report))
    print(f"\n{files.summary()}")
    return 0
