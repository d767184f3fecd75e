"""The flat short form of every grouped setting, accepted wherever settings come in.

The library reads the settings grouped (``settings.retrieval.top_k``), and each one's full environment name is
``KB_<GROUP>__<NAME>``; its short form, one per setting and unique across groups, is what it was called before the
groups: ``top_k`` (``KB_TOP_K``, ``KBSettings(top_k=50)``, ``with_settings(top_k=50)``, a request's
``"settings": {"top_k": 50}``). The trace and sidecar groups drop their prefix inside the group
(``trace_db_url`` is ``trace.db_url``). A flat and a grouped name for the same setting, both given (two different
values in the environment), are refused, naming both.

Example:
    >>> grouped({"top_k": 50, "retrieval": {"lexical_top_k": 10}, "lexical_weight": 0.3})
    {'retrieval': {'lexical_top_k': 10, 'top_k': 50}, 'lexical_weight': 0.3}
    >>> FLAT["trace_db_url"]
    ('trace', 'db_url')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel
from pydantic_core import InitErrorDetails, ValidationError
from pydantic_settings import PydanticBaseSettingsSource, SettingsError

from kb_retrieval.settings.index import ChunkingSettings, EmbeddingSettings, SchemaFieldsSettings, StorageSettings
from kb_retrieval.settings.lookup import EvidenceSettings, RetrievalSettings, SidecarSettings, TraceSettings

__all__ = [
    "FLAT",
    "FLAT_PREFIX",
    "GROUPS",
    "FlatNamesSource",
    "RefusingSource",
    "WrappedSource",
    "flattened",
    "grouped",
    "short_name",
]

#: The groups by their attribute on ``KBSettings``, in the order the reference tables list them.
GROUPS: dict[str, type[BaseModel]] = {
    "storage": StorageSettings,
    "schema_fields": SchemaFieldsSettings,
    "chunking": ChunkingSettings,
    "embedding": EmbeddingSettings,
    "retrieval": RetrievalSettings,
    "evidence": EvidenceSettings,
    "trace": TraceSettings,
    "sidecar": SidecarSettings,
}
#: The prefix a group's settings carry in their flat short form (``trace_db_url`` is ``trace.db_url``).
FLAT_PREFIX = {"trace": "trace_", "sidecar": "sidecar_"}


def short_name(group: str, field: str) -> str:
    """The flat short form of ``group.field``."""
    return FLAT_PREFIX.get(group, "") + field


def _flat_names() -> dict[str, tuple[str, str]]:
    names: dict[str, tuple[str, str]] = {}
    for group, model in GROUPS.items():
        for field in model.model_fields:
            flat = short_name(group, field)
            if flat in names or flat in GROUPS:  # one short form per setting, or a flat name would be ambiguous
                raise RuntimeError(f"flat setting name {flat} is not unique ({names.get(flat, group)})")
            names[flat] = (group, field)
    return names


#: Every grouped setting's flat short form: ``{"top_k": ("retrieval", "top_k"), ...}``.
FLAT: dict[str, tuple[str, str]] = _flat_names()


def grouped(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every flat name moved into its group (names that are no flat short form left as they are).

    Raises:
        ValueError: A flat name and the grouped one of the same setting are both given.
    """
    out = {k: v for k, v in values.items() if k not in FLAT}
    for flat, value in values.items():
        if flat not in FLAT:
            continue
        group, field = FLAT[flat]
        given = out.get(group)
        members = dict(given.model_dump() if isinstance(given, BaseModel) else given or {})
        if field in members:
            raise ValueError(f"{flat} and {group}.{field} are the same setting, both given: give one")
        out[group] = {**members, field: value}
    return out


