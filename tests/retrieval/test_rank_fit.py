"""The ranking fit: the configured weights unless the pseudo-queries show a gain beyond the noise; the best section's
similarity, its BM25 and the identity weights chosen on them."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kb_retrieval.retrieval.doc_rank import taught_weights
from kb_retrieval.retrieval.rank_fit import PseudoCase, choose, fit_path, grid, load_fit, mixture, order, store_fit
from kb_retrieval.scoring_profile import BUILT_IN_PROFILE

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


def _words_case(i: int) -> PseudoCase:
    """The right document shares the question's words (BM25) but not its title; the sections' similarity is even."""
    return PseudoCase(
        f"right{i}.md",
        [
            (f"other{i}.md", {"doc_title": 0.7, "chunk": 0.5}),
            (f"right{i}.md", {"doc_title": 0.3, "chunk": 0.5, "lexical": 0.2}),
        ],
    )


def test_order_breaks_ties_by_retrieval() -> None:
    assert order([("a", {"x": 1.0}), ("b", {"x": 1.0}), ("c", {"x": 2.0})], {"x": 1.0}) == ["c", "a", "b"]


def test_mixture_sets_the_section_weight_and_scales_identity_only() -> None:
    mixed = mixture(CONFIGURED, 1.5, 0.5)
    assert mixed == {"chunk": 1.5, "doc_title": 0.5, "doc_summary": 0.5, "doc_text": 1.0}


def test_mixture_sets_the_lexical_weight_only_when_given() -> None:
    assert mixture({"lexical": 0.3}, 0.0, 1.0)["lexical"] == 0.3
    assert mixture({"lexical": 0.3}, 0.0, 1.0, 4.0)["lexical"] == 4.0


def test_the_grid_starts_at_the_configured_mixture_and_holds_each_point_once() -> None:
    points = grid({**CONFIGURED, "lexical": 0.3})
    assert points[0] == (0.0, 1.0, 0.3)
    assert len(points) == len(set(points)) and (3.0, 0.0, 16.0) in points


def test_a_knowledge_base_whose_sections_decide_gets_section_weight() -> None:
    fit = choose([_section_case(i) for i in range(60)], CONFIGURED, index_version="v", min_queries=50)
    assert fit.fitted and fit.section_weight > 0
    assert fit.mrr_fitted == 1.0 and fit.mrr_configured == 0.5
    assert fit.cv_mrr_fitted == 1.0


def test_a_knowledge_base_whose_identity_decides_keeps_the_configured_weights() -> None:
    fit = choose([_identity_case(i) for i in range(60)], CONFIGURED, index_version="v", min_queries=50)
    assert not fit.fitted and fit.weights == CONFIGURED


def test_a_knowledge_base_whose_words_decide_gets_lexical_weight() -> None:
    fit = choose([_words_case(i) for i in range(60)], CONFIGURED, index_version="v", min_queries=50)
    assert fit.fitted and fit.lexical_weight and fit.weights["lexical"] == fit.lexical_weight
    assert fit.mrr_fitted == 1.0 and "lexical" in fit.describe()


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


def test_a_fit_taught_under_other_inputs_is_not_loaded_for_these(tmp_path) -> None:
    """A fit records what it was taught under (the configured weights, fit_queries, fit_min_queries); a caller that
    gives its own inputs gets the stored fit only when they are the same (else it teaches the version again)."""
    inputs = {**CONFIGURED, "fit_queries": 400.0, "fit_min_queries": 50.0}
    fit = choose([_section_case(i) for i in range(60)], CONFIGURED, index_version="v1", min_queries=50)
    fit = dataclasses.replace(fit, taught_under=inputs)
    store_fit(tmp_path, fit)
    assert load_fit(tmp_path, "v1", inputs) == fit
    assert load_fit(tmp_path, "v1") == fit  # no inputs given: whatever is stored
    assert load_fit(tmp_path, "v1", {**inputs, "fit_queries": 200.0}) is None
    assert load_fit(tmp_path, "v1", {**inputs, "doc_title": 0.5}) is None


def test_a_variant_with_other_ranking_weights_ranks_with_its_own_not_the_fit_taught_under_others() -> None:
    """A ``with_settings(scoring=...)`` variant shares its lookup's fit, taught under the lookup's profile: the
    variant applies it only when its own fit inputs are the same, else ranks with its weights as set and says why."""
    profile = BUILT_IN_PROFILE
    fit = choose([_section_case(i) for i in range(60)], profile.ranking_weights(), index_version="v1", min_queries=50)
    fit = dataclasses.replace(fit, taught_under=profile.fit_inputs())
    assert fit.fitted
    weights, note = taught_weights(profile, fit)
    assert weights == mixture(profile.ranking_weights(), fit.section_weight, fit.identity_scale, fit.lexical_weight)
    assert weights != profile.ranking_weights() and note == fit.describe()
    for variant in (profile.variant("title", rank_title=2.0), profile.variant("sample", fit_queries=100)):
        weights, note = taught_weights(variant, fit)
        assert weights == variant.ranking_weights() and note.startswith("as set (the knowledge base's fit was taught")
    # A variant that changes nothing the fit depends on keeps it.
    assert taught_weights(profile.variant("same"), fit) == (
        mixture(profile.ranking_weights(), fit.section_weight, fit.identity_scale, fit.lexical_weight),
        fit.describe(),
    )


def test_a_fit_stored_in_an_earlier_format_is_taught_again(tmp_path) -> None:
    fit = choose([_section_case(i) for i in range(60)], CONFIGURED, index_version="v1", min_queries=50)
    path = store_fit(tmp_path, fit)
    data = json.loads(path.read_text(encoding="utf-8"))
    del data["format"], data["lexical_weight"]  # as session 19 stored it
    fit_path(tmp_path, "v1").write_text(json.dumps(data), encoding="utf-8")
    assert load_fit(tmp_path, "v1") is None


def test_a_fit_chosen_on_the_l0_signal_that_counted_the_title_twice_is_taught_again(tmp_path) -> None:
    fit = choose([_section_case(i) for i in range(60)], CONFIGURED, index_version="v1", min_queries=50)
    path = store_fit(tmp_path, fit)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert load_fit(tmp_path, "v1") == fit
    data["format"] = 2  # as stored before l0_signal
    path.write_text(json.dumps(data), encoding="utf-8")
    assert load_fit(tmp_path, "v1") is None


def _reference_choice(cases: list[PseudoCase], configured: dict[str, float]) -> tuple:
    """The choice, its cross-validated figure and the grid table recomputed the plain way: every reciprocal rank
    computed where it is used (as ``choose`` did before it computed each once)."""
    import math

    from kb_retrieval.retrieval.rank_fit import FOLDS, NOISE_SE, reciprocal_rank

    def best(subset: list[PseudoCase]) -> tuple:
        points = grid(configured)
        base = [reciprocal_rank(c, configured) for c in subset]
        chosen, chosen_rr = points[0], base
        for point in points[1:]:
            rr = [reciprocal_rank(c, mixture(configured, *point)) for c in subset]
            if sum(rr) > sum(chosen_rr) + 1e-9:
                chosen, chosen_rr = point, rr
        gains = [b - a for a, b in zip(base, chosen_rr, strict=True)]
        mean = sum(gains) / len(gains)
        sd = math.sqrt(sum((g - mean) ** 2 for g in gains) / (len(gains) - 1))
        return (
            (chosen, chosen_rr)
            if chosen == points[0] or mean > NOISE_SE * sd / math.sqrt(len(gains))
            else (
                points[0],
                base,
            )
        )

    chosen, rr = best(cases)
    held = [0.0] * len(cases)
    for fold in range(FOLDS):
        point, _ = best([c for i, c in enumerate(cases) if i % FOLDS != fold])
        for i in range(fold, len(cases), FOLDS):
            held[i] = reciprocal_rank(cases[i], mixture(configured, *point))
    table = [
        round(sum(reciprocal_rank(c, mixture(configured, *p)) for c in cases) / len(cases), 4) for p in grid(configured)
    ]
    return chosen, round(sum(rr) / len(rr), 4), round(sum(held) / len(held), 4), table


def test_the_choice_is_the_plain_computations_on_mixed_cases() -> None:
    """Each reciprocal rank computed once gives the same choice, figures and table as computing it where used, on
    cases where the folds choose differently from the whole."""
    import random

    rng = random.Random(11)
    makers = (_section_case, _identity_case, _words_case)
    for weights in ((6, 3, 1), (2, 5, 3), (1, 1, 8)):
        cases = [rng.choices(makers, weights)[0](i) for i in range(97)]
        for case in cases:  # jitter the signals so that ties and near-ties differ per case
            for _, signals in case.candidates:
                for key in signals:
                    signals[key] = round(signals[key] + rng.uniform(-0.15, 0.15), 3)
        fit = choose(cases, CONFIGURED, index_version="v", min_queries=50)
        chosen, mrr, cv_mrr, table = _reference_choice(cases, CONFIGURED)
        assert (fit.section_weight, fit.identity_scale) == chosen[:2]
        assert fit.mrr_fitted == mrr and fit.cv_mrr_fitted == cv_mrr
        assert [row["mrr"] for row in fit.grid] == table
