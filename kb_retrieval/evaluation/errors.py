"""Errors raised on bad evaluation inputs, and the JSON parser that raises them naming file, line and field."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)


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


def parse_json_object(text: str, model: type[Model], where: str, error_type: type[EvaluationInputError]) -> Model:
    """Parse one JSON object into ``model``; every problem raises ``error_type`` prefixed with ``where``.

    Args:
        text: The JSON text (one golden line, or a whole fixture file).
        model: The pydantic model to validate against.
        where: The location to name, e.g. ``golden.jsonl:7`` or ``fixtures/c1.json``.
        error_type: The error to raise.

    Returns:
        The validated model.
    """
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as error:
        position = f"column {error.colno}" if "\n" not in text.strip() else f"line {error.lineno}"
        raise error_type(f"{where}: invalid JSON: {error.msg} ({position})") from None
    if not isinstance(data, dict):
        raise error_type(f"{where}: expected a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise error_type(f"{where}: {describe_validation_error(error)}") from None
