"""What many tests share to set up a knowledge base and a child process: a folder of Markdown files written from a
dict, a state dir with folders ingested into it, the offline environment (no model download, no tokenizer fork
warning), and the alert many tests look up.

Example:
    >>> kb = write_kb(tmp_path / "kb", {"redis/memory.md": "# Redis memory\\n\\nRaise maxmemory.\\n"})  # doctest: +SKIP
    >>> settings = ingested([kb], tmp_path / "state", embed_model, vector_store_mode="sdk")  # doctest: +SKIP
    >>> env = offline_env(PYTHONPATH="/repo")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kb_retrieval.config import KBSettings

#: The alert many tests look up: the sample KB answers it with ``redis/memory-usage-high.md``.
ALERT = "RedisMemoryHigh: Redis memory usage above 90% of maxmemory on redis-cache-01:6379"

#: A document no knowledge base of the tests holds, for a later ingest to add: its keyword is in no other document.
LATER_DOC = {
    "frobnicator/spindle-jammed.md": "---\ntitle: Frobnicator spindle jammed\nkeywords: [ZorkQuuxSpindleJammed]\n---\n"
    "# Frobnicator spindle jammed\n\n## Mitigation\n\nUnjam the spindle of the frobnicator with the quux lever.\n"
}

#: What keeps a child process offline and quiet: the model from the local cache only, no tokenizer fork warning.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def write_kb(root: Path, docs: Mapping[str, str]) -> Path:
    """Write each ``relative path -> text`` of ``docs`` under ``root`` (folders made as needed); return ``root``."""
    for rel, text in docs.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def ingested(roots: Sequence[Path], state_dir: Path, embed_model: Any, **settings: Any) -> KBSettings:
    """Settings of ``state_dir`` (and ``settings``) with the folders ``roots`` ingested into it by ``embed_model``."""
    from kb_retrieval.config import KBSettings
    from kb_retrieval.indexing.ingest import ingest

    made = KBSettings(state_dir=state_dir, **settings)
    ingest(list(roots), made, embed_model=embed_model)
    return made


def offline_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``base`` (by default this process's environment) with :data:`OFFLINE` and ``extra`` set."""
    return {**(os.environ if base is None else base), **OFFLINE, **extra}
