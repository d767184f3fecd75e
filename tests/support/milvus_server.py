"""The test suite's Milvus standalone server: the bench's, in ``kb_retrieval.bench.milvus_server``."""

from __future__ import annotations

from kb_retrieval.bench.milvus_server import (
    ETCD_PEER,
    PORT_FLAGS,
    MilvusServer,
    MilvusServerError,
    find_milvus_server_executable,
    pick_free_ports,
    port_state,
)

__all__ = [
    "ETCD_PEER",
    "PORT_FLAGS",
    "MilvusServer",
    "MilvusServerError",
    "find_milvus_server_executable",
    "pick_free_ports",
    "port_state",
]
