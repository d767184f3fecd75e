"""One settings object for the whole library (environment prefix ``KB_``), its groups in :mod:`kb_retrieval.settings`.

Every path, URI, mode, threshold and budget is named and documented once. CLI flags override the environment; the
environment overrides the defaults.

Example:
    >>> settings = KBSettings(state_dir="/tmp/kb", vector_store_mode="sdk")
    >>> settings.resolved_milvus_uri().endswith("milvus.db")
    True
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Self, cast

from pydantic import Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

# Masking lives in its own module, the groups in kb_retrieval.settings; these names stay importable from here.
from kb_retrieval.masking import MASK, SECRET_PARAMETERS, mask_secrets, mask_url, url_secrets
from kb_retrieval.scoring_profile import BUILT_IN_PROFILE, ScoringProfile, environment_refusal, load_profile
from kb_retrieval.settings import (
    FLAT,
    GROUPS,
    ChunkingSettings,
    EmbeddingSettings,
    EvidenceSettings,
    FlatNamesSource,
    RefusingSource,
    RetrievalSettings,
    SchemaFieldsSettings,
    SidecarSettings,
    StorageSettings,
    TraceSettings,
    flattened,
    grouped,
)

#: True while :meth:`KBSettings.updated` validates a copy: its values are complete, so no source but them is read.
_COPYING: ContextVar[bool] = ContextVar("kb_settings_copying", default=False)

__all__ = [
    "MASK",
    "SECRET_PARAMETERS",
    "KBSettings",
    "mask_secrets",
    "mask_url",
    "url_secrets",
]


class KBSettings(BaseSettings):
    """Configuration of ingest and lookup (named apart from ``llama_index.core.Settings``; ``Settings`` is an alias).

    Grouped (``settings.retrieval.top_k``, ``KB_RETRIEVAL__TOP_K``); flat short forms in (``top_k=``, ``KB_TOP_K``)."""

    model_config = SettingsConfigDict(
        env_prefix="KB_", extra="ignore", validate_assignment=True, hide_input_in_errors=True, env_nested_delimiter="__"
    )

    storage: StorageSettings = Field(default_factory=StorageSettings)
    schema_fields: SchemaFieldsSettings = Field(default_factory=SchemaFieldsSettings)
    chunking: ChunkingSettings = Field(default_factory=ChunkingSettings)
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    evidence: EvidenceSettings = Field(default_factory=EvidenceSettings)
    trace: TraceSettings = Field(default_factory=TraceSettings)
    sidecar: SidecarSettings = Field(default_factory=SidecarSettings)

    lexical_weight: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="Rerank boost of the best lexical hit; others in proportion. A knob, not a fitted weight (the "
        "dense/BM25 balance a request may set, LlamaIndex's alpha); how much it counts in the document ranking is "
        "the scoring profile's rank_lexical.",
    )
    lexical_rescore_min: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Lexical hits the dense search missed join the candidates only from this BM25 score (relative "
        "to the best hit) up; 0 takes them all. In process they cost a second Milvus search; in Milvus they come "
        "with the one hybrid call. A cost knob (0: not fitted).",
    )
    doc_focus_weight: float = Field(
        default=0.45,
        ge=0,
        le=1,
        description="Boost by the share of a document's chunks among the candidates. A knob a request may set; how "
        "much it counts in the document ranking is the scoring profile's rank_doc_focus.",
    )
    # --- scoring: the fitted weights are a profile, chosen as a whole (kb_retrieval.scoring_profile) ------
    scoring_profile: Path | None = Field(
        default=None,
        description="A JSON file of a scoring profile (complete or partial: the weights it leaves out are the built-in "
        "profile's) with a version of its own, read once when the settings are made; unset: the built-in profile. "
        "The weights themselves are not environment settings (docs/configuration.md, 'The scoring profile').",
    )
    scoring: ScoringProfile = Field(
        default=BUILT_IN_PROFILE,
        description="The scoring profile lookups read: the built-in one, the file scoring_profile names, or one given "
        "in Python (KBSettings(scoring=...), the tuning tools); never read from the environment.",
        json_schema_extra={"environment": False},
    )

    @model_validator(mode="before")
    @classmethod
    def _scoring_from_profile(cls, data: Any) -> Any:
        # A profile given in Python wins over the file (a copy of these settings carries both); the file is read
        # only to make the settings.
        if isinstance(data, dict) and data.get("scoring_profile") and data.get("scoring") is None:
            data = {**data, "scoring": load_profile(Path(data["scoring_profile"]))}
        return data

    @field_validator("scoring_profile", mode="before")
    @classmethod
    def _no_profile_file(cls, value: object) -> object:
        return None if value == "" else value  # KB_SCORING_PROFILE= : the built-in profile

    def __init__(self, **values: Any) -> None:  # typed so: the flat names are keywords too, KBSettings(top_k=50)
        # pydantic-settings' own keywords start with "_" (``_env_file``); any other name must be a setting: the model
        # ignores extra names (the environment holds KB_ variables of other tools), a keyword it would drop silently.
        refuse_unknown({k: v for k, v in values.items() if not k.startswith("_")}, self.setting_names())
        super().__init__(**values)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Each source's flat names join their groups before the sources are merged: a keyword then still wins over
        # the environment whichever form either uses. The scoring weights are one versioned profile: a weight set one
        # by one in the environment would be a profile no trace names, so it is refused, not ignored, where the
        # environment is read (a copy of the settings, ``updated``, does not read it again).
        keywords, environment, dotenv = (FlatNamesSource(s) for s in (init_settings, env_settings, dotenv_settings))
        if _COPYING.get():
            return (keywords,)
        return keywords, RefusingSource(environment, environment_refusal), dotenv, file_secret_settings

    @model_validator(mode="before")
    @classmethod
    def _flat_names(cls, data: Any) -> Any:
        return grouped(data) if isinstance(data, Mapping) else data  # model_validate({"top_k": 50})

    @classmethod
    def setting_names(cls) -> list[str]:
        """Every setting's flat name: a group's settings by their short form, then the ungrouped ones (``scoring``)."""
        return [*FLAT, *(name for name in cls.model_fields if name not in GROUPS)]

    @classmethod
    def setting_field(cls, name: str) -> FieldInfo | None:
        """The field of the setting whose flat name is ``name`` (``top_k``: ``retrieval.top_k``); None: no setting."""
        if name in FLAT:
            group, field = FLAT[name]
            return GROUPS[group].model_fields[field]
        return cls.model_fields.get(name) if name not in GROUPS else None

    def setting(self, name: str) -> Any:
        """The value of the setting whose flat name is ``name``: ``settings.setting("top_k")``."""
        if name in FLAT:
            group, field = FLAT[name]
            return getattr(getattr(self, group), field)
        return getattr(self, name)

    def updated(self, **changes: Any) -> KBSettings:
        """A validated copy with ``changes`` (flat or grouped names) applied; the one way to change settings.

        Example:
            >>> KBSettings().updated(top_k=50, evidence={"max_evidence_blocks": 3}).retrieval.top_k
            50
        """
        refuse_unknown(changes, self.setting_names())
        data = self.model_dump()
        for name, value in grouped(changes).items():
            if isinstance(data.get(name), dict) and isinstance(value, Mapping):
                data[name] = {**data[name], **value}
            else:
                data[name] = value
        copying = _COPYING.set(True)  # validated from these values alone: the environment is not read again
        try:
            return type(self).model_validate(data)
        finally:
            _COPYING.reset(copying)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; with ``update``, :meth:`updated`'s validated one (flat names join their groups, none is junk)."""
        # Always deep: the groups are models, which a shallow copy would share with this one.
        return cast(Self, self.updated(**update)) if update else super().model_copy(deep=True)

    def resolved_milvus_uri(self) -> str:
        """The Milvus URI, defaulting to a Milvus Lite file in the state directory."""
        return self.storage.milvus_uri or str(self.storage.state_dir / "milvus.db")

    def secret_values(self) -> list[str]:
        """Every secret these settings hold: the Milvus token (and its password part), passwords in URLs."""
        found = []
        token = self.storage.milvus_token.get_secret_value()
        if token:
            found += [token, token.split(":", 1)[1]] if ":" in token else [token]
        for url in (self.storage.milvus_uri or "", self.trace.db_url or ""):
            found += url_secrets(url)
        return found

    def mask(self, text: str) -> str:
        """``text`` with these settings' secrets and any URL password replaced by ``***``."""
        return mask_secrets(text, self.secret_values())

    def resolved_trace_db_url(self) -> str:
        """The trace store URL, defaulting to a SQLite file in the state directory."""
        return self.trace.db_url or f"sqlite:///{self.storage.state_dir / 'traces.db'}"

    def resolved_model_cache_dir(self) -> Path:
        """The model cache folder, defaulting to the user's XDG cache folder."""
        if self.embedding.model_cache_dir is not None:
            return self.embedding.model_cache_dir.expanduser()
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        # The XDG spec says a relative value is invalid and must be ignored.
        base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
        return base / "kb-retrieval"

    def is_milvus_server(self) -> bool:
        """True when the URI names a Milvus server rather than a Milvus Lite file."""
        return self.resolved_milvus_uri().startswith(("http://", "https://", "tcp://", "grpc://"))

    def milvus_location(self) -> str:
        """Where the collection lives, for the keys of what a state dir keeps about it (state snapshots, the
        calibration): a server's URI, or ``lite:`` and the Milvus Lite file's path relative to the state dir when
        the file is inside it, so a state dir moved or copied whole keeps its snapshot and calibration (a Lite
        file elsewhere: its absolute path)."""
        uri = self.resolved_milvus_uri()
        if self.is_milvus_server():
            return uri
        lite = Path(uri).expanduser().resolve()
        try:
            return "lite:" + lite.relative_to(self.storage.state_dir.expanduser().resolve()).as_posix()
        except ValueError:
            return "lite:" + lite.as_posix()

    def l0_index_path(self) -> Path:
        """Where the L0 index of this collection is persisted."""
        return self.storage.state_dir / "l0" / f"{self.storage.collection}.json"


