"""Issue 40: FAISS-format Milvus Lite index files (HNSW: what AUTOINDEX is on Lite) are checked before Lite opens
the data dir, like the NumPy, Arrow and JSON ones: a file cut short is removed (Lite rebuilds it), a whole one kept.
Real Milvus Lite, real FAISS files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pymilvus import MilvusClient

from kb_retrieval.indexing.lite_files import check_lite_files, index_file_problem

faiss = pytest.importorskip("faiss")


def test_a_faiss_index_file_cut_short_is_named(tmp_path: Path) -> None:
    index = faiss.IndexHNSWFlat(8, 16)
    index.add(np.random.default_rng(0).random((500, 8), dtype=np.float32))
    whole = tmp_path / "data_000001_000500.vector.hnsw.idx"
    faiss.write_index(index, str(whole))
    assert index_file_problem(whole) is None
    data = whole.read_bytes()
    for cut in (len(data) // 2, len(data) - 8, 64):
        part = tmp_path / f"cut{cut}.idx"
        part.write_bytes(data[:cut])
        problem = index_file_problem(part)
        assert problem is not None and "FAISS cannot read it" in problem and "\n" not in problem


def test_a_lite_autoindex_hnsw_file_cut_short_is_removed_and_rebuilt(tmp_path: Path) -> None:
    data_dir = tmp_path / "milvus.db"
    vectors = np.random.default_rng(1).random((300, 8), dtype=np.float32)
    client = MilvusClient(uri=str(data_dir))
    client.create_collection("c", dimension=8)  # AUTOINDEX: on Lite an HNSW index, a FAISS file per segment
    client.insert("c", [{"id": i, "vector": v.tolist()} for i, v in enumerate(vectors)])
    client.flush("c")
    client.release_collection("c")
    client.load_collection("c")
    expected = client.search("c", data=[vectors[7].tolist()], limit=1)[0][0]["id"]
    client.close()
    from milvus_lite.server_manager import server_manager_instance

    server_manager_instance.release_server(str(data_dir))
    files = [p for p in data_dir.glob("collections/c/partitions/*/indexes/*.idx") if p.read_bytes()[:4] == b"IHNf"]
    assert files, sorted(p.name for p in data_dir.rglob("*.idx"))
    assert check_lite_files(data_dir) == []  # whole: kept
    target = files[0]
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    assert check_lite_files(data_dir) == [target]
    assert not target.exists()
    again = MilvusClient(uri=str(data_dir))
    again.load_collection("c")
    assert again.search("c", data=[vectors[7].tolist()], limit=1)[0][0]["id"] == expected
    again.close()
    server_manager_instance.release_server(str(data_dir))
