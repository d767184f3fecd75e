"""LlamaIndex Documents and nodes as knowledge-base documents; HTML pages and text files in a folder; the heading
chunker as a NodeParser. Pure logic: no model, no Milvus."""

from __future__ import annotations

from pathlib import Path

import pytest
from llama_index.core import Document, SimpleDirectoryReader
from llama_index.core.ingestion import IngestionPipeline
from llama_index.core.schema import NodeRelationship, TextNode

from kb_retrieval.knowledge.chunker import chunk_document
from kb_retrieval.knowledge.documents import knowledge_base_from_documents
from kb_retrieval.knowledge.html import html_to_text
from kb_retrieval.knowledge.loader import KnowledgeBaseError, load_knowledge_base
from kb_retrieval.knowledge.node_parser import MarkdownHeadingNodeParser

pytestmark = pytest.mark.unit

PAGE = """<!DOCTYPE html><html><head><title>Nginx 502 Bad Gateway</title><style>p {color: red}</style>
<script>var x = "not text";</script></head><body><nav>Home | Docs</nav>
<h1>Nginx 502 Bad Gateway</h1><p>The upstream <b>php-fpm</b> pool is exhausted &amp; refuses connections.</p>
<h2>Fix</h2><ul><li>Raise pm.max_children</li><li>Restart php-fpm</li></ul>
<pre>systemctl restart php-fpm
journalctl -u php-fpm</pre></body></html>"""


def test_html_becomes_markdown_like_text_with_its_headings_and_title() -> None:
    page = html_to_text(PAGE)
    assert page.title == "Nginx 502 Bad Gateway"
    assert page.text.splitlines()[0] == "# Nginx 502 Bad Gateway"
    assert "## Fix" in page.text and "- Raise pm.max_children" in page.text
    assert "php-fpm pool is exhausted & refuses connections." in page.text
    assert "```\nsystemctl restart php-fpm\njournalctl -u php-fpm\n```" in page.text
    assert "not text" not in page.text and "color" not in page.text and "Home | Docs" not in page.text


