"""The stock LlamaIndex retrievers, set up as a user would, for comparison.

Documents are read whole (frontmatter included), parsed by ``MarkdownNodeParser`` then ``SentenceSplitter(512)``,
embedded with the same all-MiniLM-L6-v2 model into a Milvus Lite collection (COSINE) through ``MilvusVectorStore``;
each retriever returns its top 20 chunks:

- ``dense``: ``VectorIndexRetriever`` over that collection;
- ``bm25``: ``BM25Retriever`` over the same chunks;
- ``fusion``: ``QueryFusionRetriever`` of the two with reciprocal-rank fusion and no query generation.

Rankings are mapped to documents (first occurrence of each source) for document-level metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.node_parser import MarkdownNodeParser, SentenceSplitter
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.core.retrievers.fusion_retriever import FUSION_MODES
from llama_index.core.schema import BaseNode
from llama_index.vector_stores.milvus import MilvusVectorStore

from kb_retrieval.knowledge.loader import MARKDOWN_SUFFIXES

TOP_K = 20


def read_documents(roots: Sequence[Path]) -> list[Document]:
    """Every Markdown file under the roots as one Document, ``source`` = path relative to its root."""
    docs = []
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file() and path.suffix.lower() in MARKDOWN_SUFFIXES:
                source = path.relative_to(root).as_posix()
                text = path.read_text(encoding="utf-8", errors="replace")
                if text.strip():
                    docs.append(Document(text=text, id_=source, metadata={"source": source}))
    return docs


def stock_nodes(documents: list[Document]) -> list[BaseNode]:
    """The documents split as stock LlamaIndex splits them: Markdown sections, then 512-token sentence chunks."""
    nodes = MarkdownNodeParser().get_nodes_from_documents(documents)
    return SentenceSplitter(chunk_size=512).get_nodes_from_documents(nodes)  # type: ignore[arg-type]


@dataclass
class StockRetrievers:
    """The stock LlamaIndex retrievers the bench compares against (dense, BM25, their fusion) over one collection."""

    dense: BaseRetriever
    bm25: BaseRetriever
    fusion: BaseRetriever
    chunk_count: int

    def by_name(self) -> dict[str, BaseRetriever]:
        return {"stock_dense": self.dense, "stock_bm25": self.bm25, "stock_fusion": self.fusion}


def build_stock(roots: Sequence[Path], uri: str, collection: str, embed_model: BaseEmbedding) -> StockRetrievers:
    """Index ``roots`` the stock LlamaIndex way in a Milvus collection of its own and build its retrievers."""
    from llama_index.retrievers.bm25 import BM25Retriever

    nodes = stock_nodes(read_documents(roots))
    store = MilvusVectorStore(uri=uri, collection_name=collection, dim=384, similarity_metric="COSINE", overwrite=True)
    index = VectorStoreIndex(
        nodes, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed_model
    )
    dense = index.as_retriever(similarity_top_k=TOP_K)
    bm25 = BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=TOP_K)
    # num_queries=1: no LLM query generation; the mock only satisfies the constructor (no OpenAI here).
    fusion = QueryFusionRetriever(
        [dense, bm25],
        llm=MockLLM(),
        mode=FUSION_MODES.RECIPROCAL_RANK,
        similarity_top_k=TOP_K,
        num_queries=1,
        use_async=False,
    )
    return StockRetrievers(dense=dense, bm25=bm25, fusion=fusion, chunk_count=len(nodes))


def document_ranking(retriever: BaseRetriever, query: str) -> list[str]:
    """Sources in the order the retriever first returns a chunk of each."""
    seen: dict[str, None] = {}
    for node in retriever.retrieve(query):
        source = node.node.metadata.get("source") or node.node.ref_doc_id
        if source:
            seen.setdefault(str(source), None)
    return list(seen)
