"""The knowledge base on disk: Markdown files with optional YAML frontmatter, chunked along headings."""

from kb_retrieval.knowledge.chunker import Chunk, chunk_document
from kb_retrieval.knowledge.loader import KbDocument, LoadedKnowledgeBase, SkippedFile, load_knowledge_base

__all__ = [
    "Chunk",
    "KbDocument",
    "LoadedKnowledgeBase",
    "SkippedFile",
    "chunk_document",
    "load_knowledge_base",
]
