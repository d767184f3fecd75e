"""Score semantics: each label maps to one similarity in [0, 1]; L2 on unit vectors agrees with cosine."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kb_retrieval.models import ScoreLabel
from kb_retrieval.retrieval.scores import normalised_similarity

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(0.0, 1.0), (0.5, 0.75), (1.0, 0.5), (2.0, 0.0), (4.0, 0.0), (3.0, 0.0), (-0.2, 1.0)],
)
def test_l2_distance(raw: float, expected: float) -> None:
    assert normalised_similarity(raw, ScoreLabel.L2) == pytest.approx(expected)


@pytest.mark.parametrize("label", [ScoreLabel.COSINE, ScoreLabel.IP])
@pytest.mark.parametrize(("raw", "expected"), [(0.8, 0.8), (0.0, 0.0), (1.0, 1.0), (-0.3, 0.0), (1.7, 1.0)])
def test_similarity_labels_pass_through_and_clamp(label: ScoreLabel, raw: float, expected: float) -> None:
    assert normalised_similarity(raw, label) == pytest.approx(expected)


@pytest.mark.parametrize("label", list(ScoreLabel))
@pytest.mark.parametrize("raw", [-1e9, -1.0, 0.0, 0.3, 1.0, 2.5, 1e9, math.inf, -math.inf, math.nan])
def test_always_within_unit_interval(label: ScoreLabel, raw: float) -> None:
    value = normalised_similarity(raw, label)
    assert isinstance(value, float)
    assert 0.0 <= value <= 1.0


def test_label_for_metric() -> None:
    assert ScoreLabel.for_metric("cosine") is ScoreLabel.COSINE
    assert ScoreLabel.for_metric("IP") is ScoreLabel.IP
    assert ScoreLabel.for_metric("L2") is ScoreLabel.L2


def test_l2_on_unit_vectors_equals_cosine() -> None:
    rng = np.random.default_rng(7)
    a = rng.normal(size=(200, 384))
    b = rng.normal(size=(200, 384))
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    b[0] = a[0]  # identical
    b[1] = -a[1]  # opposite
    dot = np.sum(a * b, axis=1)
    squared_l2 = np.sum((a - b) ** 2, axis=1)  # what Milvus returns for L2
    assert np.allclose(1.0 - squared_l2 / 2.0, dot)
    for d, cos in zip(squared_l2, dot, strict=True):
        assert normalised_similarity(float(d), ScoreLabel.L2) == pytest.approx(max(0.0, float(cos)), abs=1e-9)
        assert normalised_similarity(float(d), ScoreLabel.L2) == pytest.approx(
            normalised_similarity(float(cos), ScoreLabel.COSINE), abs=1e-9
        )
    assert normalised_similarity(float(squared_l2[0]), ScoreLabel.L2) == pytest.approx(1.0)
    assert normalised_similarity(float(squared_l2[1]), ScoreLabel.L2) == 0.0
