"""L1 semantic retrieval over Milvus, through three paths side by side: ``vectorstore`` (LlamaIndex
MilvusVectorStore), ``sdk`` (pymilvus MilvusClient) and ``auto`` (vectorstore, falling back to sdk)."""

from kb_retrieval.retrieval.l1.auto import AutoPath
from kb_retrieval.retrieval.l1.base import L1Search, VectorPath
from kb_retrieval.retrieval.l1.retriever import L1Retriever, make_path
from kb_retrieval.retrieval.l1.sdk import SdkPath
from kb_retrieval.retrieval.l1.vectorstore import VectorStorePath

__all__ = ["AutoPath", "L1Retriever", "L1Search", "SdkPath", "VectorPath", "VectorStorePath", "make_path"]
