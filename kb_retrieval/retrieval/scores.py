"""Score semantics: every raw score keeps its label, and maps to one similarity in [0, 1].

Vectors are L2-normalised at ingest and query time, so for unit vectors ``cos = 1 - d/2`` where ``d`` is the squared
L2 distance Milvus returns. Cosine and inner-product scores are similarities already; negative ones clamp to 0.

Example:
    >>> normalised_similarity(0.5, ScoreLabel.L2)
    0.75
    >>> normalised_similarity(0.8, ScoreLabel.COSINE)
    0.8
"""

from __future__ import annotations

from kb_retrieval.models import ScoreLabel


def normalised_similarity(raw: float, label: ScoreLabel) -> float:
    """A raw Milvus score as a similarity in [0, 1] (an L2 distance turned around)."""
    value = 1.0 - raw / 2.0 if label is ScoreLabel.L2 else raw
    return min(1.0, max(0.0, float(value)))
