"""The scoring profile (kb_retrieval/scoring_profile.py): the built-in weights, profile files, the environment, and
where the version shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from kb_retrieval.bench.identity import without_clocks
from kb_retrieval.bench.summary import summary_markdown
from kb_retrieval.cli_args import describe_settings_error
from kb_retrieval.config import KBSettings
from kb_retrieval.overrides import UnsupportedOverrideError, check_overrides, request_refusal
from kb_retrieval.scoring_profile import BUILT_IN_PROFILE, ProfileError, ScoringProfile, load_profile

#: ScoringSettings' defaults on main before the profile (74d3f23), copied by hand: nothing moved.
BEFORE = {
    "boost_l0_title": 0.15,
    "boost_l0_keyword": 0.15,
    "boost_l0_entity": 0.05,
    "boost_l0_category": 0.03,
    "boost_breadcrumb": 0.04,
    "boost_content": 0.04,
    "boost_title_terms": 0.2,
    "boost_exact_match": 0.6,
    "exact_match_max_df": 2,
    "rare_term_max_df": 1,
    "focus_saturation": 0.5,
    "focus_padding": 2,
    "close_call_margin": 0.1,
    "relevance_high": 0.6,
    "relevance_medium": 0.45,
    "min_content_tokens": 12,
    "l0_max_keyword_documents": 3,
    "l0_title_coverage_min": 0.5,
    "l0_title_coverage_limit": 20,
    "rank_title": 0.75,
    "rank_summary": 0.75,
    "rank_text": 1.5,
    "rank_static_summary": 0.5,
    "rank_static_title": 0.75,
    "static_common_min_documents": 20,
    "rank_chunk": 0.0,
    "rank_lexical": 0.3,
    "rank_title_terms": 2.2,
    "rank_l0": 1.7,
    "rank_doc_focus": 0.05,
    "rank_exact_match": 1.0,
    "fit_ranking": True,
    "fit_queries": 200,
    "fit_min_queries": 50,
}


def _write(tmp_path: Path, data: object, name: str = "profile.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# --- the built-in profile -----------------------------------------------------------------------------------


@pytest.mark.unit
def test_the_built_in_profile_holds_the_weights_of_before_exactly():
    values = BUILT_IN_PROFILE.model_dump()
    assert values.pop("version") == "2026.12.1"
    assert values == BEFORE
    for name, value in BEFORE.items():  # the types too: an int stays an int, a float a float
        assert type(values[name]) is type(value), name
    assert KBSettings().scoring == BUILT_IN_PROFILE


@pytest.mark.unit
def test_the_profile_is_frozen_and_every_weight_documented():
    with pytest.raises(ValidationError):
        BUILT_IN_PROFILE.rank_l0 = 2.0  # type: ignore[misc]
    assert all(info.description for info in ScoringProfile.model_fields.values())


@pytest.mark.unit
def test_the_three_top_level_weights_stay_settings_a_request_may_set():
    """lexical_weight, doc_focus_weight (the API contract lets a request set them) and lexical_rescore_min (a cost
    knob) are settings, not profile weights; the profile's rank_lexical and rank_doc_focus weigh the first two."""
    for name in ("lexical_weight", "doc_focus_weight", "lexical_rescore_min"):
        assert name in KBSettings.model_fields and name not in ScoringProfile.model_fields
    check_overrides({"lexical_weight": 0.3, "doc_focus_weight": 0.2}, KBSettings())


@pytest.mark.unit
def test_a_variant_says_so_in_its_version():
    variant = BUILT_IN_PROFILE.variant("fit-off", fit_ranking=False)
    assert variant.version == "2026.12.1+fit-off" and variant.fit_ranking is False
    assert variant.ranking_weights() == BUILT_IN_PROFILE.ranking_weights()


# --- a profile file -----------------------------------------------------------------------------------------


@pytest.mark.unit
def test_a_complete_profile_file_is_read(tmp_path):
    data = {**BEFORE, "version": "mine-1", "rank_l0": 2.0, "fit_queries": 100}
    profile = load_profile(_write(tmp_path, data))
    assert profile.version == "mine-1" and profile.rank_l0 == 2.0 and profile.fit_queries == 100
    assert profile.model_dump() == data


@pytest.mark.unit
def test_a_partial_profile_file_takes_the_rest_from_the_built_in_one(tmp_path):
    profile = load_profile(_write(tmp_path, {"version": "2026.12.1-title", "boost_l0_title": 0.2}))
    assert profile.boost_l0_title == 0.2
    assert profile.model_dump(exclude={"version", "boost_l0_title"}) == {
        k: v for k, v in BEFORE.items() if k != "boost_l0_title"
    }


@pytest.mark.unit
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"version": "x", "boost_l0_titel": 0.2}, "unknown key 'boost_l0_titel' (did you mean 'boost_l0_title'?)"),
        ({"version": "x", "rank_l0": "high"}, "key 'rank_l0': Input should be a valid number"),
        ({"version": "x", "rank_l0": "1.5"}, "key 'rank_l0': Input should be a valid number"),  # a number, not text
        ({"version": "x", "fit_queries": 1.5}, "key 'fit_queries': Input should be a valid integer"),
        ({"version": "x", "fit_ranking": 0}, "key 'fit_ranking': Input should be a valid boolean"),
        ({"version": "x", "boost_l0_title": 2}, "key 'boost_l0_title': Input should be less than or equal to 1"),
        ({"boost_l0_title": 0.2}, "key 'version' is missing"),
        ({"version": "2026.12.1", "boost_l0_title": 0.2}, "key 'version' is '2026.12.1', the built-in profile's"),
        ({"version": "with space"}, "key 'version': String should match pattern"),
        ([0.2], "must be a JSON object"),
    ],
    ids=[
        "unknown",
        "text",
        "quoted-number",
        "float-for-int",
        "int-for-bool",
        "range",
        "no-version",
        "built-in",
        "bad-version",
        "list",
    ],
)
def test_a_profile_file_that_cannot_be_used_is_refused_naming_the_file_and_the_key(tmp_path, data, expected):
    path = _write(tmp_path, data)
    with pytest.raises(ProfileError) as refused:
        load_profile(path)
    assert str(refused.value).startswith(f"scoring profile {path}: ") and expected in str(refused.value)


