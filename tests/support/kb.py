"""What many tests share to set up a knowledge base and a child process: a folder of Markdown files written from a
dict, the offline environment (no model download, no tokenizer fork warning), and the alert many tests look up.

Example:
    >>> kb = write_kb(tmp_path / "kb", {"redis/memory.md": "# Redis memory\\n\\nRaise maxmemory.\\n"})  # doctest: +SKIP
    >>> env = offline_env(PYTHONPATH="/repo")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: The alert many tests look up: the sample KB answers it with ``redis/memory-usage-high.md``.
ALERT = "RedisMemoryHigh: Redis memory usage above 90% of maxmemory on redis-cache-01:6379"

#: What keeps a child process offline and quiet: the model from the local cache only, no tokenizer fork warning.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def write_kb(root: Path, docs: Mapping[str, str]) -> Path:
    """Write each ``relative path -> text`` of ``docs`` under ``root`` (folders made as needed); return ``root``."""
    for rel, text in docs.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def offline_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``base`` (by default this process's environment) with :data:`OFFLINE` and ``extra`` set."""
    return {**(os.environ if base is None else base), **OFFLINE, **extra}
