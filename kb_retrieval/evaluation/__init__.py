"""Offline retrieval evaluation: golden cases scored against recorded lookup fixtures.

Runs with no Milvus, embedding model, database or network: nothing here imports the runtime pipeline.
The pieces, in the order data flows:

- :mod:`~kb_retrieval.evaluation.golden`: golden cases (JSON Lines) and their loader.
- :mod:`~kb_retrieval.evaluation.fixtures`: the fixture contract the recorder writes and the evaluator reads.
- :mod:`~kb_retrieval.evaluation.hit_levels`: per-case verdict (strong / medium / miss, no-answer, not run).
- :mod:`~kb_retrieval.evaluation.metrics`: recall@K, MRR@10, nDCG@10, overall and per scenario.
- :mod:`~kb_retrieval.evaluation.report`: the JSON + Markdown report and its charts.
- :mod:`~kb_retrieval.evaluation.runner`: :func:`evaluate` and the ``eval`` command line.

Example:
    >>> from kb_retrieval.evaluation import evaluate, write_report
    >>> report = evaluate("golden/sample.jsonl", "golden/fixtures")  # doctest: +SKIP
    >>> write_report(report, "reports/retrieval-eval")  # sample.json, sample.md  # doctest: +SKIP
"""

from __future__ import annotations

from kb_retrieval.evaluation.errors import EvaluationInputError, FixtureError, GoldenCaseError
from kb_retrieval.evaluation.fixtures import (
    Fixture,
    FixtureCandidate,
    fixture_filename,
    load_fixture,
    write_fixture,
)
from kb_retrieval.evaluation.golden import ExpectedBreadcrumb, GoldenCase, load_golden
from kb_retrieval.evaluation.hit_levels import CaseResult, CaseStatus, classify_case
from kb_retrieval.evaluation.metrics import DEFAULT_KS, MetricSet, compute_metrics, score_names
from kb_retrieval.evaluation.report import EvalReport, render_markdown, write_report
from kb_retrieval.evaluation.runner import add_eval_arguments, evaluate, main, run_eval_command

__all__ = [
    "DEFAULT_KS",
    "CaseResult",
    "CaseStatus",
    "EvalReport",
    "EvaluationInputError",
    "ExpectedBreadcrumb",
    "Fixture",
    "FixtureCandidate",
    "FixtureError",
    "GoldenCase",
    "GoldenCaseError",
    "MetricSet",
    "add_eval_arguments",
    "classify_case",
    "compute_metrics",
    "evaluate",
    "fixture_filename",
    "load_fixture",
    "load_golden",
    "main",
    "render_markdown",
    "run_eval_command",
    "score_names",
    "write_fixture",
    "write_report",
]