def refuse_unknown(values: Mapping[str, Any], names: Sequence[str]) -> None:
    """Raise when ``values`` (flat or grouped names) holds a name that is no setting; a scoring-profile weight given
    as a setting is named as one, with the way to set it.

    Example:
        >>> refuse_unknown({"top_k": 5, "retrieval": {"lexical_top_k": 9}}, KBSettings.setting_names())
        >>> refuse_unknown({"retrieval": {"top_kk": 5}}, KBSettings.setting_names())
        Traceback (most recent call last):
        ...
        ValueError: unknown setting(s) top_kk
    """
    unknown = sorted(set(flattened(values)) - set(names))
    if not unknown:
        return
    weights = [name for name in unknown if name in ScoringProfile.model_fields]
    hint = (
        ": a scoring-profile weight, not a setting: KBSettings(scoring=kb_retrieval.scoring_profile."
        f'BUILT_IN_PROFILE.variant("<suffix>", {weights[0]}=...)) or a profile file (KB_SCORING_PROFILE)'
        if weights
        else ""
    )
    raise ValueError(f"unknown setting(s) {', '.join(unknown)}{hint}")


def __getattr__(name: str) -> Any:
    if name == "Settings":  # the former name: it clashes with llama_index.core.Settings in code importing both
        warnings.warn(
            "kb_retrieval.config.Settings is deprecated: use KBSettings (the same class)",
            DeprecationWarning,
            stacklevel=2,
        )
        return KBSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
