"""LlamaIndex ``Document`` s and nodes as knowledge-base documents, for ingest beside (or instead of) folders.

Whatever a LlamaIndex reader produced (``SimpleDirectoryReader``, a web or wiki reader) or an ``IngestionPipeline``
split, each becomes one :class:`~kb_retrieval.knowledge.loader.KbDocument`, through the same function that reads a
Markdown file (:func:`~kb_retrieval.knowledge.loader.document_from_text`), so its metadata works as frontmatter:
``title``, ``keywords``, ``category`` / ``domain``, ``entities``; the other keys are kept.

A document's identity (its source id, which makes ingest incremental and idempotent):

- ``file_path`` in its metadata (``SimpleDirectoryReader``): the path relative to ``root`` (by default the folder
  holding all the files given), so the same files read by ``SimpleDirectoryReader`` or ingested as a folder are
  the same documents. Random ``doc_id`` s (the reader's default) never decide it.
- else ``ref_doc_id`` (a node split from a document) or ``doc_id``.

Nodes of one document (same ``file_path`` or ``ref_doc_id``) are joined in their order (``start_char_idx`` where
every node has it) and chunked again by the heading chunker: every row of the collection is one of its chunks. The
pages of one PDF come back as one document per page with one ``file_path``: they join the same way. An HTML text
(``.html`` file, ``text/html`` type, or a text that starts like a page) is read into Markdown-like text first.
LlamaIndex's file bookkeeping keys (sizes, dates) are not metadata: they change when the content does not.

Example:
    >>> from llama_index.core import Document
    >>> kb = knowledge_base_from_documents([Document(text="# Redis OOM\\n\\nRaise maxmemory.", doc_id="redis-oom")])
    >>> kb.documents[0].source_id, kb.documents[0].title, kb.kb_id
    ('redis-oom', 'Redis OOM', 'documents:default')
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from llama_index.core.schema import BaseNode, MetadataMode

from kb_retrieval.knowledge.html import HTML_SUFFIXES, html_to_text, looks_like_html
from kb_retrieval.knowledge.loader import (
    KbDocument,
    KnowledgeBaseError,
    LoadedKnowledgeBase,
    SkipDocument,
    SkippedFile,
    document_from_text,
)

log = logging.getLogger(__name__)

#: ``SimpleDirectoryReader``'s bookkeeping keys: the path is the identity, the rest change without the content.
FILE_KEYS = frozenset(
    {"file_path", "file_name", "file_type", "file_size", "creation_date", "last_modified_date", "last_accessed_date"}
)
DEFAULT_NAME = "default"


def knowledge_base_from_documents(
    items: Sequence[BaseNode],
    *,
    root: str | Path | None = None,
    name: str | None = None,
    category_from: Literal["parent", "top", "none"] = "parent",
    max_file_bytes: int = 5_000_000,
) -> LoadedKnowledgeBase:
    """One knowledge-base root holding ``items`` (LlamaIndex ``Document`` s or nodes); see the module docstring.

    ``root``: the folder file paths are relative to (default: the one holding them all); ``name``: the root's
    identity in the collection when the documents are not all files (``documents:<name>``, default
    ``documents:default``). Items without usable text are skipped with the reason, as a folder's files are.
    """
    if not items:
        raise KnowledgeBaseError("no document given")
    groups: dict[tuple[str, str], list[BaseNode]] = {}
    for item in items:
        if not isinstance(item, BaseNode):
            raise TypeError(f"expected LlamaIndex Documents or nodes, got {type(item).__name__}")
        groups.setdefault(_identity(item), []).append(item)
    paths = [Path(key) for kind, key in groups if kind == "file"]
    base = Path(root).resolve() if root is not None else _common_folder(paths)
    files_only = len(paths) == len(groups) and name is None
    kb_root = base if base is not None else Path(".")
    documents: list[KbDocument] = []
    skipped: list[SkippedFile] = []
    for (kind, key), nodes in groups.items():
        source_id = _source_id(kind, key, base)
        try:
            documents.append(_document(source_id, nodes, category_from, max_file_bytes))
        except SkipDocument as skip:
            log.warning("skipped %s: %s", source_id, skip.reason)
            skipped.append(SkippedFile(source_id, skip.reason))
    kb = LoadedKnowledgeBase(
        kb_root, documents, skipped, name="" if files_only else f"documents:{name or DEFAULT_NAME}", complete=False
    )
    for doc in documents:
        doc.kb_id = kb.kb_id
    return kb


def _identity(node: BaseNode) -> tuple[str, str]:
    file_path = node.metadata.get("file_path")
    if isinstance(file_path, str) and file_path:
        return "file", os.path.realpath(file_path)
    return "id", node.ref_doc_id or node.node_id


def _common_folder(paths: list[Path]) -> Path | None:
    if not paths:
        return None
    return Path(os.path.commonpath([p.parent for p in paths]))


def _source_id(kind: str, key: str, base: Path | None) -> str:
    if kind == "id":
        return key
    assert base is not None
    path = Path(key)
    if not path.is_relative_to(base):
        raise KnowledgeBaseError(f"document file {path} is not under the root {base} given")
    return path.relative_to(base).as_posix()


def _document(source_id: str, nodes: list[BaseNode], category_from: str, max_file_bytes: int) -> KbDocument:
    starts = [getattr(n, "start_char_idx", None) for n in nodes]  # a TextNode's place in its document
    if len(nodes) > 1 and all(isinstance(start, int) for start in starts):
        order = sorted(range(len(nodes)), key=lambda i: int(starts[i] or 0))
        nodes = [nodes[i] for i in order]
    text = "\n\n".join(n.get_content(metadata_mode=MetadataMode.NONE) for n in nodes)
    size = len(text.encode())
    if size > max_file_bytes:
        raise SkipDocument(f"refused: {size} bytes is over the {max_file_bytes}-byte limit (KB_MAX_FILE_BYTES)")
    if not text.strip():
        raise SkipDocument("no text")
    metadata = {k: v for k, v in nodes[0].metadata.items() if k not in FILE_KEYS}
    file_name = str(nodes[0].metadata.get("file_name") or nodes[0].metadata.get("file_path") or "")
    is_html = file_name.lower().endswith(HTML_SUFFIXES) or nodes[0].metadata.get("file_type") == "text/html"
    # What the hash covers: the text as read (so a file read by SimpleDirectoryReader hashes as the folder's file
    # does, and switching between the two re-embeds nothing), then the metadata when there is any.
    raw = text.encode()
    if metadata:
        raw += b"\x00" + json.dumps(metadata, sort_keys=True, default=str, ensure_ascii=False).encode()
    if is_html or looks_like_html(text):
        page = html_to_text(text)
        text = page.text
        metadata.setdefault("title", page.title)
    return document_from_text(source_id, text, category_from, raw, metadata=_json_safe(metadata))


def _json_safe(metadata: dict[str, Any]) -> dict[str, Any]:
    """Metadata values as JSON would store them (a date as its ISO string), keys as strings."""
    loaded: dict[str, Any] = json.loads(json.dumps(metadata, default=str, ensure_ascii=False))
    return loaded
