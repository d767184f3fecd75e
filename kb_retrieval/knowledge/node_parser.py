"""The heading chunker as a LlamaIndex ``NodeParser``, for a user's own ``IngestionPipeline`` or index.

Each document is read as ingest reads it (:mod:`kb_retrieval.knowledge.documents`: frontmatter or metadata, HTML to
text) and cut along its Markdown headings (:func:`~kb_retrieval.knowledge.chunker.chunk_document`): one node per
chunk, its id the chunk id ingest would write (deterministic: the same document gives the same ids), its metadata
the document's with ``title``, ``breadcrumb``, ``category``, ``keywords`` and ``entities`` added (the breadcrumb is
what the embedding reads before the text, as in ingest's rows). A document that cannot be read (no text) gives no
node, with a warning.

Example:
    >>> from llama_index.core import Document
    >>> parser = MarkdownHeadingNodeParser(chunk_tokens=220)
    >>> nodes = parser.get_nodes_from_documents([Document(text="# Redis OOM\\n\\n## Fix\\nRaise maxmemory.")])
    >>> nodes[0].metadata["breadcrumb"], nodes[0].text
    ('Redis OOM > Fix', 'Raise maxmemory.')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from llama_index.core.node_parser import NodeParser
from llama_index.core.schema import BaseNode, NodeRelationship, TextNode
from pydantic import Field

from kb_retrieval.knowledge.chunker import chunk_document
from kb_retrieval.knowledge.documents import knowledge_base_from_documents

#: Keys of the document the embedding text leaves out (the breadcrumb and title lead it, as in ingest).
_NOT_EMBEDDED = ("keywords", "entities", "category")


class MarkdownHeadingNodeParser(NodeParser):
    """Chunks along Markdown headings with breadcrumbs (the chunker ingest uses), as a ``NodeParser``."""

    chunk_tokens: int = Field(default=220, gt=0, description="Target chunk size in (approximate) tokens.")
    chunk_overlap: int = Field(default=32, ge=0, description="Overlap between split chunks, in tokens.")
    category_from: Literal["parent", "top", "none"] = Field(
        default="parent", description="Where a document without category/domain metadata gets one (its folder)."
    )

    @classmethod
    def class_name(cls) -> str:
        return "MarkdownHeadingNodeParser"

    def _parse_nodes(self, nodes: Sequence[BaseNode], show_progress: bool = False, **kwargs: Any) -> list[BaseNode]:
        parsed: list[BaseNode] = []
        for node in nodes:
            kb = knowledge_base_from_documents([node], category_from=self.category_from)
            for doc in kb.documents:
                for chunk in chunk_document(doc, self.chunk_tokens, self.chunk_overlap):
                    metadata = {
                        **node.metadata,
                        "title": doc.title,
                        "breadcrumb": chunk.breadcrumb_text,
                        "category": doc.category or "",
                        "keywords": doc.keywords,
                        "entities": doc.entities,
                    }
                    parsed.append(
                        TextNode(
                            id_=chunk.chunk_id,
                            text=chunk.content,
                            metadata=metadata,
                            excluded_embed_metadata_keys=[*node.excluded_embed_metadata_keys, *_NOT_EMBEDDED],
                            excluded_llm_metadata_keys=list(node.excluded_llm_metadata_keys),
                            relationships={NodeRelationship.SOURCE: node.as_related_node_info()},
                        )
                    )
        return parsed
