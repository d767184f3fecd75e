"""The L0 index: per document its title, keywords, category, entities and headings, persisted beside the collection.

Built at ingest from the loaded documents (no embedding needed) and written atomically, so a lookup loads it without
re-reading the knowledge base and a crash never leaves half a file.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from kb_retrieval.knowledge.loader import KbDocument


class L0Entry(BaseModel):
    kb: str
    title: str
    category: str | None = None
    keywords: list[str] = Field(default_factory=list)
    entities: list[str] = Field(default_factory=list)
    headings: list[str] = Field(default_factory=list)


class L0Index(BaseModel):
    version: int = 1
    documents: dict[str, L0Entry] = Field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> L0Index:
        """The persisted index, or an empty one when none has been written yet."""
        if not path.exists():
            return cls()
        return cls.model_validate_json(path.read_text(encoding="utf-8"))

    def save(self, path: Path) -> None:
        """Write atomically: a temporary file in the same folder, then a rename.

        Temporary files a killed run left behind are removed first (ingest runs one at a time per collection: the
        index is read, changed and written back, so two at once would lose one's changes anyway).
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(glob.escape(path.name) + "*.tmp"):
            stale.unlink(missing_ok=True)
        payload = json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=1, ensure_ascii=False)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(payload + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def replace_kb(self, kb: str, documents: list[KbDocument]) -> None:
        """Make the entries of one KB folder exactly ``documents``; other folders' entries are kept."""
        self.documents = {source: entry for source, entry in self.documents.items() if entry.kb != kb}
        for doc in documents:
            self.documents[doc.source_id] = L0Entry(
                kb=kb,
                title=doc.title,
                category=doc.category,
                keywords=doc.keywords,
                entities=doc.entities,
                headings=doc.headings,
            )
        self.documents = dict(sorted(self.documents.items()))
