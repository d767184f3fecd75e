"""Golden retrieval cases: the fixed questions the offline evaluator scores fixtures against.

A golden file is JSON Lines, one case per line, in the project's golden-case format::

    {"case_id": "redis-001", "scenario": "aiops", "query": "Redis memory usage high",
     "expected_docs": ["redis/memory.md"], "acceptable_docs": [], "expected_keywords": ["maxmemory"],
     "expected_breadcrumbs": ["Mitigation"]}

An expected breadcrumb is heading text, or an object tying the heading to one document (as the
Prometheus FAQ set writes them)::

    {"doc": "docs/operating/integrations.md", "anchor": "remote-endpoints-and-storage",
     "heading": "Remote Endpoints and Storage"}

A case with neither expected nor acceptable documents is a *no-answer* case: the knowledge base holds no
answer, so the right lookup result is ``found=false`` / no evidence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from kb_retrieval.evaluation.errors import GoldenCaseError, parse_json_object, read_text

#: Relevance grade of a document listed in ``expected_docs`` (used for nDCG).
EXPECTED_RELEVANCE = 2
#: Relevance grade of a document listed in ``acceptable_docs``.
ACCEPTABLE_RELEVANCE = 1


class ExpectedBreadcrumb(BaseModel):
    """Heading text a retrieved breadcrumb (or title) should contain, optionally in one given document.

    Example:
        >>> ExpectedBreadcrumb(heading="Batch jobs", doc="docs/practices/instrumentation.md").describe()
        "'Batch jobs' in docs/practices/instrumentation.md"
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    heading: str
    """The text to find (case-insensitive substring)."""
    doc: str | None = None
    """When set, only candidates of this document can cover the breadcrumb."""
    anchor: str | None = None
    """The heading's URL fragment, kept for reference; not used for matching."""

    @field_validator("heading")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        # A blank heading would match every breadcrumb and make coverage meaningless.
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    def describe(self) -> str:
        """Short text for failed checks: ``'Heading'`` or ``'Heading' in doc``."""
        return f"{self.heading!r} in {self.doc}" if self.doc else repr(self.heading)


class GoldenCase(BaseModel):
    """One golden retrieval case.

    Extra fields (``alert``, ``provenance``, ``tags``, ...) are context only: they are kept on the model
    (``case.model_extra``) but never scored.

    Example:
        >>> case = GoldenCase(case_id="c1", scenario="chat", query="What is Prometheus?",
        ...                   expected_docs=["docs/overview.md"], provenance="FAQ")
        >>> case.relevance()
        {'docs/overview.md': 2}
        >>> case.is_no_answer
        False
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    case_id: str
    scenario: str
    """Retrieval scenario type, e.g. ``chat`` (knowledge question) or ``aiops`` (alert diagnosis)."""
    query: str
    expected_docs: list[str] = []
    """Source ids of the documents that answer the query (relevance 2)."""
    acceptable_docs: list[str] = []
    """Other documents that also count as a hit (relevance 1)."""
    expected_keywords: list[str] = []
    """Words the returned evidence should contain (case-insensitive)."""
    expected_breadcrumbs: list[ExpectedBreadcrumb] = []
    """Headings the returned evidence's breadcrumb should contain; a plain string is a heading."""

    @field_validator("case_id", "scenario", "query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @field_validator("expected_breadcrumbs", mode="before")
    @classmethod
    def _heading_strings(cls, values: Any) -> Any:
        if isinstance(values, list):
            return [{"heading": value} if isinstance(value, str) else value for value in values]
        return values

    @field_validator("expected_docs", "acceptable_docs", "expected_keywords")
    @classmethod
    def _no_blank_items(cls, values: list[str]) -> list[str]:
        # A blank keyword would match everything and make coverage meaningless.
        for index, value in enumerate(values):
            if not value.strip():
                raise ValueError(f"item {index} must not be blank")
        return values

    @model_validator(mode="after")
    def _expected_and_acceptable_disjoint(self) -> GoldenCase:
        both = sorted(set(self.expected_docs) & set(self.acceptable_docs))
        if both:
            raise ValueError(f"{both[0]!r} is listed in both expected_docs and acceptable_docs")
        return self

    @property
    def is_no_answer(self) -> bool:
        """True when the case lists no expected and no acceptable documents."""
        return not self.expected_docs and not self.acceptable_docs

    def relevance(self) -> dict[str, int]:
        """Graded relevance of every relevant document: expected 2, acceptable 1."""
        grades = dict.fromkeys(self.acceptable_docs, ACCEPTABLE_RELEVANCE)
        grades.update(dict.fromkeys(self.expected_docs, EXPECTED_RELEVANCE))
        return grades


def load_golden(path: str | Path) -> list[GoldenCase]:
    """Read a golden JSON Lines file, in file order.

    Blank lines are skipped. Every problem is reported with the file, the 1-based line number and the
    field, e.g. ``golden.jsonl:7: field 'query': must not be blank``.

    Args:
        path: The golden file.

    Returns:
        The cases in file order.

    Raises:
        GoldenCaseError: The file is not UTF-8 or holds no case, a line is not a JSON object, a field is missing
            or invalid, or a case id repeats.
        OSError: The file cannot be read.
    """
    path = Path(path)
    cases: list[GoldenCase] = []
    first_line_of: dict[str, int] = {}
    text = read_text(path, GoldenCaseError)
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # as open() reads lines; not splitlines():
    for line_number, line in enumerate(lines, start=1):  # JSON strings may hold U+2028 unescaped
        if not line.strip():
            continue
        where = f"{path}:{line_number}"
        case = parse_json_object(line, GoldenCase, where, GoldenCaseError)
        if case.case_id in first_line_of:
            raise GoldenCaseError(
                f"{where}: field 'case_id': duplicate case_id {case.case_id!r} "
                f"(first defined on line {first_line_of[case.case_id]})"
            )
        first_line_of[case.case_id] = line_number
        cases.append(case)
    if not cases:  # scoring nothing would pass every threshold
        raise GoldenCaseError(f"{path}: no golden case in it (the file is empty)")
    return cases
