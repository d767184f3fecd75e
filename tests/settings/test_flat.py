"""The settings groups and their flat short forms (issue 36, item 4): read grouped, given either way, refused when
both forms disagree, persisted and compared as before."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsError

from kb_retrieval.config import KBSettings
from kb_retrieval.overrides import UnsupportedOverrideError, check_overrides
from kb_retrieval.scoring_profile import ScoringProfile
from kb_retrieval.settings import FLAT, GROUPS, flattened, grouped


@pytest.fixture(autouse=True)
def _no_kb_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("KB_") and not name.upper().startswith("KB_TEST"):
            monkeypatch.delenv(name)


@pytest.mark.unit
def test_a_grouped_variable_sets_the_grouped_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_RETRIEVAL__TOP_K", "7")
    monkeypatch.setenv("KB_TRACE__DB_URL", "sqlite:///t.db")
    monkeypatch.setenv("KB_STORAGE__INDEX_PARAMS", '{"M": 8}')
    settings = KBSettings()
    assert settings.retrieval.top_k == 7
    assert settings.trace.db_url == "sqlite:///t.db"
    assert settings.storage.index_params == {"M": 8}


@pytest.mark.unit
def test_a_flat_variable_sets_the_same_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_TOP_K", "7")
    monkeypatch.setenv("KB_TRACE_DB_URL", "sqlite:///t.db")
    monkeypatch.setenv("KB_SIDECAR_ENABLED", "true")
    monkeypatch.setenv("KB_INDEX_PARAMS", '{"M": 8}')
    monkeypatch.setenv("kb_metric", "ip")  # names are read without case, as pydantic-settings reads them
    settings = KBSettings()
    assert settings.retrieval.top_k == 7
    assert settings.trace.db_url == "sqlite:///t.db"
    assert settings.sidecar.enabled is True
    assert settings.storage.index_params == {"M": 8}
    assert settings.schema_fields.metric == "IP"


@pytest.mark.unit
def test_both_variables_of_one_setting_must_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_TOP_K", "7")
    monkeypatch.setenv("KB_RETRIEVAL__TOP_K", "7")
    assert KBSettings().retrieval.top_k == 7
    monkeypatch.setenv("KB_RETRIEVAL__TOP_K", "8")
    with pytest.raises(SettingsError, match=r"^KB_TOP_K and KB_RETRIEVAL__TOP_K are the same setting"):
        KBSettings()


@pytest.mark.unit
def test_a_flat_variable_that_does_not_parse_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from kb_retrieval.cli_args import describe_environment_error

    monkeypatch.setenv("KB_INDEX_PARAMS", "{not json")
    with pytest.raises(SettingsError) as raised:
        KBSettings()
    assert describe_environment_error(raised.value).startswith("invalid setting KB_INDEX_PARAMS: cannot parse")
    monkeypatch.delenv("KB_INDEX_PARAMS")
    monkeypatch.setenv("KB_STORAGE__INDEX_PARAMS", "{not json")
    with pytest.raises(SettingsError) as raised:
        KBSettings()
    assert describe_environment_error(raised.value).startswith("invalid setting KB_STORAGE__*: cannot parse")


@pytest.mark.unit
def test_flat_keywords_are_accepted_and_a_keyword_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = KBSettings(state_dir="/tmp/kb", top_k=5, trace_wait=True, sidecar_timeout_s=1.5)
    assert settings.storage.state_dir == Path("/tmp/kb")
    assert (settings.retrieval.top_k, settings.trace.wait, settings.sidecar.timeout_s) == (5, True, 1.5)
    assert KBSettings.model_validate({"top_k": 9, "retrieval": {"lexical_top_k": 3}}).retrieval.lexical_top_k == 3
    monkeypatch.setenv("KB_RETRIEVAL__TOP_K", "7")
    assert KBSettings(top_k=3).retrieval.top_k == 3  # whichever form either uses
    monkeypatch.delenv("KB_RETRIEVAL__TOP_K")
    monkeypatch.setenv("KB_TOP_K", "7")
    assert KBSettings(retrieval={"top_k": 3}).retrieval.top_k == 3
    assert KBSettings().retrieval.top_k == 7


@pytest.mark.unit
def test_a_flat_and_a_grouped_keyword_of_one_setting_are_refused_naming_both() -> None:
    with pytest.raises(ValueError, match=r"^top_k and retrieval\.top_k are the same setting, both given"):
        KBSettings(top_k=3, retrieval={"top_k": 3})
    with pytest.raises(ValidationError, match=r"trace_wait and trace\.wait are the same setting"):
        KBSettings.model_validate({"trace_wait": True, "trace": {"wait": False}})


@pytest.mark.unit
def test_the_validators_moved_with_their_fields() -> None:
    assert KBSettings(metric=" ip ").schema_fields.metric == "IP"
    assert KBSettings(vector_store_mode="spring-ai").retrieval.vector_store_mode == "vectorstore"
    with pytest.raises(ValidationError, match=r"chunk_overlap \(64\) must be below chunk_tokens \(64\)"):
        KBSettings(chunk_tokens=64, chunk_overlap=64)
    with pytest.raises(ValidationError, match="not a valid URL") as raised:
        KBSettings(milvus_uri="http://user:pa#ss@host:19530")
    assert "pa#ss" not in str(raised.value)
    with pytest.raises(ValidationError, match="not a valid URL"):
        KBSettings(trace_db_url="postgresql://user:pa#ss@db:5432/traces")


@pytest.mark.unit
def test_every_flat_name_is_unique_and_names_one_setting() -> None:
    fields = [(group, field) for group, model in GROUPS.items() for field in model.model_fields]
    assert len(FLAT) == len(fields) and set(FLAT.values()) == set(fields)
    names = KBSettings.setting_names()
    assert len(names) == len(set(names))
    assert not set(names) & set(GROUPS)
    assert set(ScoringProfile.model_fields).isdisjoint(names)
    for name in names:
        assert KBSettings.setting_field(name) is not None
    assert KBSettings.setting_field("retrieval") is None and KBSettings.setting_field("nope") is None


@pytest.mark.unit
def test_grouped_and_flattened_are_inverse() -> None:
    flat = {name: KBSettings().setting(name) for name in FLAT}
    assert flattened(grouped(flat)) == flat
    assert flattened({"retrieval": {"top_k": 5}, "sidecar": {"enabled": True}}) == {"top_k": 5, "sidecar_enabled": True}
    with pytest.raises(ValueError, match="both given"):
        flattened({"top_k": 5, "retrieval": {"top_k": 5}})


@pytest.mark.unit
def test_updated_takes_flat_or_grouped_names_validates_and_refuses_unknown_ones() -> None:
    base = KBSettings(state_dir="/tmp/kb")
    changed = base.updated(top_k=50, evidence={"max_evidence_blocks": 3}, lexical_weight=0.3)
    assert (changed.retrieval.top_k, changed.evidence.max_evidence_blocks, changed.lexical_weight) == (50, 3, 0.3)
    assert changed.storage.state_dir == base.storage.state_dir and changed.retrieval.lexical_top_k == 20
    assert base.retrieval.top_k == 20  # a copy
    assert base.model_copy(update={"top_k": 50}).retrieval.top_k == 50  # model_copy goes through updated
    copied = base.model_copy()
    copied.retrieval.top_k = 7
    assert base.retrieval.top_k == 20  # a copy shares no group with its original
    with pytest.raises(ValidationError):
        base.updated(top_k=0)
    for junk in ({"top_kk": 1}, {"retrieval": {"top_kk": 1}}):
        with pytest.raises(ValueError, match=r"unknown setting\(s\) top_kk"):
            base.model_copy(update=junk)


@pytest.mark.unit
def test_a_keyword_that_is_no_setting_is_refused_not_dropped() -> None:
    # The model ignores extra names (the environment's KB_ variables of other tools); a keyword must not be.
    for junk in ({"top_kk": 1}, {"retrieval": {"top_kk": 1}}):
        with pytest.raises(ValueError, match=r"unknown setting\(s\) top_kk$"):
            KBSettings(**junk)
    # A scoring-profile weight is named as one, with the way to set it.
    with pytest.raises(ValueError, match=r"fit_min_queries: a scoring-profile weight, not a setting: .*variant"):
        KBSettings(fit_min_queries=5)
    weights = KBSettings().scoring.variant("mine", fit_min_queries=5)
    assert KBSettings(scoring=weights).scoring.fit_min_queries == 5  # the way the message names
    assert KBSettings(top_k=7, retrieval={"lexical_top_k": 9}, _env_file=None).retrieval.top_k == 7


@pytest.mark.unit
def test_model_dump_round_trips() -> None:
    settings = KBSettings(
        state_dir="/tmp/kb", milvus_token="user:secret", top_k=5, index_params={"M": 8}, trace_query="hash"
    )
    assert KBSettings.model_validate(settings.model_dump()) == settings
    assert set(settings.model_dump()) == {
        *GROUPS,
        "lexical_weight",
        "lexical_rescore_min",
        "doc_focus_weight",
        "scoring",
        "scoring_profile",
    }
    plain = KBSettings(state_dir="/tmp/kb", top_k=5)
    assert KBSettings.model_validate_json(plain.model_dump_json()) == plain


@pytest.mark.unit
def test_overrides_are_checked_by_their_flat_or_grouped_name() -> None:
    settings = KBSettings()
    check_overrides({"retrieval": {"top_k": 50}, "evidence": {"max_evidence_blocks": 3}}, settings)
    check_overrides({"storage": {"collection": settings.storage.collection}}, settings)
    with pytest.raises(UnsupportedOverrideError, match=r"^collection cannot be overridden"):
        check_overrides({"storage": {"collection": "other"}}, settings)
    with pytest.raises(UnsupportedOverrideError, match=r"^trace_db_url cannot be overridden"):
        check_overrides({"trace": {"db_url": "sqlite://"}}, settings)
    with pytest.raises(UnsupportedOverrideError, match="both given"):
        check_overrides({"top_k": 5, "retrieval": {"top_k": 6}}, settings)


@pytest.mark.unit
def test_an_invalid_setting_is_named_by_the_variable_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from kb_retrieval.cli_args import describe_settings_error

    monkeypatch.setenv("KB_SCHEMA_FIELDS__METRIC", "cosine2")
    with pytest.raises(ValidationError) as raised:
        KBSettings()
    assert describe_settings_error(raised.value).startswith("invalid setting KB_SCHEMA_FIELDS__METRIC='COSINE2'")
    monkeypatch.delenv("KB_SCHEMA_FIELDS__METRIC")
    monkeypatch.setenv("KB_METRIC", "cosine2")
    with pytest.raises(ValidationError) as raised:
        KBSettings()
    assert describe_settings_error(raised.value).startswith("invalid setting KB_METRIC='COSINE2'")
    monkeypatch.delenv("KB_METRIC")
    with pytest.raises(ValidationError) as raised:
        KBSettings(top_k=0)
    assert describe_settings_error(raised.value, {"top_k": "--top-k"}).startswith("invalid setting --top-k=0")
    with pytest.raises(ValidationError) as raised:
        KBSettings(chunk_tokens=64, chunk_overlap=64)
    assert describe_settings_error(raised.value).startswith("invalid settings: chunk_overlap (64)")


def test_with_settings_takes_flat_and_grouped_names(sample_lookup) -> None:
    flat = sample_lookup.with_settings(top_k=5, max_evidence_blocks=2)
    grouped_ = sample_lookup.with_settings(retrieval={"top_k": 5}, evidence={"max_evidence_blocks": 2})
    assert flat.settings == grouped_.settings != sample_lookup.settings
    assert (flat.settings.retrieval.top_k, flat.settings.evidence.max_evidence_blocks) == (5, 2)
    query = "RedisMemoryHigh on cache-01"
    assert flat.lookup(query).evidence_blocks == grouped_.lookup(query).evidence_blocks
    with pytest.raises(ValidationError):
        sample_lookup.with_settings(top_k=0)  # validated like any setting
    with pytest.raises(UnsupportedOverrideError, match=r"^collection cannot be overridden"):
        sample_lookup.with_settings(storage={"collection": "other"})
