"""Errors raised on bad evaluation inputs, and the JSON parser that raises them naming file, line and field."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)


class EvaluationInputError(ValueError):
    """A golden file or fixture cannot be used as it is."""


class GoldenCaseError(EvaluationInputError):
    """A golden file line is malformed, e.g. ``golden.jsonl:7: field 'query': must not be blank``."""


class FixtureError(EvaluationInputError):
    """A fixture file is malformed or does not belong to the case it is named after."""


#: Nesting of JSON arrays and objects at most (a fixture nests a handful of levels; Python's decoder fails near 1,000).
MAX_JSON_DEPTH = 200


#: A location that already names its line (``golden.jsonl:7``).
_NAMES_LINE = re.compile(r":\d+$")


def nesting_depth(text: str) -> tuple[int, int, int]:
    """The deepest nesting of arrays and objects in JSON ``text`` (brackets inside strings not counted), and the
    1-based line and column where it first passes :data:`MAX_JSON_DEPTH` (else where it peaks).

    Example:
        >>> nesting_depth('{"a": [1, "]]"]}')
        (2, 1, 7)
    """
    depth = deepest = 0
    line = deepest_line = deepest_column = 1
    line_start = 0
    in_string = escaped = False
    for index, char in enumerate(text):
        if char == "\n":
            line += 1
            line_start = index + 1
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest, deepest_line, deepest_column = depth, line, index - line_start + 1
                if depth > MAX_JSON_DEPTH:
                    break
        elif char in "]}":
            depth -= 1
    return deepest, deepest_line, deepest_column


def read_text(path: Path, error_type: type[EvaluationInputError]) -> str:
    """The UTF-8 text of an evaluation input (a BOM is dropped); bytes that are not UTF-8 raise ``error_type``
    naming the file and the line, e.g. ``golden.jsonl:1: not UTF-8 text (byte 0xff at offset 0; UTF-16?)``."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        utf16 = " UTF-16?" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise error_type(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start};{utf16} "
            "save it as UTF-8)"
        ) from None


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
    depth, line, column = nesting_depth(text)
    if depth > MAX_JSON_DEPTH:  # the decoder recurses per level: a RecursionError, not an error message
        position = f"column {column}" if _NAMES_LINE.search(where) else f"line {line}, column {column}"
        raise error_type(f"{where}: invalid JSON: nested deeper than {MAX_JSON_DEPTH} levels ({position})")
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
