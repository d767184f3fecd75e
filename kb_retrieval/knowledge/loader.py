"""Load a folder of Markdown documents with optional YAML frontmatter (and text and HTML files beside them).

Size: over 400 lines, one concern (files into documents) with its guards on hostile input (YAML depth and
expansion, heading counts); the frontmatter guards are the part to move out if it grows.

Frontmatter keys ``title``, ``keywords`` (list or comma string), ``category`` or ``domain`` and ``entities`` (list)
are understood; other keys are kept as metadata. Missing fields are derived: the title from the first H1, else the
file name; the category from the folder (``category_from``); keywords from the title, CamelCase identifiers of the
file name and title (alert names), and the headings.

A file that cannot be used (binary, unreadable, empty, broken frontmatter, too large, frontmatter that expands past
its bounds through YAML aliases, a symlink leaving the root) is skipped with a reason; the rest of the knowledge
base still loads. Text files (``.txt``) load as Markdown without headings; HTML pages (``.html``, ``.htm``) are read
into Markdown-like text, their ``<title>`` as the title (:mod:`kb_retrieval.knowledge.html`). Every other file is
skipped with its reason (the file types ingested), never dropped without a word.

:func:`document_from_text` is the one place a text and its frontmatter-like metadata become a
:class:`KbDocument`: LlamaIndex ``Document`` s come in through it too (:mod:`kb_retrieval.knowledge.documents`).

Example:
    >>> kb = load_knowledge_base("kb_retrieval/sample_kb")  # doctest: +SKIP
    >>> kb.documents[0].source_id  # doctest: +SKIP
    'jvm/choosing-a-garbage-collector.md'
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from kb_retrieval.knowledge.html import HTML_SUFFIXES, html_to_text
from kb_retrieval.knowledge.text import heading, is_fence

log = logging.getLogger(__name__)

MARKDOWN_SUFFIXES = (".md", ".markdown")
TEXT_SUFFIXES = (".txt",)
#: The file types a knowledge-base folder is read for; any other file is skipped and named in the summary.
INGESTED_SUFFIXES = (*MARKDOWN_SUFFIXES, *TEXT_SUFFIXES, *HTML_SUFFIXES)
#: Bumped whenever the rows written for an unchanged file change (2: breadcrumbs start at the opening H1).
ROWS_VERSION = 2
#: Frontmatter values (scalars, lists, mappings) at most, aliases expanded: far above any real document's.
MAX_FRONTMATTER_VALUES = 10_000
#: Nesting of ``[...]`` / ``{...}`` in frontmatter at most (PyYAML: 0.24 s at 400 levels, 1.2 s at 1,000).
MAX_FRONTMATTER_DEPTH = 64
#: Headings (sections, each at least one chunk) one document may have: a runbook has tens; 10,000 headings in one
#: file are a generated or hostile file that would flood every search with its chunks.
MAX_SECTIONS = 1_000
#: The frontmatter every chunk row of a document carries (title, keywords, entities, other keys) at most, as JSON.
MAX_METADATA_BYTES = 32_768
_CAMEL_ID = re.compile(r"\b[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+\b")


SYMLINKED_FOLDER_REASON = (
    "refused: a symlinked folder is not followed (its files would be read twice or from outside the root); "
    "ingest its target as a knowledge-base folder of its own"
)


HIDDEN_FILE_REASON = "refused: a hidden file (its name starts with '.'); rename it to ingest it"


class KnowledgeBaseError(ValueError):
    """The knowledge base as a whole cannot be loaded (missing folder, conflicting sources)."""


@dataclass(frozen=True)
class SkippedFile:
    """A file the loader did not read, and why."""

    source_id: str
    reason: str


@dataclass
class KbDocument:
    """One Markdown document, its frontmatter understood and the gaps filled."""

    source_id: str
    title: str
    category: str | None
    keywords: list[str]
    entities: list[str]
    headings: list[str]
    body: str
    content_hash: str
    metadata: dict[str, Any] = field(default_factory=dict)
    kb_id: str = ""


@dataclass
class LoadedKnowledgeBase:
    """One knowledge-base root: a folder, or a set of LlamaIndex documents (``name``: its identity, then).

    ``complete``: the documents are all the root holds, so ingest removes the root's other documents from the
    collection (a folder); False for documents handed in by a program, which are upserted (as LlamaIndex's
    ``IngestionPipeline`` upserts by ``doc_id``).
    """

    root: Path
    documents: list[KbDocument]
    skipped: list[SkippedFile]
    name: str = ""
    complete: bool = True

    @property
    def kb_id(self) -> str:
        """Identity of this KB root inside a collection (a folder's resolved path, or the documents' name)."""
        return self.name or self.root.resolve().as_posix()


def load_knowledge_base(
    root: str | Path,
    *,
    category_from: Literal["parent", "top", "none"] = "parent",
    max_file_bytes: int = 5_000_000,
) -> LoadedKnowledgeBase:
    """Load every Markdown, text and HTML file under ``root`` (hidden files and folders excluded), in path order."""
    root_path = Path(root)
    if not root_path.exists():
        raise KnowledgeBaseError(f"knowledge-base folder not found: {root_path}")
    if not root_path.is_dir():
        raise KnowledgeBaseError(f"knowledge-base path is not a folder: {root_path}")
    real_root = root_path.resolve()
    kb_id = real_root.as_posix()

    documents: list[KbDocument] = []
    skipped: list[SkippedFile] = []
    files, linked_folders, hidden, other = _knowledge_files(root_path)
    for folder in linked_folders:
        source_id = folder.relative_to(root_path).as_posix() + "/"
        log.warning("skipped %s: %s", source_id, SYMLINKED_FOLDER_REASON)
        skipped.append(SkippedFile(source_id, SYMLINKED_FOLDER_REASON))
    for path in hidden:  # told, not dropped silently: `..md` looks like a runbook, and `.draft.md` may be meant
        source_id = path.relative_to(root_path).as_posix()
        log.warning("skipped %s: %s", source_id, HIDDEN_FILE_REASON)
        skipped.append(SkippedFile(source_id, HIDDEN_FILE_REASON))
    for path in other:  # told too: a knowledge base exported as PDF or Word would otherwise vanish without a word
        source_id = path.relative_to(root_path).as_posix()
        reason = unsupported_reason(path.name)
        log.warning("skipped %s: %s", source_id, reason)
        skipped.append(SkippedFile(source_id, reason))
    for path in files:
        source_id = path.relative_to(root_path).as_posix()
        try:
            doc = _load_document(path, source_id, real_root, category_from, max_file_bytes)
            doc.kb_id = kb_id
            documents.append(doc)
        except _Skip as skip:
            log.warning("skipped %s: %s", source_id, skip.reason)
            skipped.append(SkippedFile(source_id, skip.reason))
    return LoadedKnowledgeBase(root_path, documents, skipped)


class _Skip(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


#: Raised by :func:`document_from_text` for a document that cannot be used; ``.reason`` says why.
SkipDocument = _Skip


def unsupported_reason(name: str) -> str:
    """Why a file of this name is not ingested: its type, and the types that are."""
    suffix = Path(name).suffix.lower() or "(none)"
    return f"unsupported file type {suffix} (ingested: {', '.join(INGESTED_SUFFIXES)})"


def _knowledge_files(root: Path) -> tuple[list[Path], list[Path], list[Path], list[Path]]:
    """The files to ingest under ``root`` in path order, the symlinked folders that were not walked, the hidden
    files of an ingested type (a name starting with '.') and the visible files of other types, in the folders
    walked."""
    found: list[Path] = []
    linked: list[Path] = []
    hidden: list[Path] = []
    other: list[Path] = []
    # followlinks=False: a symlinked folder is not walked (reported instead); symlinked files are checked in
    # _load_document.
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        visible = sorted(d for d in dirnames if not d.startswith("."))
        linked.extend(Path(dirpath) / d for d in visible if os.path.islink(os.path.join(dirpath, d)))
        dirnames[:] = visible
        for name in filenames:
            if name.lower().endswith(INGESTED_SUFFIXES):
                (hidden if name.startswith(".") else found).append(Path(dirpath) / name)
            elif not name.startswith("."):
                other.append(Path(dirpath) / name)
    found.sort(key=lambda p: p.relative_to(root).as_posix())
    return found, sorted(linked), sorted(hidden), sorted(other)


def _load_document(path: Path, source_id: str, real_root: Path, category_from: str, max_file_bytes: int) -> KbDocument:
    try:
        real = path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop is a RuntimeError before Python 3.13
        raise _Skip(f"unreadable: cannot resolve the path ({exc})") from exc
    if not real.is_relative_to(real_root):
        raise _Skip("refused: the file (a symlink) resolves outside the knowledge-base root")
    try:
        info = real.stat()
        if not stat.S_ISREG(info.st_mode):  # a FIFO or device would block or never end
            raise _Skip("refused: not a regular file")
        size = info.st_size
        if size > max_file_bytes:
            raise _Skip(f"refused: {size} bytes is over the {max_file_bytes}-byte limit (KB_MAX_FILE_BYTES)")
        raw = real.read_bytes()
    except OSError as exc:
        raise _Skip(f"unreadable: {exc.strerror or exc}") from exc
    if b"\x00" in raw:
        raise _Skip("binary file (contains NUL bytes)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _Skip(f"not UTF-8 text (byte {exc.start})") from exc
    if not text.strip():
        raise _Skip("empty file")
    if path.name.lower().endswith(HTML_SUFFIXES):
        page = html_to_text(text)
        return document_from_text(source_id, page.text, category_from, raw, metadata={"title": page.title})
    return document_from_text(source_id, text, category_from, raw)


def document_from_text(
    source_id: str, text: str, category_from: str, raw: bytes, *, metadata: dict[str, Any] | None = None
) -> KbDocument:
    """A document from its text (YAML frontmatter, if any, read off its top) and metadata given beside it (a
    LlamaIndex ``Document``'s, over the frontmatter's keys): ``title``, ``keywords``, ``category``/``domain``,
    ``entities`` understood, the gaps derived, the other keys kept as metadata. ``raw``: what the content hash
    covers besides the derived fields (the file's bytes). Raises :data:`SkipDocument` with the reason."""
    frontmatter, body = _split_frontmatter(text)
    frontmatter.update({k: v for k, v in (metadata or {}).items() if v not in (None, "", [])})
    if not body.strip():
        raise _Skip("no content after the frontmatter" if text.strip() else "no text")
    headings = _headings(body)
    if len(headings) > MAX_SECTIONS:
        raise _Skip(
            f"refused: {len(headings)} headings, over the {MAX_SECTIONS} sections a document may have (each is a "
            "chunk at least): split it into several files"
        )
    title = _as_text(frontmatter.pop("title", None)) or _first_h1(body) or Path(source_id).stem
    category = _as_text(frontmatter.pop("category", None)) or _as_text(frontmatter.pop("domain", None))
    frontmatter.pop("domain", None)
    if not category:
        category = _category_from_path(source_id, category_from)
    written = _as_list(frontmatter.pop("keywords", None))
    keywords = written or _derived_keywords(source_id, title, headings)
    entities = _as_list(frontmatter.pop("entities", None))
    # Everything a row stores about its document: a change in how fields are derived rewrites the rows too, and so
    # does a new ROWS_VERSION (how a document becomes rows: chunking, breadcrumbs), so an upgrade re-ingests.
    derived = json.dumps([ROWS_VERSION, category, title, keywords, entities], ensure_ascii=False).encode()
    metadata = _json_metadata(frontmatter)
    # What the author wrote is bounded (keywords derived from the headings are the L0 index's, which cuts its own
    # entries to fit: tests/indexing/test_l0_milvus.py).
    written_json = json.dumps([category, title, written, entities], ensure_ascii=False).encode()
    stored = len(written_json) + len(json.dumps(metadata, ensure_ascii=False).encode())
    if stored > MAX_METADATA_BYTES:  # every chunk row holds a copy
        raise _Skip(f"refused: the frontmatter is {stored} bytes as JSON, over the {MAX_METADATA_BYTES}-byte limit")
    digest = hashlib.sha256(raw + b"\x00" + derived).hexdigest()
    return KbDocument(
        source_id=source_id,
        title=title,
        category=category.lower() if category else None,
        keywords=keywords,
        entities=entities,
        headings=[h for _, h in headings],
        body=body,
        content_hash=digest,
        metadata=metadata,
    )


def _split_frontmatter(text: str) -> tuple[dict[str, Any], str]:
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        return {}, text
    for i in range(1, len(lines)):
        if lines[i].strip() in ("---", "..."):
            block = "".join(lines[1:i])
            try:
                data = _safe_yaml(block) if block.strip() else {}
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f" at line {mark.line + 2}" if mark is not None else ""
                problem = getattr(exc, "problem", None) or "invalid YAML"
                raise _Skip(f"broken frontmatter{where}: {problem}") from exc
            except RecursionError:  # PyYAML composes nested collections recursively
                raise _Skip("broken frontmatter: collections nested too deeply") from None
            if data is None:
                data = {}
            if not isinstance(data, dict):
                raise _Skip(f"broken frontmatter: expected a mapping, got {type(data).__name__}")
            return {str(k): v for k, v in data.items()}, "".join(lines[i + 1 :])
    raise _Skip("broken frontmatter: opening '---' is never closed")


def _safe_yaml(block: str) -> Any:
    """``yaml.safe_load`` of a frontmatter block, refusing one whose aliases expand it past
    :data:`MAX_FRONTMATTER_VALUES` values (an alias bomb: 425 bytes of nested aliases expand to 9^9 values).

    The node graph is composed first (aliases are shared nodes there, so this is as small as the text) and its
    expanded size counted before any Python value is built.
    """
    depth = deepest = 0
    for char in block:  # brackets in quoted strings count too: a real frontmatter is nowhere near the limit
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    if deepest > MAX_FRONTMATTER_DEPTH or _block_depth(block) > MAX_FRONTMATTER_DEPTH:
        # Flow collections: PyYAML parses them nested in quadratic time. Block style (indentation) too: composing a
        # node graph recurses per level, a few hundred levels deep runs out of stack.
        raise _Skip(f"broken frontmatter: collections nested deeper than {MAX_FRONTMATTER_DEPTH} levels")
    loader = yaml.SafeLoader(block)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        values = _expanded_size(node, {})
        if values > MAX_FRONTMATTER_VALUES:
            raise _Skip(
                f"refused: the frontmatter expands to over {MAX_FRONTMATTER_VALUES} values through YAML aliases "
                "(an alias bomb?)"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _block_depth(block: str) -> int:
    """How deep the collections of ``block`` nest, from PyYAML's event stream (its parser is a state machine: no
    recursion); it stops reading at one level past the limit."""
    depth = deepest = 0
    try:
        for event in yaml.parse(block, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                deepest = max(deepest, depth)
                if deepest > MAX_FRONTMATTER_DEPTH:
                    break
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return deepest  # not YAML: loading it says so, naming the file
    return deepest


def _expanded_size(node: yaml.Node, seen: dict[int, int]) -> int:
    """How many values ``node`` stands for once every alias is expanded (memoised per shared node, so linear in the
    graph; a recursive alias counts as over the limit)."""
    key = id(node)
    if key in seen:
        if seen[key] < 0:  # a node holding itself: endless once expanded
            return MAX_FRONTMATTER_VALUES + 1
        return seen[key]
    seen[key] = -1
    total = 1
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            total += _expanded_size(item, seen)
            if total > MAX_FRONTMATTER_VALUES:
                break
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            total += _expanded_size(k, seen) + _expanded_size(v, seen)
            if total > MAX_FRONTMATTER_VALUES:
                break
    seen[key] = total
    return total


def _headings(body: str) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    in_code = False
    for line in body.splitlines():
        if is_fence(line):
            in_code = not in_code
            continue
        if not in_code and (parsed := heading(line)):
            found.append(parsed)
    return found


def _first_h1(body: str) -> str | None:
    return next((text for level, text in _headings(body) if level == 1), None)


def _category_from_path(source_id: str, category_from: str) -> str | None:
    parts = source_id.split("/")[:-1]
    if not parts or category_from == "none":
        return None
    return parts[0] if category_from == "top" else parts[-1]


def _derived_keywords(source_id: str, title: str, headings: list[tuple[int, str]]) -> list[str]:
    """Alert-style identifiers from the file name and title, then the title and the multi-word H2 headings.

    One-word headings ("Impact", "Mitigation", "Critical") are section names shared by every runbook, not keywords
    of this one; they stay in the L0 index's headings.
    """
    candidates = [*_CAMEL_ID.findall(Path(source_id).stem), *_CAMEL_ID.findall(title), title]
    candidates += [text for level, text in headings if level == 2 and len(text.split()) > 1]
    seen: dict[str, str] = {}
    for item in candidates:
        seen.setdefault(item.lower(), item)
    return list(seen.values())


def _as_text(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, list) else [value]
    return [text for item in items if (text := _as_text(item))]


_UNSAFE = object()


def _json_metadata(frontmatter: dict[str, Any]) -> dict[str, Any]:
    """The remaining frontmatter keys whose values can be stored as JSON; the others are dropped."""
    values = {key: _json_value(value) for key, value in frontmatter.items()}
    return {key: value for key, value in values.items() if value is not _UNSAFE}


def _json_value(value: Any) -> Any:
    """``value`` as JSON-storable metadata (YAML dates as ISO strings, nested too), or ``_UNSAFE`` to drop it."""
    if isinstance(value, datetime.date):  # also datetime.datetime
        return value.isoformat()
    if isinstance(value, list):
        items = [_json_value(v) for v in value]
        return _UNSAFE if any(v is _UNSAFE for v in items) else items
    if isinstance(value, dict):
        pairs = {str(k): _json_value(v) for k, v in value.items()}
        return _UNSAFE if any(v is _UNSAFE for v in pairs.values()) else pairs
    return value if isinstance(value, str | int | float | bool) or value is None else _UNSAFE
