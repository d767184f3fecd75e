"""The configuration reference as Markdown tables, generated from the settings models (variable, default, meaning).

:class:`~kb_retrieval.config.KBSettings` documents every setting once, in its field's description; the tables in
docs/reference.md (the groups, the ungrouped settings) and docs/configuration.md (one table per group, the scoring
group) are made from those, so they cannot drift apart (a test regenerates them and compares).

Regenerate the marked sections in place::

    python -m kb_retrieval.settings_table docs/reference.md docs/configuration.md

Example:
    >>> group_rows("storage")[0][:3]
    ('`KB_STORAGE__STATE_DIR`', '`state_dir`', '`.kb-state`')
"""

from __future__ import annotations

import enum
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from kb_retrieval.config import KBSettings
from kb_retrieval.reporting import markdown_table, replace_marked_section
from kb_retrieval.scoring_profile import ScoringProfile
from kb_retrieval.settings import GROUPS, short_name

#: The markers around each generated table, and the file each belongs in.
SECTIONS = {
    "settings": ("<!-- settings:start -->", "<!-- settings:end -->"),
    "groups": ("<!-- groups:start -->", "<!-- groups:end -->"),
    "scoring": ("<!-- scoring:start -->", "<!-- scoring:end -->"),
}
HEADER = ["variable", "default", "meaning"]
#: The scoring profile's table: its weights are no environment variables (kb_retrieval.scoring_profile).
PROFILE_HEADER = ["weight", "built-in value", "meaning"]
#: A group's table: its full variable, the flat short form (a keyword, ``KB_`` + it upper-case in the environment).
GROUP_HEADER = ["variable", "short form", "default", "meaning"]


def settings_rows(model: type[BaseModel] = KBSettings, prefix: str = "KB_") -> list[tuple[str, str, str]]:
    """One ``(variable, default, meaning)`` row per setting of ``model``, in declaration order; a nested group is one
    row pointing at its own table; a field not read from the environment (the scoring profile) has no row.

    Raises:
        ValueError: A setting has no description (every setting is documented, or the table would say nothing).
    """
    rows = []
    for name, info in model.model_fields.items():
        variable = f"{prefix}{name.upper()}"
        if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("environment") is False:
            continue
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            summary = _summary(info.annotation)
            meaning = f"The {name} group: {_cell(summary[:1].lower() + summary[1:])} See docs/configuration.md."
            rows.append((f"`{variable}__*`", "-", meaning))
            continue
        if not info.description:
            raise ValueError(f"setting {name} of {model.__name__} has no description (kb_retrieval/config.py)")
        rows.append((f"`{variable}`", _default(info), _cell(info.description + _choices(info))))
    return rows


def group_rows(group: str) -> list[tuple[str, str, str, str]]:
    """One ``(variable, short form, default, meaning)`` row per setting of ``group``, in declaration order."""
    rows = settings_rows(GROUPS[group], f"KB_{group.upper()}__")
    return [
        (variable, f"`{short_name(group, name)}`", default, meaning)
        for (variable, default, meaning), name in zip(rows, GROUPS[group].model_fields, strict=True)
    ]


def render(section: str) -> str:
    """The Markdown of one section: ``settings`` (``KB_*``: the groups and the ungrouped settings), ``groups`` (one
    table per group, ``KB_<GROUP>__*``) or ``scoring`` (the built-in scoring profile)."""
    if section == "groups":
        parts = []
        for group, model in GROUPS.items():
            table = markdown_table(GROUP_HEADER, [list(row) for row in group_rows(group)])
            parts += [f"### {group} (`KB_{group.upper()}__*`)", "", _summary(model), "", *table, ""]
        return "\n".join(parts).strip()
    if section == "settings":
        return "\n".join(markdown_table(HEADER, [list(row) for row in settings_rows()]))
    return "\n".join(markdown_table(PROFILE_HEADER, [list(row) for row in profile_rows()]))


def profile_rows() -> list[tuple[str, str, str]]:
    """One ``(weight, built-in value, meaning)`` row per field of the scoring profile, its version first.

    Example:
        >>> profile_rows()[0][:2]
        ('`version`', '`2026.12.1`')
    """
    rows = []
    for name, info in ScoringProfile.model_fields.items():
        if not info.description:
            raise ValueError(
                f"weight {name} of the scoring profile has no description (kb_retrieval/scoring_profile.py)"
            )
        rows.append((f"`{name}`", _default(info), _cell(info.description)))
    return rows


def _summary(model: type[BaseModel]) -> str:
    """A group's docstring, its environment names left out (the table shows them)."""
    first = (model.__doc__ or "").split("\n\n", 1)[0]
    return " ".join(first.split(" (``KB_", 1)[0].split()).rstrip(".") + "."


def update(path: Path) -> bool:
    """Rewrite every marked section ``path`` holds; True when the file changed."""
    text = path.read_text(encoding="utf-8")
    new = text
    for section, (start, end) in SECTIONS.items():
        if start in new:
            new = replace_marked_section(new, start, end, render(section))
    if new != text:
        path.write_text(new, encoding="utf-8", newline="\n")
    return new != text


def _default(info: FieldInfo) -> str:
    value: Any = info.get_default(call_default_factory=True)
    if value is None:
        return "(see meaning)"
    if isinstance(value, SecretStr):
        return "(empty)" if not value.get_secret_value() else "(set)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, Path):
        value = value.as_posix()
    if value == "" or value == {}:
        return "(empty)"
    return f"`{value}`"


def _choices(info: FieldInfo) -> str:
    """`` One of `a`, `b`.`` for a setting whose type is a set of literals."""
    args = typing.get_args(info.annotation)
    if typing.get_origin(info.annotation) is typing.Literal and all(isinstance(a, str) for a in args):
        return " One of " + ", ".join(f"`{a}`" for a in args) + "."
    return ""


def _cell(text: str) -> str:
    """Description text made safe in a table cell: one line, pipes escaped, angle brackets not read as HTML."""
    text = " ".join(text.split()).replace("|", "\\|").replace("*", "\\*")
    return text.replace("<", "&lt;").replace(">", "&gt;")


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite the marked sections of the files named (default README.md), or print the tables with none marked."""
    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)] or [Path("README.md")]
    for path in paths:
        print(f"{path}: {'updated' if update(path) else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
