"""What the postprocessors share about their runtime side: the state they read (an L0 index, document vectors, a
section store, the query model, the knowledge-base roots) is private, never configuration, and what they cannot do
without it is said, not skipped in silence.

- State lives in pydantic ``PrivateAttr``s (as ``SentenceTransformerRerank`` keeps its model): ``to_dict`` /
  ``from_dict`` carry configuration only, and ``from_lookup(lookup, config=None)`` builds a postprocessor with a
  lookup's state and its configuration (or ``config``, a ``to_dict()``). State is given when a postprocessor is built
  and never assigned afterwards: a new index version gets new postprocessors (:mod:`kb_retrieval.pipeline`).
- :func:`note_limitation` records a limitation in the node's stage data (``StageData.notes``) and logs it once per
  postprocessor class and kind, however many nodes and calls meet it.
- :func:`known_source` maps a stock node's absolute ``file_path`` (``SimpleDirectoryReader``'s default) to the source
  id ingest gave the file: its path relative to the knowledge-base root recorded at ingest.

Example:
    >>> ranker = DocumentRanker.from_lookup(lookup)  # doctest: +SKIP
    >>> again = DocumentRanker.from_lookup(lookup, config=ranker.to_dict())  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable

from llama_index.core.schema import NodeWithScore

from kb_retrieval.indexing.ingest_record import source_id_for
from kb_retrieval.models import Candidate
from kb_retrieval.retrieval.stage import StageData, write_stage

_LOGGED: set[tuple[str, str]] = set()
_LOGGED_LOCK = threading.Lock()


def log_once(logger: logging.Logger, component: str, kind: str, message: str) -> None:
    """Log ``message`` at INFO the first time ``component`` meets ``kind`` in this process."""
    with _LOGGED_LOCK:
        if (component, kind) in _LOGGED:
            return
        _LOGGED.add((component, kind))
    logger.info("%s: %s", component, message)


def note_limitation(
    logger: logging.Logger, component: str, kind: str, message: str, nodes: Iterable[tuple[NodeWithScore, StageData]]
) -> None:
    """Record on every given node that ``component`` (the postprocessor's class name) could not do its work
    (``"component: message"`` in its stage notes) and log it once."""
    note = f"{component}: {message}"
    for node, stage in nodes:
        if note not in stage.notes:
            stage.notes.append(note)
            write_stage(node, stage)
    log_once(logger, component, kind, message)


def known_source(candidate: Candidate, roots: Iterable[str]) -> Candidate:
    """A stock node's candidate whose source is an absolute path under a recorded root, with the source id ingest
    gave that file; any other candidate as it is."""
    if candidate.path != "external" or not os.path.isabs(candidate.source):
        return candidate
    source = source_id_for(candidate.source, roots)
    return candidate.model_copy(update={"source": source}) if source else candidate