def flattened(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every group's settings under their flat names (the inverse of :func:`grouped`; a group given
    as a model counts every field of it).

    Example:
        >>> flattened({"retrieval": {"top_k": 50}, "trace": {"db_url": "sqlite:///t.db"}, "lexical_weight": 0.3})
        {'lexical_weight': 0.3, 'top_k': 50, 'trace_db_url': 'sqlite:///t.db'}

    Raises:
        ValueError: A flat name and the grouped one of the same setting are both given.
    """
    out = {k: v for k, v in values.items() if k not in GROUPS}
    for group, members in values.items():
        if group not in GROUPS:
            continue
        for field, value in (members.model_dump() if isinstance(members, BaseModel) else dict(members)).items():
            flat = short_name(group, field)
            if flat in out:
                raise ValueError(f"{flat} and {group}.{field} are the same setting, both given: give one")
            out[flat] = value
    return out


class WrappedSource(PydanticBaseSettingsSource):
    """A settings source that hands its work to another one (``inner``), for a wrapper to add a step."""

    def __init__(self, inner: PydanticBaseSettingsSource) -> None:
        super().__init__(inner.settings_cls, inner._init_state)
        self.inner = inner

    def _set_current_state(self, state: dict[str, Any]) -> None:
        super()._set_current_state(state)
        self.inner._set_current_state(state)

    def _set_settings_sources_data(self, states: dict[str, dict[str, Any]]) -> None:
        super()._set_settings_sources_data(states)
        self.inner._set_settings_sources_data(states)

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self.inner.get_field_value(field, field_name)

    @property
    def env_vars(self) -> Mapping[str, str | None] | None:
        """The variables the inner source reads (the environment, a dotenv file); None for the keywords."""
        return getattr(self.inner, "env_vars", None)

    def __call__(self) -> dict[str, Any]:
        return self.inner()


class FlatNamesSource(WrappedSource):
    """A settings source (the keywords, the environment, a dotenv file) with its flat names moved into their groups.

    In the environment ``KB_TOP_K`` and ``KB_RETRIEVAL__TOP_K`` may both be set to the same value; to two different
    values they are refused (``SettingsError`` naming both).
    """

    def __call__(self) -> dict[str, Any]:
        data = self.inner()
        env_vars = self.env_vars
        if env_vars is None:  # keywords: KBSettings(top_k=50)
            return grouped(data)
        prefix = str(self.config.get("env_prefix", ""))
        sensitive = bool(self.config.get("case_sensitive", False))
        for flat, (group, field) in FLAT.items():
            variable = prefix + flat.upper()
            raw = env_vars.get(variable if sensitive else variable.lower())
            if raw is None:
                continue
            value = self._decoded(flat, group, field, raw)
            members = data.setdefault(group, {})
            if field in members and members[field] != value:
                raise SettingsError(
                    f"{variable} and {prefix}{group.upper()}__{field.upper()} are the same setting, set to different "
                    "values: set one"
                )
            members[field] = value
        return data

    def _decoded(self, flat: str, group: str, field: str, raw: str) -> Any:
        info = GROUPS[group].model_fields[field]
        if not self.field_is_complex(info):
            return raw
        try:
            return self.decode_complex_value(flat, info, raw)
        except ValueError as error:  # pydantic-settings' own wording, which the CLI turns into its message
            raise SettingsError(
                f'error parsing value for field "{flat}" from source "{type(self.inner).__name__}"'
            ) from error


class RefusingSource(WrappedSource):
    """The environment source, refusing variables that are no longer read (``refusal`` says why, or None).

    The refusal is where the environment is read, when settings are made from it: a copy of settings
    (``KBSettings.updated``) is validated without reading the environment again. It is a ``ValidationError`` of the
    settings as a whole, the one a model validator raising ``ValueError`` gives.
    """

    def __init__(
        self, inner: PydanticBaseSettingsSource, refusal: Callable[[Mapping[str, str | None]], str | None]
    ) -> None:
        super().__init__(inner)
        self.refusal = refusal

    def __call__(self) -> dict[str, Any]:
        data = self.inner()
        if why := self.refusal(self.env_vars or {}):
            error = InitErrorDetails(type="value_error", loc=(), input=data, ctx={"error": ValueError(why)})
            raise ValidationError.from_exception_data(self.settings_cls.__name__, [error], hide_input=True)
        return data
