"""Errors raised on bad evaluation inputs; each message names the file (and line or field) at fault."""

from __future__ import annotations

from pydantic import ValidationError


class EvaluationInputError(ValueError):
    """A golden file or fixture cannot be used as it is."""


class GoldenCaseError(EvaluationInputError):
    """A golden file line is malformed, e.g. ``golden.jsonl:7: field 'query': must not be blank``."""


class FixtureError(EvaluationInputError):
    """A fixture file is malformed or does not belong to the case it is named after."""


def describe_validation_error(error: ValidationError) -> str:
    """Render a pydantic error on one line, naming every failing field.

    Args:
        error: The validation error.

    Returns:
        For example ``field 'query': must not be blank; field 'expected_docs.0': Input should be a valid
        string``.
    """
    parts = []
    for detail in error.errors():
        field = ".".join(str(part) for part in detail["loc"])
        message = "is required" if detail["type"] == "missing" else detail["msg"].removeprefix("Value error, ")
        parts.append(f"field {field!r}: {message}" if field else message)
    return "; ".join(parts)
