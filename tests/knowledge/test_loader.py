"""``load_knowledge_base``: frontmatter understood, gaps derived, bad files skipped with a reason."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kb_retrieval.knowledge.loader import (
    HIDDEN_FILE_REASON,
    KnowledgeBaseError,
    LoadedKnowledgeBase,
    load_knowledge_base,
    unsupported_reason,
)

pytestmark = pytest.mark.unit


def write(root: Path, relative: str, text: str | bytes) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def by_source(kb: LoadedKnowledgeBase) -> dict:
    return {doc.source_id: doc for doc in kb.documents}


def skip_reason(kb: LoadedKnowledgeBase, source_id: str) -> str:
    reasons = {s.source_id: s.reason for s in kb.skipped}
    assert source_id in reasons, f"{source_id} was not skipped; skipped: {reasons}"
    return reasons[source_id]


GOOD = "# Good\n\nSome text.\n"


# --- frontmatter ---------------------------------------------------------------------------------------------------


def test_frontmatter_fields_and_extra_keys_kept(tmp_path: Path) -> None:
    write(
        tmp_path,
        "redis/mem.md",
        "---\n"
        "title: Redis memory high\n"
        "keywords: [RedisMemoryHigh, maxmemory]\n"
        "category: Caching\n"
        "entities: [cache-01, cache-02]\n"
        "owner: sre-team\n"
        "severity: 2\n"
        "tags: {tier: gold}\n"
        "---\n"
        "# Ignored H1\n\nBody.\n",
    )
    doc = by_source(load_knowledge_base(tmp_path))["redis/mem.md"]
    assert doc.title == "Redis memory high"
    assert doc.keywords == ["RedisMemoryHigh", "maxmemory"]
    assert doc.category == "caching"  # frontmatter wins over the folder, lower-cased
    assert doc.entities == ["cache-01", "cache-02"]
    assert doc.metadata == {"owner": "sre-team", "severity": 2, "tags": {"tier": "gold"}}
    # Understood keys are not repeated as metadata.
    assert not {"title", "keywords", "category", "entities"} & doc.metadata.keys()
    assert doc.body.startswith("# Ignored H1")


def test_keywords_as_comma_string_and_domain_as_category(tmp_path: Path) -> None:
    write(tmp_path, "x/a.md", "---\nkeywords: ' slowlog , latency,, '\ndomain: MySQL\n---\nBody text.\n")
    doc = by_source(load_knowledge_base(tmp_path))["x/a.md"]
    assert doc.keywords == ["slowlog", "latency"]
    assert doc.category == "mysql"
    assert "domain" not in doc.metadata


def test_yaml_dates_in_metadata_become_iso_strings_and_stay_json_storable(tmp_path: Path) -> None:
    write(tmp_path, "a.md", "---\nupdated: 2024-02-02\nreviewed: [2024-01-01]\n---\nBody.\n")
    doc = load_knowledge_base(tmp_path).documents[0]
    assert doc.metadata == {"updated": "2024-02-02", "reviewed": ["2024-01-01"]}
    json.dumps(doc.metadata)  # goes into a Milvus JSON field


# --- derived fields ------------------------------------------------------------------------------------------------


def test_frontmatter_title_and_different_h1_give_one_title_in_breadcrumbs(tmp_path: Path) -> None:
    """Issue 14 item 14, from the file on disk to the chunks."""
    from kb_retrieval.knowledge.chunker import chunk_document

    write(
        tmp_path,
        "postgres/lag.md",
        "---\ntitle: PostgreSQL streaming replication lag\n---\n# PostgreSQL replication lag\n\n"
        "## Symptoms\n\nReplay lag grows.\n",
    )
    doc = load_knowledge_base(tmp_path).documents[0]
    assert [c.breadcrumb_text for c in chunk_document(doc)] == ["PostgreSQL replication lag > Symptoms"]
    assert doc.title == "PostgreSQL streaming replication lag"


def test_title_from_first_h1_else_file_stem(tmp_path: Path) -> None:
    write(tmp_path, "a/with-h1.md", "intro\n\n## Second level first\n\n# The Real Title\n\ntext\n")
    write(tmp_path, "a/no-h1.md", "## Only H2\n\ntext\n")
    write(tmp_path, "a/h1-in-code.md", "```\n# not a heading\n```\ntext\n")
    docs = by_source(load_knowledge_base(tmp_path))
    assert docs["a/with-h1.md"].title == "The Real Title"
    assert docs["a/no-h1.md"].title == "no-h1"
    assert docs["a/h1-in-code.md"].title == "h1-in-code"


@pytest.mark.parametrize(
    ("category_from", "expected"),
    [
        ("parent", {"top/sub/a.md": "sub", "top/b.md": "top", "c.md": None}),
        ("top", {"top/sub/a.md": "top", "top/b.md": "top", "c.md": None}),
        ("none", {"top/sub/a.md": None, "top/b.md": None, "c.md": None}),
    ],
)
def test_category_from_folder(tmp_path: Path, category_from: str, expected: dict[str, str | None]) -> None:
    for source in expected:
        write(tmp_path, source, GOOD)
    docs = by_source(load_knowledge_base(tmp_path, category_from=category_from))  # type: ignore[arg-type]
    assert {source: doc.category for source, doc in docs.items()} == expected


def test_folder_category_is_lower_cased(tmp_path: Path) -> None:
    write(tmp_path, "Redis/a.md", GOOD)
    assert load_knowledge_base(tmp_path).documents[0].category == "redis"


def test_keywords_derived_from_camelcase_stem_and_title(tmp_path: Path) -> None:
    text = "# Pod restarts: KubeContainerWaiting too\n\n## Mitigation\n\nx\n\n## Image pull errors\n\ny\n"
    write(tmp_path, "k8s/KubePodCrashLooping.md", text)
    doc = load_knowledge_base(tmp_path).documents[0]
    assert doc.keywords[:2] == ["KubePodCrashLooping", "KubeContainerWaiting"]
    assert "Pod restarts: KubeContainerWaiting too" in doc.keywords
    assert "Image pull errors" in doc.keywords  # multi-word H2 headings too
    assert "Mitigation" not in doc.keywords and "Mitigation" in doc.headings  # a section name, not a keyword


def test_derived_keywords_are_deduplicated_case_insensitively(tmp_path: Path) -> None:
    write(tmp_path, "RedisMemoryHigh.md", "# RedisMemoryHigh\n\n## redismemoryhigh\n\ntext\n")
    doc = load_knowledge_base(tmp_path).documents[0]
    assert doc.keywords == ["RedisMemoryHigh"]


def test_plain_stem_gives_no_identifier_keyword(tmp_path: Path) -> None:
    write(tmp_path, "redis-memory-high.md", "plain text only\n")
    doc = load_knowledge_base(tmp_path).documents[0]
    assert doc.title == "redis-memory-high"
    assert doc.keywords == ["redis-memory-high"]  # the title, nothing CamelCase


# --- which files ---------------------------------------------------------------------------------------------------


def test_source_ids_relative_with_slashes_in_path_order(tmp_path: Path) -> None:
    for source in ["b/z.md", "a/deep/x.md", "a/y.markdown", "top.md"]:
        write(tmp_path, source, GOOD)
    kb = load_knowledge_base(tmp_path)
    assert [d.source_id for d in kb.documents] == ["a/deep/x.md", "a/y.markdown", "b/z.md", "top.md"]
    assert kb.skipped == []
    assert all(d.kb_id == tmp_path.resolve().as_posix() for d in kb.documents)


def test_hidden_files_ignored_and_other_types_named(tmp_path: Path) -> None:
    write(tmp_path, "a/visible.md", GOOD)
    write(tmp_path, "a/.hidden.md", GOOD)
    write(tmp_path, ".git/notes.md", GOOD)
    write(tmp_path, "a/.drafts/draft.md", GOOD)
    write(tmp_path, "a/readme.txt", GOOD)
    write(tmp_path, "a/image.png", b"\x89PNG\x00\x00")
    write(tmp_path, "a/md", GOOD)
    write(tmp_path, "a/..md", GOOD)
    kb = load_knowledge_base(tmp_path)
    # Text files are ingested too (issue 38), and every other visible file is named with why (it was dropped silently).
    assert [d.source_id for d in kb.documents] == ["a/readme.txt", "a/visible.md"]
    # Hidden folders are not walked (.git); a hidden Markdown file in a folder walked is told, not dropped silently
    # (issue 23 item 8: `..md` looks like a runbook).
    assert [(s.source_id, s.reason) for s in kb.skipped] == [
        ("a/..md", HIDDEN_FILE_REASON),
        ("a/.hidden.md", HIDDEN_FILE_REASON),
        ("a/image.png", unsupported_reason("image.png")),
        ("a/md", unsupported_reason("md")),
    ]
    assert unsupported_reason("md") == "unsupported file type (none) (ingested: .md, .markdown, .txt, .html, .htm)"


# --- bad input: skipped with a reason, the rest loads ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "words_in_reason"),
    [
        (b"# T\n\x00\x01binary", ["binary", "NUL"]),
        ("# Caf\u00e9\n".encode("latin-1"), ["UTF-8"]),
        (b"", ["empty"]),
        (b"  \n\t\n", ["empty"]),
        (b"---\ntitle: [unclosed\n---\n# Body\n", ["frontmatter"]),
        (b"---\ntitle: x\n# Body that never closes the frontmatter\n", ["frontmatter", "never closed"]),
        (b"---\n- a\n- b\n---\n# Body\n", ["frontmatter", "mapping", "list"]),
        (b"---\ntitle: only frontmatter\n---\n\n", ["no content"]),
        # Block style (indentation), 300 levels: the same 64-level limit as flow style (issue 40 item 7).
        (
            ("---\n" + "".join(f"{'  ' * i}k{i}:\n" for i in range(300)) + f"{'  ' * 300}v\n---\n# Body\n").encode(),
            ["nested deeper than 64"],
        ),
        (("# T\n" + "".join(f"## Heading {i}\ntext\n" for i in range(1_200))).encode(), ["1201 headings", "split"]),
    ],
    ids=[
        "binary",
        "latin-1",
        "empty",
        "whitespace",
        "broken-yaml",
        "unclosed",
        "list-frontmatter",
        "no-body",
        "deep-block-yaml",
        "too-many-headings",
    ],
)
def test_bad_file_skipped_with_reason_rest_loads(tmp_path: Path, content: bytes, words_in_reason: list[str]) -> None:
    write(tmp_path, "a/good.md", GOOD)
    write(tmp_path, "a/bad.md", content)
    write(tmp_path, "b/good.md", GOOD)
    kb = load_knowledge_base(tmp_path)
    assert [d.source_id for d in kb.documents] == ["a/good.md", "b/good.md"]
    reason = skip_reason(kb, "a/bad.md")
    for word in words_in_reason:
        assert word.lower() in reason.lower()


def test_broken_yaml_reason_gives_line(tmp_path: Path) -> None:
    write(tmp_path, "bad.md", "---\ntitle: ok\nkeywords: [a, b\n---\nbody\n")
    reason = skip_reason(load_knowledge_base(tmp_path), "bad.md")
    assert "broken frontmatter at line" in reason


def test_file_over_size_limit_refused_without_reading_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "big.md"
    with big.open("wb") as handle:  # sparse: 50 MB on paper, nothing on disk
        handle.write(b"# Big\n")
        handle.truncate(50 * 1024 * 1024)
    write(tmp_path, "small.md", GOOD)

    read: list[Path] = []
    real_read_bytes = Path.read_bytes
    real_open = Path.open

    def spy_read_bytes(self: Path) -> bytes:
        read.append(self)
        return real_read_bytes(self)

    def spy_open(self: Path, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        read.append(self)
        return real_open(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_bytes", spy_read_bytes)
    monkeypatch.setattr(Path, "open", spy_open)

    kb = load_knowledge_base(tmp_path, max_file_bytes=1_000_000)
    assert [d.source_id for d in kb.documents] == ["small.md"]
    reason = skip_reason(kb, "big.md")
    assert "1000000" in reason and "limit" in reason
    assert str(50 * 1024 * 1024) in reason
    assert big.resolve() not in [p.resolve() for p in read]
    assert any(p.name == "small.md" for p in read)  # the spy does see reads


def test_file_exactly_at_limit_is_loaded(tmp_path: Path) -> None:
    content = b"# T\n" + b"x" * 96
    write(tmp_path, "a.md", content)
    assert [d.source_id for d in load_knowledge_base(tmp_path, max_file_bytes=len(content)).documents] == ["a.md"]
    assert load_knowledge_base(tmp_path, max_file_bytes=len(content) - 1).documents == []


def test_symlink_outside_root_refused_inside_accepted(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    outside = write(tmp_path, "secret/passwords.md", "# Secrets\n\nhunter2\n")
    inside = write(root, "real/doc.md", "# Inside\n\ntext\n")
    (root / "links").mkdir()
    (root / "links/out.md").symlink_to(outside)
    (root / "links/in.md").symlink_to(inside)
    kb = load_knowledge_base(root)
    docs = by_source(kb)
    assert set(docs) == {"links/in.md", "real/doc.md"}
    assert docs["links/in.md"].title == "Inside"
    reason = skip_reason(kb, "links/out.md")
    assert "outside" in reason and "symlink" in reason
    assert all("hunter2" not in d.body for d in kb.documents)


def test_symlinked_folder_leading_outside_is_not_walked(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    write(tmp_path, "elsewhere/x.md", GOOD)
    write(root, "a.md", GOOD)
    (root / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    kb = load_knowledge_base(root)
    assert [d.source_id for d in kb.documents] == ["a.md"]
    assert "symlinked folder" in skip_reason(kb, "linked/")


def test_symlinked_folder_inside_the_root_is_skipped_with_a_warning(tmp_path: Path, caplog) -> None:
    """Issue 14 item 10: not walked (its files would be ingested twice), and said so."""
    root = tmp_path / "kb"
    write(root, "real/doc.md", GOOD)
    (root / "sub").mkdir()
    (root / "sub" / "alias").symlink_to(root / "real", target_is_directory=True)
    (root / ".hidden-link").symlink_to(root / "real", target_is_directory=True)  # hidden: ignored silently
    kb = load_knowledge_base(root)
    assert [d.source_id for d in kb.documents] == ["real/doc.md"]
    assert [s.source_id for s in kb.skipped] == ["sub/alias/"]
    assert "not followed" in skip_reason(kb, "sub/alias/")
    assert "skipped sub/alias/: refused: a symlinked folder is not followed" in caplog.text


def test_symlink_loop_and_dangling_link_are_skipped_not_fatal(tmp_path: Path) -> None:
    write(tmp_path, "good.md", GOOD)
    (tmp_path / "loop.md").symlink_to(tmp_path / "loop.md")
    (tmp_path / "dangling.md").symlink_to(tmp_path / "missing.md")
    kb = load_knowledge_base(tmp_path)
    assert [d.source_id for d in kb.documents] == ["good.md"]
    assert "unreadable" in skip_reason(kb, "loop.md")
    assert "unreadable" in skip_reason(kb, "dangling.md")


@pytest.mark.timeout(10)
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_named_pipe_is_refused_not_read(tmp_path: Path) -> None:
    write(tmp_path, "good.md", GOOD)
    os.mkfifo(tmp_path / "pipe.md")  # reading it would block forever
    kb = load_knowledge_base(tmp_path)
    assert [d.source_id for d in kb.documents] == ["good.md"]
    assert "not a regular file" in skip_reason(kb, "pipe.md")


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    write(tmp_path, "bom.md", "\ufeff---\ntitle: With BOM\n---\nbody\n".encode())
    doc = load_knowledge_base(tmp_path).documents[0]
    assert doc.title == "With BOM"


# --- the knowledge base as a whole ---------------------------------------------------------------------------------


def test_missing_folder_raises_with_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(KnowledgeBaseError, match="not found") as info:
        load_knowledge_base(missing)
    assert str(missing) in str(info.value)


def test_file_instead_of_folder_raises_with_path(tmp_path: Path) -> None:
    path = write(tmp_path, "single.md", GOOD)
    with pytest.raises(KnowledgeBaseError, match="not a folder") as info:
        load_knowledge_base(path)
    assert str(path) in str(info.value)


def test_content_hash_changes_with_content_and_category_only(tmp_path: Path) -> None:
    write(tmp_path, "a/doc.md", GOOD)
    first = load_knowledge_base(tmp_path).documents[0].content_hash
    assert load_knowledge_base(tmp_path).documents[0].content_hash == first
    assert load_knowledge_base(tmp_path, category_from="none").documents[0].content_hash != first
    write(tmp_path, "a/doc.md", GOOD + "more\n")
    assert load_knowledge_base(tmp_path).documents[0].content_hash != first


def test_a_new_rows_version_changes_every_document_hash(tmp_path, monkeypatch):
    """An upgrade that changes the rows of unchanged files (chunking, breadcrumbs) must make ingest rewrite them."""
    from kb_retrieval.knowledge import loader

    (tmp_path / "a.md").write_text("# A\n\nSome text.\n", encoding="utf-8")
    before = load_knowledge_base(tmp_path).documents[0].content_hash
    assert load_knowledge_base(tmp_path).documents[0].content_hash == before  # deterministic
    monkeypatch.setattr(loader, "ROWS_VERSION", loader.ROWS_VERSION + 1)
    assert load_knowledge_base(tmp_path).documents[0].content_hash != before
