"""Attaching a collection written by stock LlamaIndex ``MilvusVectorStore`` (kb_retrieval/indexing/milvus/schema.py:
its field mapping, the features it cannot serve, titles from node metadata). Real Milvus Lite, the real model."""

from __future__ import annotations

import shutil
from pathlib import Path

from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.vector_stores.milvus import MilvusVectorStore

from kb_retrieval.config import KBSettings
from kb_retrieval.engine import KnowledgeLookup
from tests.conftest import SAMPLE_KB
from tests.support.kb import ALERT


def test_a_collection_written_by_stock_milvus_vector_store_answers(tmp_path: Path, embed_model) -> None:
    uri = str(tmp_path / "milvus.db")
    store = MilvusVectorStore(uri=uri, collection_name="stock", dim=384, overwrite=True)
    documents = [
        Document(text=p.read_text(encoding="utf-8"), id_=str(p.relative_to(SAMPLE_KB)))
        for p in sorted(SAMPLE_KB.glob("redis/*.md")) + sorted(SAMPLE_KB.glob("mysql/*.md"))
    ]
    VectorStoreIndex.from_documents(
        documents, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed_model
    )
    store.client.close()
    settings = KBSettings(  # the mapping the README shows: stock field names
        state_dir=tmp_path,
        milvus_uri=uri,
        collection="stock",
        id_field="id",
        content_field="text",
        vector_field="embedding",
        source_field="doc_id",
        metric="IP",  # the store's default similarity_metric
    )
    for mode in ("sdk", "vectorstore"):
        lookup = KnowledgeLookup(settings.model_copy(update={"vector_store_mode": mode}), embed_model=embed_model)
        result = lookup.lookup(ALERT)
        assert result.found, mode
        assert result.evidence_blocks[0].source == "redis/memory-usage-high.md", mode
        # No BM25 function in a stock collection either: BM25 runs in process, and the lookup says so.
        # embedding_check: a stock collection has no ingest record, so the query model's id is not checked (noted).
        assert set(lookup.features_off) == {"category_filter", "metadata", "milvus_bm25", "embedding_check"}
        assert "no recorded model" in lookup.features_off["embedding_check"]
        assert lookup.lexical_mode == "in_process_bm25"
        notes = result.query_transform.notes
        assert any(n.startswith("L0 off:") for n in notes) and any(n.startswith("category_filter off") for n in notes)
        assert any(n.startswith("document ranking off:") and "'stock_docs'" in n for n in notes)
        assert not result.rerank_trace.entries[0].ranking  # ranked by the rule reranker's score, as before
        row = lookup.traces.rows()[-1]
        assert "category_filter off" in " ".join(row.retrieval_details["query_transform"]["notes"])
        lookup.close()


def test_a_stock_collection_of_simple_directory_reader_files_names_its_documents_by_file(
    tmp_path: Path, embed_model
) -> None:
    """Issue 38 item 6: ``VectorStoreIndex`` + ``MilvusVectorStore`` over ``SimpleDirectoryReader`` output keeps each
    node's ``file_path`` / ``file_name`` as dynamic fields; ``KB_SOURCE_FIELD`` names one and the documents are their
    files, not the reader's random doc ids."""
    import pytest
    from llama_index.core import SimpleDirectoryReader

    from kb_retrieval.indexing.milvus import SchemaMismatchError

    kb = tmp_path / "kb"
    shutil.copytree(SAMPLE_KB / "redis", kb / "redis")
    shutil.copytree(SAMPLE_KB / "mysql", kb / "mysql")
    uri = str(tmp_path / "milvus.db")
    store = MilvusVectorStore(uri=uri, collection_name="stock", dim=384, overwrite=True)
    documents = SimpleDirectoryReader(str(kb), recursive=True).load_data()
    VectorStoreIndex.from_documents(
        documents, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed_model
    )
    store.client.close()
    stock = {"id_field": "id", "content_field": "text", "vector_field": "embedding", "metric": "IP"}
    settings = KBSettings(state_dir=tmp_path, milvus_uri=uri, collection="stock", vector_store_mode="sdk", **stock)
    with pytest.raises(SchemaMismatchError, match="KB_SOURCE_FIELD=file_path or file_name"):
        KnowledgeLookup(settings, embed_model=embed_model)  # no 'source' field: the error says what to name
    for key, expected, mode in (
        ("file_path", str(kb / "redis" / "memory-usage-high.md"), "sdk"),
        ("file_name", "memory-usage-high.md", "sdk"),
        ("file_path", str(kb / "redis" / "memory-usage-high.md"), "vectorstore"),
    ):
        update = {"source_field": key, "vector_store_mode": mode}
        lookup = KnowledgeLookup(settings.model_copy(update=update), embed_model=embed_model)
        result = lookup.lookup(ALERT)
        assert result.found and result.evidence_blocks[0].source == expected, (key, mode)
        assert all(block.source.endswith(".md") for block in result.evidence_blocks)  # files, no UUIDs
        lookup.close()


def test_a_stock_collection_keeps_its_titles_from_node_metadata(tmp_path: Path, embed_model) -> None:
    """Issue 38 item 6: a node's ``title`` (or ``TitleExtractor``'s ``document_title``) kept by ``MilvusVectorStore``
    as a dynamic field is each candidate's title on every path and plan, found without configuration; a
    ``KB_TITLE_FIELD`` the collection lacks is refused by name."""
    import pytest

    from kb_retrieval.indexing.milvus import SchemaMismatchError

    stock = {"id_field": "id", "content_field": "text", "vector_field": "embedding", "metric": "IP"}
    for key in ("title", "document_title"):
        uri = str(tmp_path / f"{key}.db")
        store = MilvusVectorStore(uri=uri, collection_name="stock", dim=384, overwrite=True)
        paths = sorted(SAMPLE_KB.glob("redis/*.md")) + sorted(SAMPLE_KB.glob("mysql/*.md"))
        documents = [
            Document(
                text=p.read_text(encoding="utf-8"),
                id_=str(p.relative_to(SAMPLE_KB)),
                metadata={key: f"Runbook {p.stem.replace('-', ' ')}"},
            )
            for p in paths
        ]
        VectorStoreIndex.from_documents(
            documents, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed_model
        )
        store.client.close()
        settings = KBSettings(
            state_dir=tmp_path / key, milvus_uri=uri, collection="stock", source_field="doc_id", **stock
        )
        for mode, plan in (("sdk", "milvus"), ("vectorstore", "milvus"), ("auto", "memory")):
            update = {"vector_store_mode": mode, "lookup_plan": plan}
            lookup = KnowledgeLookup(settings.model_copy(update=update), embed_model=embed_model)
            assert lookup.settings.schema_fields.title_field == key, (key, mode)
            result = lookup.lookup(ALERT)
            first = result.evidence_blocks[0]
            assert first.source == "redis/memory-usage-high.md", (key, mode)
            assert first.title == "Runbook memory usage high", (key, mode)
            assert all(block.title and block.title.startswith("Runbook ") for block in result.evidence_blocks)
            lookup.close()
    with pytest.raises(SchemaMismatchError, match=r"no field or dynamic key 'heading'.*KB_TITLE_FIELD"):
        KnowledgeLookup(settings.model_copy(update={"title_field": "heading"}), embed_model=embed_model)
