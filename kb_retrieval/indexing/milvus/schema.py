"""The chunk collection's schema and vector index, created or checked: the explicit fields, the BM25 function when
the engine has full-text search, the small collections kept beside the chunks, and what an existing collection
(one written by another tool) cannot serve.

Filterable keys (``category``, ``source``) are real VARCHAR fields: on Milvus Lite a filter on a JSON path is
20-30x slower than on a scalar field. Everything else about a chunk lives in the ``metadata`` JSON field.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pymilvus import DataType, Function, FunctionType, MilvusClient, MilvusException

from kb_retrieval.config import KBSettings
from kb_retrieval.indexing.milvus.connection import is_lite_engine

VARCHAR_LIMITS = {"id": 64, "content": 65535, "category": 256, "source": 1024}
# Filled-in metadata keys the pipeline reads back from the JSON field.
METADATA_KEYS = (
    "title",
    "breadcrumb",
    "keywords",
    "entities",
    "kb",
    "doc_hash",
    "position",
    "chunk_count",
    "ingested_at",
)


class SchemaMismatchError(ValueError):
    """An existing collection does not match the configured schema."""


#: The BM25 function of a collection with full-text search: analysed text in, sparse vector out.
BM25_FUNCTION = "lexical_bm25"


def build_schema(settings: KBSettings, *, full_text: bool = False, lite: bool = False) -> Any:
    """The chunk collection's schema; ``full_text`` adds the analysed text field, the sparse field and the BM25
    function between them (Milvus Lite 3.2, Milvus >= 2.5).

    On Milvus Lite the analysed text defaults to ``""``: a row written without it (by another writer, such as the
    bench's filler rows) is stored without BM25 terms instead of failing the write. A server's field has no default
    (whether Milvus 2.5 takes one on a BM25 input field was not tried here).
    """
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field(
        settings.schema_fields.id_field, DataType.VARCHAR, is_primary=True, max_length=VARCHAR_LIMITS["id"]
    )
    schema.add_field(settings.schema_fields.content_field, DataType.VARCHAR, max_length=VARCHAR_LIMITS["content"])
    schema.add_field(settings.schema_fields.vector_field, DataType.FLOAT_VECTOR, dim=settings.schema_fields.dim)
    schema.add_field(settings.schema_fields.metadata_field, DataType.JSON)
    schema.add_field(settings.schema_fields.category_field, DataType.VARCHAR, max_length=VARCHAR_LIMITS["category"])
    schema.add_field(settings.schema_fields.source_field, DataType.VARCHAR, max_length=VARCHAR_LIMITS["source"])
    if full_text:
        # The text arrives analysed (kb_retrieval.retrieval.bm25.analysed_text); the standard analyser keeps it.
        schema.add_field(
            settings.schema_fields.lexical_text_field,
            DataType.VARCHAR,
            max_length=VARCHAR_LIMITS["content"],
            enable_analyzer=True,
            analyzer_params={"type": "standard"},
            **({"default_value": ""} if lite else {}),
        )
        schema.add_field(settings.schema_fields.sparse_field, DataType.SPARSE_FLOAT_VECTOR)
        schema.add_function(
            Function(
                name=BM25_FUNCTION,
                function_type=FunctionType.BM25,
                input_field_names=[settings.schema_fields.lexical_text_field],
                output_field_names=[settings.schema_fields.sparse_field],
            )
        )
    return schema


#: The first Milvus server release with full-text search (BM25 functions, sparse fields).
FULL_TEXT_SINCE = (2, 5)


def engine_has_full_text(client: MilvusClient, lite: bool) -> bool:
    """True when the engine can hold a BM25 function: Milvus Lite (3.2 has it) or a server from Milvus 2.5.

    Asked of the server's version, not by trying: a Milvus 2.3 server accepts a collection with a sparse field
    (ignoring the function), fails its index, and its process died loading that collection (measured). An
    unreadable version counts as without.
    """
    if lite:
        return True
    try:
        version = str(client.get_server_version())
    except MilvusException:
        return False
    match = re.match(r"v?(\d+)\.(\d+)", version.strip())
    return match is not None and (int(match.group(1)), int(match.group(2))) >= FULL_TEXT_SINCE


def full_text_off(client: MilvusClient, settings: KBSettings) -> str | None:
    """``None`` when the collection has full-text search (a BM25 function from the analysed text field into the
    sparse field, which only an engine that supports it could create); else why not, in one line.

    A capability check on the collection itself, not a version guess: a collection created before this feature,
    or on an engine without full-text search (the Milvus 2.3 server), has no such function.
    """
    if not settings.schema_fields.lexical_text_field or not settings.schema_fields.sparse_field:
        return "no analysed text field configured (KB_LEXICAL_TEXT_FIELD)"
    for function in client.describe_collection(settings.storage.collection).get("functions") or []:
        kind = function.get("type")
        if (
            str(getattr(kind, "name", kind)).upper() == "BM25"
            and list(function.get("input_field_names") or []) == [settings.schema_fields.lexical_text_field]
            and list(function.get("output_field_names") or []) == [settings.schema_fields.sparse_field]
        ):
            return None
    return (
        f"collection '{settings.storage.collection}' has no BM25 function from "
        f"'{settings.schema_fields.lexical_text_field}' into "
        f"'{settings.schema_fields.sparse_field}' (made before full-text search, or on an engine without it "
        "such as Milvus 2.3; re-create it with `kb-retrieval ingest` to use it): BM25 runs in process"
    )


#: Build parameters of an index when ``KB_INDEX_PARAMS`` is empty (Milvus' own HNSW defaults are M=16,
#: efConstruction=200 too; written out so the report can say what was built).
DEFAULT_INDEX_PARAMS: dict[str, dict[str, int]] = {
    "HNSW": {"M": 16, "efConstruction": 200},
    "IVF_FLAT": {"nlist": 1024},
}
#: HNSW search breadth when ``KB_SEARCH_PARAMS`` is empty: at least this, and at least the limit (Milvus refuses
#: ef < limit). IVF probes this many lists.
DEFAULT_HNSW_EF = 64
DEFAULT_IVF_NPROBE = 16


def vector_index(settings: KBSettings, *, lite: bool) -> tuple[str, dict[str, Any]]:
    """The index type and build parameters ingest gives a new collection (``auto``: FLAT on Lite, HNSW else).

    Milvus Lite 3.2.2 at 100k vectors: FLAT ~161 ms a search, HNSW ~529 ms; a Milvus 2.3 server with HNSW ~5 ms.
    """
    index_type = settings.storage.index_type
    if index_type == "auto":
        index_type = "FLAT" if lite else "HNSW"
    params = dict(settings.storage.index_params) or dict(DEFAULT_INDEX_PARAMS.get(index_type, {}))
    return index_type, params


def search_params(settings: KBSettings, limit: int) -> dict[str, Any]:
    """``search_params`` for a vector search returning up to ``limit`` hits: the metric and the index's knobs.

    Example:
        >>> search_params(KBSettings(index_type="HNSW"), 20)
        {'metric_type': 'COSINE', 'params': {'ef': 64}}
    """
    params: dict[str, Any] = dict(settings.storage.search_params)
    if not params and settings.storage.index_type in ("auto", "HNSW"):
        params = {"ef": max(DEFAULT_HNSW_EF, limit)}  # FLAT (auto on Lite) ignores it
    elif not params and settings.storage.index_type == "IVF_FLAT":
        params = {"nprobe": DEFAULT_IVF_NPROBE}
    if "ef" in params:
        params["ef"] = max(int(params["ef"]), limit)
    return {"metric_type": settings.schema_fields.metric, "params": params}


def ensure_collection(client: MilvusClient, settings: KBSettings, *, create: bool = True) -> None:
    """Create the collection when it is missing (if ``create``), else check it; then load it for search."""
    name = settings.storage.collection
    if not client.has_collection(name):
        if not create:
            raise SchemaMismatchError(
                f"Milvus collection '{name}' does not exist in {settings.mask(settings.resolved_milvus_uri())}: "
                "run `kb-retrieval ingest` first, or point --state-dir / KB_STATE_DIR (or KB_MILVUS_URI) at the "
                "state that holds it (`make demo` uses .kb-state/demo)"
            )
        lite = is_lite_engine(client, settings)
        index_type, params = vector_index(settings, lite=lite)
        full_text = bool(
            settings.schema_fields.lexical_text_field and settings.schema_fields.sparse_field
        ) and engine_has_full_text(client, lite)
        index_params = client.prepare_index_params()
        index_params.add_index(
            settings.schema_fields.vector_field,
            index_type=index_type,
            metric_type=settings.schema_fields.metric,
            params=params,
        )
        if full_text:
            index_params.add_index(
                settings.schema_fields.sparse_field, index_type="SPARSE_INVERTED_INDEX", metric_type="BM25"
            )
        create_collection(client, name, build_schema(settings, full_text=full_text, lite=lite), index_params, settings)
    else:
        validate_collection(client, settings)
    client.load_collection(name)


def create_collection(client: MilvusClient, name: str, schema: Any, index_params: Any, settings: KBSettings) -> None:
    """Create a collection at the configured consistency level, with its indexes; another process creating it
    meanwhile is fine. The caller loads it.

    The indexes are created without pymilvus' wait for them to be built: it polls every 0.5 s, so each index of a
    new, empty collection cost 0.5 s (2.5 s of a fresh ingest's 8.9 s). Nothing is in the collection to build, and
    loading it waits on the server for what it needs."""
    try:
        client.create_collection(name, schema=schema, consistency_level=settings.storage.consistency_level)
    except MilvusException:
        if not client.has_collection(name):
            raise
        return  # the other process creates the indexes
    client.create_index(name, index_params, sync=False)


#: Milvus wants a vector field in every collection: the small collections kept beside the chunks (the L0 index, the
#: index version) carry this constant one, under a FLAT index, and are only ever read by key or in full.
SIDE_VECTOR_FIELD = "vector"
SIDE_VECTOR = (0.0, 0.0)


def ensure_side_collection(
    client: MilvusClient,
    settings: KBSettings,
    name: str,
    add_fields: Callable[[Any], None],
    *,
    vector_field: str = SIDE_VECTOR_FIELD,
    vector_dim: int = len(SIDE_VECTOR),
) -> None:
    """Create a collection kept beside the chunks when missing (its fields from ``add_fields``), and load it.

    Its one vector field (a Milvus 2.3 server allows one per collection) is the constant side vector unless the
    collection keeps real vectors there; either way it is read, never searched (FLAT index)."""
    if not client.has_collection(name):
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        add_fields(schema)
        schema.add_field(vector_field, DataType.FLOAT_VECTOR, dim=vector_dim)
        index_params = client.prepare_index_params()
        index_params.add_index(vector_field, index_type="FLAT", metric_type="L2")
        create_collection(client, name, schema, index_params, settings)
    client.load_collection(name)


def companion_problem(client: MilvusClient, name: str, required: set[str]) -> str | None:
    """Why ``name`` cannot be read as a companion collection with the ``required`` fields, or None when it can."""
    if not client.has_collection(name):
        return f"no companion collection '{name}'"
    fields = {f["name"] for f in client.describe_collection(name)["fields"]}
    missing = sorted(required - fields)
    return f"collection '{name}' lacks fields {', '.join(missing)}" if missing else None


def validate_collection(client: MilvusClient, settings: KBSettings) -> None:
    """Raise :class:`SchemaMismatchError` naming every way the collection differs from the settings."""
    name = settings.storage.collection
    description = client.describe_collection(name)
    fields = {f["name"]: f for f in description["fields"]}
    problems: list[str] = []
    expected = {
        settings.schema_fields.id_field: DataType.VARCHAR,
        settings.schema_fields.content_field: DataType.VARCHAR,
        settings.schema_fields.vector_field: DataType.FLOAT_VECTOR,
        settings.schema_fields.metadata_field: DataType.JSON,
        settings.schema_fields.category_field: DataType.VARCHAR,
        settings.schema_fields.source_field: DataType.VARCHAR,
    }
    optional = {settings.schema_fields.metadata_field, settings.schema_fields.category_field}
    for field_name, data_type in expected.items():
        found = fields.get(field_name)
        if found is None and field_name in optional:
            continue  # a collection written by another tool: the features that need it are off (features_off)
        if (
            found is None
            and field_name == settings.schema_fields.source_field
            and _dynamic_key(client, name, description, field_name)
        ):
            continue  # stock MilvusVectorStore keeps node metadata (file_path, file_name) as dynamic keys
        if found is None:
            problems.append(f"missing field '{field_name}' ({data_type.name})" + _stock_hint(field_name, settings))
        elif found["type"] != data_type:
            problems.append(f"field '{field_name}' is {found['type'].name}, expected {data_type.name}")
    title = settings.schema_fields.title_field
    if title and title not in fields and not _dynamic_key(client, name, description, title):
        problems.append(f"no field or dynamic key '{title}' holding text (KB_TITLE_FIELD)")
    vector = fields.get(settings.schema_fields.vector_field)
    if vector is not None and vector["type"] == DataType.FLOAT_VECTOR:
        dim = int(vector.get("params", {}).get("dim", -1))
        if dim != settings.schema_fields.dim:
            problems.append(
                f"vector field '{settings.schema_fields.vector_field}' has dimension {dim}, expected "
                f"{settings.schema_fields.dim}"
            )
        metric = _index_metric(client, name, settings.schema_fields.vector_field)
        if metric is not None and metric.upper() != settings.schema_fields.metric:
            problems.append(f"vector index metric is {metric}, expected {settings.schema_fields.metric} (KB_METRIC)")
    if problems:
        raise SchemaMismatchError(
            f"Milvus collection '{name}' does not match the configuration: " + "; ".join(problems)
        )


def _dynamic_key(client: MilvusClient, name: str, description: dict[str, Any], key: str) -> bool:
    """Whether the collection keeps ``key`` as a dynamic field holding text (read on one row that has it)."""
    if not description.get("enable_dynamic_field"):
        return False
    rows = client.query(name, filter=f'{key} != ""', limit=1, output_fields=[key])
    return bool(rows) and isinstance(rows[0].get(key), str)


def _stock_hint(field_name: str, settings: KBSettings) -> str:
    if field_name != settings.schema_fields.source_field:
        return ""
    return (
        " (a collection written by stock LlamaIndex MilvusVectorStore keeps each node's file_path and file_name as "
        "dynamic fields: KB_SOURCE_FIELD=file_path or file_name names documents by their files)"
    )


def features_off(client: MilvusClient, settings: KBSettings) -> dict[str, str]:
    """Features the collection cannot serve, each with the reason: a collection written by another tool (e.g. stock
    LlamaIndex ``MilvusVectorStore``) has no category field (no domain filter) and no metadata field (no titles,
    breadcrumbs or keywords on candidates)."""
    fields = {f["name"] for f in client.describe_collection(settings.storage.collection)["fields"]}
    off: dict[str, str] = {}
    if not settings.schema_fields.category_field or settings.schema_fields.category_field not in fields:
        off["category_filter"] = f"no category field '{settings.schema_fields.category_field}' in the collection"
    if not settings.schema_fields.metadata_field or settings.schema_fields.metadata_field not in fields:
        off["metadata"] = f"no metadata field '{settings.schema_fields.metadata_field}' in the collection"
    return off


def without_missing_fields(client: MilvusClient, settings: KBSettings) -> KBSettings:
    """``settings`` with the optional fields the collection lacks set to ``""`` (nothing asks Milvus for them)."""
    off = features_off(client, settings)
    update = {}
    if "category_filter" in off:
        update["category_field"] = ""
    if "metadata" in off:
        update["metadata_field"] = ""
        if not settings.schema_fields.title_field and (title := stock_title_key(client, settings)):
            update["title_field"] = title
    return settings.updated(**update) if update else settings


#: Node metadata keys that hold a title in a collection written by stock LlamaIndex (``MilvusVectorStore`` keeps
#: node metadata as dynamic fields): a reader's or the user's ``title``, ``TitleExtractor``'s ``document_title``.
STOCK_TITLE_KEYS = ("title", "document_title")


def stock_title_key(client: MilvusClient, settings: KBSettings) -> str | None:
    """The first of :data:`STOCK_TITLE_KEYS` the collection keeps as a dynamic field holding text, or None."""
    description = client.describe_collection(settings.storage.collection)
    fields = {f["name"] for f in description["fields"]}
    for key in STOCK_TITLE_KEYS:
        if key in fields or _dynamic_key(client, settings.storage.collection, description, key):
            return key
    return None


def _index_metric(client: MilvusClient, collection: str, field: str) -> str | None:
    for index_name in client.list_indexes(collection, field_name=field) or []:
        info = client.describe_index(collection, index_name)
        if info and info.get("metric_type"):
            return str(info["metric_type"])
    return None
