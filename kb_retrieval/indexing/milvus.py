"""The Milvus collection: connecting, the explicit schema, and checking an existing collection against it.

Filterable keys (``category``, ``source``) are real VARCHAR fields: on Milvus Lite a filter on a JSON path is
20-30x slower than on a scalar field. Everything else about a chunk lives in the ``metadata`` JSON field.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pymilvus import DataType, MilvusClient

from kb_retrieval.config import Settings

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


#: Milvus Lite serves gRPC from this process with grpc's default policy: at most one client ping every 5 minutes.
#: pymilvus pings every 10 s, calls or not, so an idle client was sent away ("too_many_pings") after about 30 s and
#: its reconnect could fail ("Fail connecting to server"), failing lookups and new clients alike. Lite clients ping
#: only during calls, and at most every 10 minutes.
LITE_GRPC_OPTIONS = {"grpc.keepalive_time_ms": 600_000, "grpc.keepalive_permit_without_calls": False}


def client_options(settings: Settings) -> dict[str, Any]:
    """Extra ``MilvusClient`` arguments for the configured URI (the gRPC keepalive policy for Milvus Lite)."""
    return {} if settings.is_milvus_server() else {"grpc_options": dict(LITE_GRPC_OPTIONS)}


class MilvusUnavailableError(ConnectionError):
    """The Milvus URI cannot be reached."""


class SchemaMismatchError(ValueError):
    """An existing collection does not match the configured schema."""


def connect(settings: Settings) -> MilvusClient:
    """A client for the configured URI: a Milvus Lite file (created on demand) or a reachable server."""
    uri = settings.resolved_milvus_uri()
    if settings.is_milvus_server():
        _check_reachable(uri, settings.milvus_timeout_s)
        try:
            return MilvusClient(uri=uri, token=settings.milvus_token, timeout=settings.milvus_timeout_s)
        except Exception as exc:
            raise MilvusUnavailableError(f"cannot connect to Milvus at {uri}: {exc}") from exc
    Path(uri).parent.mkdir(parents=True, exist_ok=True)
    return MilvusClient(uri=uri, **client_options(settings))


def _check_reachable(uri: str, timeout_s: float) -> None:
    """Fail within the timeout, with the URI in the message, when nothing listens at host:port."""
    parsed = urlparse(uri)
    host = parsed.hostname or "localhost"
    port = parsed.port or (443 if parsed.scheme == "https" else 19530)
    try:
        with socket.create_connection((host, port), timeout=min(timeout_s, 5.0)):
            pass
    except OSError as exc:
        raise MilvusUnavailableError(f"Milvus server unreachable at {uri}: {exc.strerror or exc}") from exc


def build_schema(settings: Settings) -> Any:
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field(settings.id_field, DataType.VARCHAR, is_primary=True, max_length=VARCHAR_LIMITS["id"])
    schema.add_field(settings.content_field, DataType.VARCHAR, max_length=VARCHAR_LIMITS["content"])
    schema.add_field(settings.vector_field, DataType.FLOAT_VECTOR, dim=settings.dim)
    schema.add_field(settings.metadata_field, DataType.JSON)
    schema.add_field(settings.category_field, DataType.VARCHAR, max_length=VARCHAR_LIMITS["category"])
    schema.add_field(settings.source_field, DataType.VARCHAR, max_length=VARCHAR_LIMITS["source"])
    return schema


def ensure_collection(client: MilvusClient, settings: Settings, *, create: bool = True) -> None:
    """Create the collection when it is missing (if ``create``), else check it; then load it for search."""
    name = settings.collection
    if not client.has_collection(name):
        if not create:
            raise SchemaMismatchError(f"Milvus collection '{name}' does not exist: run `kb-retrieval ingest` first")
        index_params = client.prepare_index_params()
        index_type = "AUTOINDEX" if settings.is_milvus_server() else "FLAT"
        index_params.add_index(settings.vector_field, index_type=index_type, metric_type=settings.metric)
        client.create_collection(
            name, schema=build_schema(settings), index_params=index_params, consistency_level="Strong"
        )
    else:
        validate_collection(client, settings)
    client.load_collection(name)


def validate_collection(client: MilvusClient, settings: Settings) -> None:
    """Raise :class:`SchemaMismatchError` naming every way the collection differs from the settings."""
    name = settings.collection
    description = client.describe_collection(name)
    fields = {f["name"]: f for f in description["fields"]}
    problems: list[str] = []
    expected = {
        settings.id_field: DataType.VARCHAR,
        settings.content_field: DataType.VARCHAR,
        settings.vector_field: DataType.FLOAT_VECTOR,
        settings.metadata_field: DataType.JSON,
        settings.category_field: DataType.VARCHAR,
        settings.source_field: DataType.VARCHAR,
    }
    for field_name, data_type in expected.items():
        found = fields.get(field_name)
        if found is None:
            problems.append(f"missing field '{field_name}' ({data_type.name})")
        elif found["type"] != data_type:
            problems.append(f"field '{field_name}' is {found['type'].name}, expected {data_type.name}")
    vector = fields.get(settings.vector_field)
    if vector is not None and vector["type"] == DataType.FLOAT_VECTOR:
        dim = int(vector.get("params", {}).get("dim", -1))
        if dim != settings.dim:
            problems.append(f"vector field '{settings.vector_field}' has dimension {dim}, expected {settings.dim}")
        metric = _index_metric(client, name, settings.vector_field)
        if metric is not None and metric.upper() != settings.metric:
            problems.append(f"vector index metric is {metric}, expected {settings.metric} (KB_METRIC)")
    if problems:
        raise SchemaMismatchError(
            f"Milvus collection '{name}' does not match the configuration: " + "; ".join(problems)
        )


def _index_metric(client: MilvusClient, collection: str, field: str) -> str | None:
    for index_name in client.list_indexes(collection, field_name=field) or []:
        info = client.describe_index(collection, index_name)
        if info and info.get("metric_type"):
            return str(info["metric_type"])
    return None


def iter_rows(client: MilvusClient, settings: Settings, output_fields: list[str], batch_size: int = 2000) -> Any:
    """Every row of the collection (selected fields), in batches, without Milvus' query-window limit."""
    # Milvus Lite has no AllocTimestamp RPC; the iterator falls back to a client-side timestamp, which is correct
    # for our reads but logs a warning and a server-side error each time. Keep those out of the user's terminal.
    logging.getLogger("pymilvus.orm.iterator").setLevel(logging.ERROR)
    logging.getLogger("grpc._server").setLevel(logging.CRITICAL)
    iterator = client.query_iterator(settings.collection, batch_size=batch_size, filter="", output_fields=output_fields)
    try:
        while batch := iterator.next():
            yield from batch
    finally:
        iterator.close()
