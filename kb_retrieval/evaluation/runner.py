"""Run the offline evaluation: golden file + fixtures directory -> report, from Python or the command line.

Python::

    from kb_retrieval.evaluation import evaluate, write_report
    report = evaluate("golden/sample.jsonl", "golden/fixtures")
    write_report(report, "reports/retrieval-eval")  # reports/retrieval-eval/sample.{json,md}

Command line (``kb-retrieval eval`` or, standalone, ``python -m kb_retrieval.evaluation``)::

    kb-retrieval eval --golden golden/sample.jsonl --fixtures golden/fixtures --fail-under recall@5=0.8

Exit codes: 0 evaluated and every threshold met; 1 a ``--fail-under`` threshold was not met; 2 bad
arguments or inputs (unknown metric, malformed golden line or fixture, missing file).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from kb_retrieval.cli_args import positive_int
from kb_retrieval.evaluation.errors import EvaluationInputError
from kb_retrieval.evaluation.fixtures import load_fixture
from kb_retrieval.evaluation.golden import load_golden
from kb_retrieval.evaluation.hit_levels import classify_case
from kb_retrieval.evaluation.metrics import (
    DEFAULT_KS,
    compute_metrics,
    failed_thresholds,
    normalise_ks,
    score_names,
)
from kb_retrieval.evaluation.report import (
    DEFAULT_OUT_DIR,
    EvalReport,
    render_summary_text,
    write_report,
)
from kb_retrieval.reporting import display_path, report_name_argument


def evaluate(golden_path: str | Path, fixtures_dir: str | Path, ks: Iterable[int] = DEFAULT_KS) -> EvalReport:
    """Evaluate every golden case against its fixture.

    Args:
        golden_path: Golden JSON Lines file.
        fixtures_dir: Directory of fixture files, named by
            :func:`~kb_retrieval.evaluation.fixtures.fixture_filename`.
        ks: Cut-offs for ``recall@K``.

    Returns:
        The report (cases in golden-file order).

    Raises:
        GoldenCaseError: A golden line is malformed.
        FixtureError: A fixture file is malformed.
        FileNotFoundError: The golden file or the fixtures directory does not exist.
        ValueError: A K is not a positive integer.
    """
    ks = normalise_ks(ks)
    if not Path(fixtures_dir).is_dir():
        raise FileNotFoundError(f"fixtures directory not found: {fixtures_dir}")
    cases = load_golden(golden_path)
    results = [classify_case(case, load_fixture(fixtures_dir, case.case_id)) for case in cases]
    overall, by_scenario = compute_metrics(cases, results, ks)
    return EvalReport(
        golden=display_path(golden_path),
        fixtures=display_path(fixtures_dir),
        ks=list(ks),
        overall=overall,
        by_scenario=by_scenario,
        cases=results,
    )


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``eval`` options to a parser (or sub-parser).

    Args:
        parser: The parser to extend; pair it with :func:`run_eval_command`.
    """
    parser.add_argument("--golden", required=True, metavar="FILE", help="golden cases, JSON Lines")
    parser.add_argument("--fixtures", required=True, metavar="DIR", help="directory of recorded fixtures")
    parser.add_argument(
        "--k",
        dest="ks",
        type=positive_int,
        nargs="+",
        action="extend",
        metavar="K",
        help=f"cut-offs for recall@K (default: {' '.join(map(str, DEFAULT_KS))})",
    )
    parser.add_argument(
        "--out", default=DEFAULT_OUT_DIR, metavar="DIR", help=f"report directory (default: {DEFAULT_OUT_DIR})"
    )
    parser.add_argument(
        "--name",
        type=report_name_argument,
        help="report base name: writes NAME.json and NAME.md (default: the golden file's name without .jsonl)",
    )
    parser.add_argument(
        "--fail-under",
        dest="fail_under",
        type=_threshold,
        nargs="+",
        action="extend",
        metavar="METRIC=VALUE",
        help="exit 1 when an overall rate is below VALUE, e.g. recall@5=0.8 mrr@10=0.5 strong_rate=0.5 "
        f"(rates: recall@K, {', '.join(score_names([]))})",
    )


def run_eval_command(args: argparse.Namespace) -> int:
    """Run ``eval`` with parsed arguments: evaluate, write both reports, print a summary, check thresholds.

    Args:
        args: Arguments parsed by a parser set up with :func:`add_eval_arguments`.

    Returns:
        The exit code: 0 ok, 1 a threshold failed, 2 bad arguments or inputs.
    """
    ks = normalise_ks(args.ks or DEFAULT_KS)
    thresholds: list[tuple[str, float]] = args.fail_under or []
    known = score_names(ks)
    unknown = [name for name, _ in thresholds if name not in known]
    if unknown:
        _error(f"unknown metric {unknown[0]!r} in --fail-under; known metrics: {', '.join(known)}")
        return 2

    try:
        report = evaluate(args.golden, args.fixtures, ks)
    except (EvaluationInputError, OSError) as error:
        _error(str(error))
        return 2
    files = write_report(report, args.out, args.name)

    print(render_summary_text(report))
    print(f"\n{files.summary()}")
    if report.overall.not_run:
        print(
            f"warning: {report.overall.not_run} case(s) not run (missing or stale fixture); "
            "rates exclude them, see fixture_coverage",
            file=sys.stderr,
        )

    failures = failed_thresholds(report.overall, thresholds)
    for failure in failures:
        print(f"FAILED --fail-under: {failure}")
    if thresholds and not failures:
        print(f"passed --fail-under: {', '.join(f'{name}>={value:g}' for name, value in thresholds)}")
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m kb_retrieval.evaluation --golden FILE --fixtures DIR``."""
    parser = argparse.ArgumentParser(
        prog="python -m kb_retrieval.evaluation",
        description="Offline retrieval evaluation of golden cases against recorded lookup fixtures.",
    )
    add_eval_arguments(parser)
    return run_eval_command(parser.parse_args(argv))


def _threshold(text: str) -> tuple[str, float]:
    name, separator, value_text = text.partition("=")
    try:
        value = float(value_text)
    except ValueError:
        value = math.nan
    if not separator or not name.strip() or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected METRIC=VALUE with a number, e.g. recall@5=0.8, got {text!r}")
    return name.strip().lower(), value


def _error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