@pytest.mark.unit
def test_a_missing_or_broken_profile_file_is_refused(tmp_path):
    with pytest.raises(ProfileError, match=r"scoring profile .*nowhere\.json: no such file"):
        load_profile(tmp_path / "nowhere.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"version": "x",', encoding="utf-8")
    with pytest.raises(ProfileError, match=r"broken\.json: not JSON \(.* at line 1 column \d+\)"):
        load_profile(broken)


# --- the settings and the environment -----------------------------------------------------------------------


@pytest.mark.unit
def test_kb_scoring_profile_selects_a_profile_file_once(tmp_path, monkeypatch):
    path = _write(tmp_path, {"version": "mine-2", "rank_chunk": 1.5})
    monkeypatch.setenv("KB_SCORING_PROFILE", str(path))
    settings = KBSettings()
    assert (
        settings.scoring_profile == path and settings.scoring.version == "mine-2" and settings.scoring.rank_chunk == 1.5
    )
    path.unlink()  # resolved once: a copy of the settings keeps the profile without reading the file again
    again = KBSettings.model_validate(settings.model_dump())
    assert again.scoring == settings.scoring
    assert KBSettings(scoring=BUILT_IN_PROFILE).scoring == BUILT_IN_PROFILE  # a profile given in Python wins
    monkeypatch.setenv("KB_SCORING_PROFILE", "")
    assert KBSettings().scoring == BUILT_IN_PROFILE


@pytest.mark.unit
def test_a_bad_profile_file_stops_the_settings_with_one_line(tmp_path, monkeypatch):
    path = _write(tmp_path, {"version": "x", "rank_l0": "high"})
    monkeypatch.setenv("KB_SCORING_PROFILE", str(path))
    with pytest.raises(ValidationError) as refused:
        KBSettings()
    line = describe_settings_error(refused.value)
    assert line == f"invalid settings: scoring profile {path}: key 'rank_l0': Input should be a valid number"


@pytest.mark.unit
@pytest.mark.parametrize("variable", ["KB_SCORING__BOOST_L0_TITLE", "kb_scoring__rank_l0", "KB_SCORING"])
def test_a_weight_in_the_environment_is_refused_not_ignored(monkeypatch, variable):
    monkeypatch.setenv(variable, "0.2" if variable != "KB_SCORING" else '{"boost_l0_title": 0.2}')
    with pytest.raises(ValidationError) as refused:
        KBSettings()
    line = describe_settings_error(refused.value)
    assert line.startswith(f"invalid settings: {variable.upper()} is no longer read: ")
    assert "KB_SCORING_PROFILE" in line


@pytest.mark.unit
def test_the_refusal_is_where_the_environment_is_read_not_in_a_copy_of_the_settings(monkeypatch):
    settings = KBSettings()
    monkeypatch.setenv("KB_SCORING__RANK_L0", "0.2")
    assert settings.updated(top_k=7).retrieval.top_k == 7  # a copy validates without reading the environment
    assert settings.model_copy(update={"top_k": 7}).scoring == settings.scoring
    with pytest.raises(ValidationError, match="KB_SCORING__RANK_L0 is no longer read"):
        KBSettings()  # new settings read it, and refuse it


@pytest.mark.unit
def test_the_profile_is_chosen_as_a_whole_never_weight_by_weight_per_request():
    current = KBSettings()
    check_overrides({"scoring": BUILT_IN_PROFILE.variant("mine", rank_l0=2.0)}, current)  # Python: the tuning tools
    with pytest.raises(UnsupportedOverrideError, match="rank_l0 is a weight of the scoring profile"):
        check_overrides({"rank_l0": 2.0}, current)
    with pytest.raises(UnsupportedOverrideError, match="scoring_profile cannot be overridden: the profile file"):
        check_overrides({"scoring_profile": Path("other.json")}, current)
    for name in ("scoring", "scoring_profile", "rank_l0"):
        assert "chosen as a whole when serve starts (KB_SCORING_PROFILE" in request_refusal(name)


# --- where the version shows --------------------------------------------------------------------------------


@pytest.mark.unit
def test_the_bench_summary_names_the_profile():
    assert "Scoring profile 2026.12.1 (" in summary_markdown({"scoring_profile": "2026.12.1"})
    assert "Scoring profile" not in summary_markdown({})


def test_the_trace_names_the_profile_and_the_result_does_not(sample_lookup):
    """A variant with the same weights answers the same result JSON (timings aside); only its trace rows differ."""
    query = "MySQLReplicationLag: replica is 340 seconds behind"
    variant = sample_lookup.with_settings(scoring=BUILT_IN_PROFILE.variant("same"))
    results = []
    for lookup, version in ((sample_lookup, "2026.12.1"), (variant, "2026.12.1+same")):
        result = lookup.lookup(query)
        assert lookup.traces.flush()
        assert lookup.traces.rows()[-1].retrieval_details["scoring_profile"] == version
        results.append(without_clocks(json.loads(result.model_dump_json())))
    assert results[0] == results[1]
    assert "2026.12.1" not in json.dumps(results[0])
