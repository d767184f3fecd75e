"""The tests mirror the package (the rule is in the docstring of ``tests/__init__.py``): a top-level test file is
named after a top-level module or is a listed project-wide check, and every test folder mirrors a package folder."""

from __future__ import annotations

import re

import pytest

import tests
from tests.conftest import REPO

pytestmark = pytest.mark.unit

TESTS = REPO / "tests"
#: Test folders that mirror no package folder, each with its reason in ``tests/__init__.py``.
UNMIRRORED = {"reliability", "support"}


def project_wide() -> list[str]:
    """The project-wide checks listed in the docstring of ``tests/__init__.py`` (``- ``test_x.py``: ...`` lines)."""
    return re.findall(r"^- ``(test_\w+\.py)``:", tests.__doc__ or "", re.MULTILINE)


def test_every_top_level_test_file_is_named_after_a_module_or_listed() -> None:
    listed = set(project_wide())
    assert "test_layout.py" in listed, "the list in tests/__init__.py was not found"
    thematic = [
        path.name
        for path in sorted(TESTS.glob("test_*.py"))
        if path.name not in listed and not (REPO / "kb_retrieval" / f"{path.stem.removeprefix('test_')}.py").is_file()
    ]
    assert thematic == [], (
        f"top-level test files named after no top-level kb_retrieval module: {thematic}; move each into the folder "
        "of the module it tests (tests/__init__.py says how), or list it there if it is a project-wide check"
    )


def test_every_listed_project_wide_check_exists_and_is_not_a_module_test() -> None:
    listed = project_wide()
    assert [name for name in listed if not (TESTS / name).is_file()] == []
    assert [name for name in listed if (REPO / "kb_retrieval" / f"{name[5:-3]}.py").is_file()] == []
    assert len(listed) == len(set(listed))


def test_every_test_folder_mirrors_a_package_folder() -> None:
    folders = {path.parent.relative_to(TESTS) for path in TESTS.rglob("test_*.py")} - {TESTS.relative_to(TESTS)}
    assert folders, "no test folder found: the check would pass with nothing checked"
    unmirrored = sorted(
        folder.as_posix()
        for folder in folders
        if folder.parts[0] not in UNMIRRORED
        and not (REPO / "kb_retrieval" / folder).is_dir()
        and not (REPO / folder / "__init__.py").is_file()  # a top-level package: tests/sidecar for sidecar/
    )
    assert unmirrored == [], f"test folders that mirror no folder of kb_retrieval (or sidecar): {unmirrored}"
