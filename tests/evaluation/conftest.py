"""Shared test data for the offline evaluator: the hand-made golden file and fixtures under ``data/``."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "golden.jsonl"
FIXTURES = DATA / "fixtures"


@pytest.fixture
def golden_path() -> Path:
    return GOLDEN


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
