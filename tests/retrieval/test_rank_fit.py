"""The ranking fit: the configured weights unless the pseudo-queries show a gain beyond the noise."""

from __future__ import annotations

import pytest

from kb_retrieval.retrieval.rank_fit import PseudoCase, choose, load_fit, mixture, order, store_fit

pytestmark = pytest.mark.unit

CONFIGURED = {"chunk": 0.0, "doc_title": 1.0, "doc_summary": 1.0, "doc_text": 1.0}


def _section_case(i: int) -> PseudoCase:
    """The right document has the best section; another has the better title."""
    return PseudoCase(
        f"right{i}.md",
        [(f"other{i}.md", {"doc_title": 0.7, "chunk": 0.3}), (f"right{i}.md", {"doc_title": 0.3, "chunk": 0.8})],
    )


def _identity_case(i: int) -> PseudoCase:
    """The right document has the better title; another has the best section."""
    return PseudoCase(
        f"right{i}.md",
        [(f"other{i}.md", {"doc_title": 0.3, "chunk": 0.8}), (f"right{i}.md", {"doc_title": 0.7, "chunk": 0.3})],
    )


def test_order_breaks_ties_by_retrieval() -> None:
    assert order([("a", {"x": 1.0}), ("b", {"x": 1.0}), ("c", {"x": 2.0})], {"x": 1.0}) == ["c", "a", "b"]


def test_mixture_sets_the_section_weight_and_scales_identity_only() -> None:
    mixed = mixture(CONFIGURED, 1.5, 0.5)
    assert mixed == {"chunk": 1.5, "doc_title": 0.5, "doc_summary": 0.5, "doc_text": 1.0}


def test_a_knowledge_base_whose_sections_decide_gets_section_weight() -> None:
    fit = choose([_section_case(i) for i in range(60)], CONFIGURED, index_version="v", min_queries=50)
    assert fit.fitted and fit.section_weight > 0
    assert fit.mrr_fitted == 1.0 and fit.mrr_configured == 0.5
    assert fit.cv_mrr_fitted == 1.0


def test_a_knowledge_base_whose_identity_decides_keeps_the_configured_weights() -> None:
    fit = choose([_identity_case(i) for i in range(60)], CONFIGURED, index_version="v", min_queries=50)
    assert not fit.fitted and fit.weights == CONFIGURED


def test_a_gain_within_the_noise_is_not_taken() -> None:
    cases = [_section_case(0), *(_identity_case(i) for i in range(59))]
    fit = choose(cases, CONFIGURED, index_version="v", min_queries=50)
    assert fit.reason.startswith("kept") and fit.weights == CONFIGURED


def test_too_few_pseudo_queries_keep_the_configured_weights() -> None:
    fit = choose([_section_case(i) for i in range(10)], CONFIGURED, index_version="v", min_queries=50)
    assert not fit.fitted and "fewer than 50" in fit.reason


def test_a_fit_is_stored_per_index_version(tmp_path) -> None:
    fit = choose([_section_case(i) for i in range(60)], CONFIGURED, index_version="ab:cd", min_queries=50)
    store_fit(tmp_path, fit)
    assert load_fit(tmp_path, "ab:cd") == fit
    assert load_fit(tmp_path, "other") is None
