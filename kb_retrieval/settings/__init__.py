"""The settings groups of :class:`~kb_retrieval.config.KBSettings`, one nested model per concern, and their flat
short forms.

Each group is read from the environment as ``KB_<GROUP>__<NAME>`` (``KB_RETRIEVAL__TOP_K=50``); every setting keeps
its flat short form too (``KB_TOP_K``, ``KBSettings(top_k=50)``, :mod:`.flat`). The library reads them grouped:
``settings.retrieval.top_k``. The fitted ranking weights are no group of these (``KBSettings.scoring``).

Example:
    >>> sorted(GROUPS)
    ['chunking', 'embedding', 'evidence', 'retrieval', 'schema_fields', 'sidecar', 'storage', 'trace']
"""

from __future__ import annotations

from kb_retrieval.settings.flat import (
    FLAT,
    FLAT_PREFIX,
    GROUPS,
    FlatNamesSource,
    RefusingSource,
    flattened,
    grouped,
    short_name,
)
from kb_retrieval.settings.index import (
    ChunkingSettings,
    ConsistencyLevel,
    EmbeddingSettings,
    IndexType,
    Metric,
    SchemaFieldsSettings,
    StorageSettings,
)
from kb_retrieval.settings.lookup import (
    EvidenceSettings,
    LookupPlan,
    RetrievalSettings,
    SidecarSettings,
    TraceSettings,
    VectorStoreMode,
)

__all__ = [
    "FLAT",
    "FLAT_PREFIX",
    "GROUPS",
    "ChunkingSettings",
    "ConsistencyLevel",
    "EmbeddingSettings",
    "EvidenceSettings",
    "FlatNamesSource",
    "IndexType",
    "LookupPlan",
    "Metric",
    "RefusingSource",
    "RetrievalSettings",
    "SchemaFieldsSettings",
    "SidecarSettings",
    "StorageSettings",
    "TraceSettings",
    "VectorStoreMode",
    "flattened",
    "grouped",
    "short_name",
]