def _folder(tmp_path: Path) -> Path:
    kb = tmp_path / "kb"
    (kb / "web").mkdir(parents=True)
    (kb / "redis.md").write_text("---\ntitle: Redis OOM\ncategory: redis\n---\n# Redis OOM\n\nRaise maxmemory.\n")
    (kb / "notes.txt").write_text("Kafka consumer lag: add partitions and consumers.\n")
    (kb / "web" / "nginx-502.html").write_text(PAGE)
    (kb / "diagram.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (kb / "manual.pdf").write_bytes(b"%PDF-1.4")
    return kb


def test_a_folder_loads_markdown_text_and_html_and_names_every_other_file(tmp_path: Path) -> None:
    kb = load_knowledge_base(_folder(tmp_path))
    docs = {d.source_id: d for d in kb.documents}
    assert sorted(docs) == ["notes.txt", "redis.md", "web/nginx-502.html"]
    assert docs["web/nginx-502.html"].title == "Nginx 502 Bad Gateway" and docs["web/nginx-502.html"].category == "web"
    assert "<" not in docs["web/nginx-502.html"].body
    assert docs["notes.txt"].title == "notes" and "Kafka consumer lag" in docs["notes.txt"].body
    skipped = {s.source_id: s.reason for s in kb.skipped}
    assert sorted(skipped) == ["diagram.png", "manual.pdf"]
    assert skipped["manual.pdf"].startswith("unsupported file type .pdf (ingested: .md, .markdown, .txt, .html")


def test_simple_directory_reader_output_has_the_folders_identity_and_content(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (folder / "diagram.png").unlink()
    (folder / "manual.pdf").unlink()
    read = SimpleDirectoryReader(str(folder), recursive=True).load_data()
    from_reader = knowledge_base_from_documents(read)
    from_folder = load_knowledge_base(folder)
    # The same files are the same documents, whichever way they came in: one root, the same source ids, titles.
    assert from_reader.kb_id == from_folder.kb_id and from_reader.name == "" and not from_reader.complete
    got = {d.source_id: (d.title, d.category, d.body.strip()) for d in from_reader.documents}
    want = {d.source_id: (d.title, d.category, d.body.strip()) for d in from_folder.documents}
    assert got == want
    # ... with the same content hashes (so chunk ids): switching between the two re-embeds nothing.
    assert {d.source_id: d.content_hash for d in from_reader.documents} == {
        d.source_id: d.content_hash for d in from_folder.documents
    }
    # Reading again (new random doc_ids, new access times) gives the same content hashes: nothing re-embedded.
    again = knowledge_base_from_documents(SimpleDirectoryReader(str(folder), recursive=True).load_data())
    assert [d.content_hash for d in again.documents] == [d.content_hash for d in from_reader.documents]


def test_document_metadata_works_as_frontmatter_and_ids_give_identity() -> None:
    doc = Document(
        text="Restart the broker, then check the ISR.",
        doc_id="wiki/kafka-isr",
        metadata={"title": "Kafka ISR shrinking", "keywords": "ISR, UnderReplicatedPartitions", "domain": "Kafka",
                  "entities": ["kafka-topics"], "team": "streaming"},
    )  # fmt: skip
    kb = knowledge_base_from_documents([doc], name="wiki")
    (got,) = kb.documents
    assert kb.kb_id == "documents:wiki" and got.source_id == "wiki/kafka-isr"
    assert (got.title, got.category, got.keywords, got.entities) == (
        "Kafka ISR shrinking",
        "kafka",
        ["ISR", "UnderReplicatedPartitions"],
        ["kafka-topics"],
    )
    assert got.metadata == {"team": "streaming"}
    edited = Document(text=doc.text + " Then rebalance.", doc_id="wiki/kafka-isr", metadata=doc.metadata)
    assert knowledge_base_from_documents([edited]).documents[0].content_hash != got.content_hash


def test_nodes_of_one_document_join_in_order_under_its_ref_doc_id() -> None:
    source = Document(text="unused", doc_id="runbook-7")
    parts = [
        TextNode(text="## Fix\nRaise the limit.", start_char_idx=40,
                 relationships={NodeRelationship.SOURCE: source.as_related_node_info()}),
        TextNode(text="# Disk full\n\n## Check\nRun df -h.", start_char_idx=0,
                 relationships={NodeRelationship.SOURCE: source.as_related_node_info()}),
    ]  # fmt: skip
    (doc,) = knowledge_base_from_documents(parts).documents
    assert doc.source_id == "runbook-7" and doc.title == "Disk full"
    assert [c.breadcrumb_text for c in chunk_document(doc)] == ["Disk full > Check", "Disk full > Fix"]


def test_unusable_items_are_skipped_or_refused_with_the_reason(tmp_path: Path) -> None:
    kb = knowledge_base_from_documents([Document(text="  ", doc_id="blank"), Document(text="ok", doc_id="fine")])
    assert [d.source_id for d in kb.documents] == ["fine"] and kb.skipped[0].source_id == "blank"
    with pytest.raises(TypeError, match="expected LlamaIndex Documents or nodes, got str"):
        knowledge_base_from_documents(["kb/redis.md"])  # type: ignore[list-item]
    outside = Document(text="x", metadata={"file_path": str(tmp_path / "elsewhere" / "a.md")})
    with pytest.raises(KnowledgeBaseError, match="is not under the root"):
        knowledge_base_from_documents([outside], root=tmp_path / "kb")


def test_the_heading_chunker_runs_as_a_node_parser_in_an_ingestion_pipeline() -> None:
    text = "# Redis OOM\n\n## Diagnosis\nRun INFO memory.\n\n## Fix\nRaise maxmemory."
    pipeline = IngestionPipeline(transformations=[MarkdownHeadingNodeParser(chunk_tokens=220)])
    nodes = pipeline.run(documents=[Document(text=text, doc_id="redis-oom", metadata={"team": "cache"})])
    assert [(n.metadata["breadcrumb"], n.get_content()) for n in nodes] == [
        ("Redis OOM > Diagnosis", "Run INFO memory."),
        ("Redis OOM > Fix", "Raise maxmemory."),
    ]
    assert all(n.metadata["team"] == "cache" and n.ref_doc_id == "redis-oom" for n in nodes)
    # The ids are the chunk ids ingest writes, and the embedding reads the breadcrumb before the text.
    (doc,) = knowledge_base_from_documents(
        [Document(text=text, doc_id="redis-oom", metadata={"team": "cache"})]
    ).documents
    assert [n.node_id for n in nodes] == [c.chunk_id for c in chunk_document(doc)]
    embedded = nodes[0].get_content(metadata_mode="embed")  # type: ignore[arg-type]
    assert "breadcrumb: Redis OOM > Diagnosis" in embedded and "keywords" not in embedded
