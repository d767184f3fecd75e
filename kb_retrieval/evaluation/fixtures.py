"""Retrieval fixtures: what one ``lookup_knowledge`` call returned for one golden case, frozen on disk.

The recorder (``kb-retrieval fixtures record``) runs the live pipeline once per golden case and writes a
:class:`Fixture` with :func:`write_fixture`; the offline evaluator reads it back with :func:`load_fixture`.
These models are the whole contract between the two: the evaluator never needs Milvus, a model or a
database.

One file per case, ``<fixtures_dir>/<fixture_filename(case_id)>``, e.g. ``fixtures/redis-001.json``.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kb_retrieval.atomic import atomic_write
from kb_retrieval.evaluation.errors import FixtureError, parse_json_object, read_text


class FixtureCandidate(BaseModel):
    """One document in the pipeline's final ranking (after rerank and dedupe: one candidate per source).

    Example:
        >>> c = FixtureCandidate(rank=1, source="redis/memory.md", breadcrumb="Redis memory > Mitigation",
        ...                      score_label="cosine_similarity", score=0.82, similarity=0.82,
        ...                      path="sdk", content="Set maxmemory ...")
        >>> c.label()
        'redis/memory.md > Redis memory > Mitigation'
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    rank: int = Field(ge=1)
    """1-based position in the final ranking."""
    source: str = Field(min_length=1)
    """Document id: path relative to the knowledge-base root, ``/``-separated."""
    title: str | None = None
    breadcrumb: str | None = None
    """Heading path of the best chunk, e.g. ``"Redis memory usage high > Mitigation"``."""
    category: str | None = None
    score_label: str
    """What ``score`` means: ``cosine_similarity``, ``ip_similarity``, ``l2_distance``, ``fused``, ..."""
    score: float
    """The raw score, in the semantics named by ``score_label``."""
    similarity: float | None = Field(default=None, ge=0.0, le=1.0)
    """The score normalised to a similarity in [0, 1], when the path could compute one."""
    path: str | None = None
    """Which retrieval path produced the candidate, e.g. ``sdk`` or ``vectorstore``."""
    content: str
    """The candidate's text, searched by keyword checks."""

    def label(self) -> str:
        """Short human label: ``source > breadcrumb`` (or ``source > title``, or ``source``)."""
        heading = self.breadcrumb or self.title
        return f"{self.source} > {heading}" if heading else self.source


class Fixture(BaseModel):
    """The recorded outcome of one golden case.

    ``result`` is the final lookup result as JSON (camelCase keys as the tool returns them). The evaluator
    reads only ``found`` (bool, required), ``evidenceStatus`` (str, e.g. ``"ok"`` / ``"no_evidence"``), the
    ``content`` of each item of ``evidenceBlocks`` and the ``source`` of the blocks the agent received
    (``contextPack.blocks``, else ``evidenceBlocks``); every other key is kept untouched.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    case_id: str = Field(min_length=1)
    query: str
    """The query sent to the lookup, verbatim from the golden case (a mismatch marks the fixture stale)."""
    recorder: dict[str, Any] = {}
    """Settings used when recording (top_k, mode, ...). No timestamps, so re-recording is diff-free."""
    candidates: list[FixtureCandidate] = []
    """Document-level ranking in rank order (ranks 1..n), one candidate per source."""
    result: dict[str, Any]

    @field_validator("result")
    @classmethod
    def _result_shape(cls, result: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(result.get("found"), bool):
            raise ValueError("'found' must be present and a boolean")
        status = result.get("evidenceStatus")
        if status is not None and not isinstance(status, str):
            raise ValueError("'evidenceStatus' must be a string")
        blocks = result.get("evidenceBlocks", [])
        if not isinstance(blocks, list) or not all(isinstance(block, dict) for block in blocks):
            raise ValueError("'evidenceBlocks' must be a list of objects")
        for index, block in enumerate(blocks):
            if not isinstance(block.get("content", ""), str):
                raise ValueError(f"'evidenceBlocks[{index}].content' must be a string")
        return result

    @model_validator(mode="after")
    def _one_ranking(self) -> Fixture:
        ranks = [candidate.rank for candidate in self.candidates]
        if ranks != list(range(1, len(ranks) + 1)):
            raise ValueError(f"candidates must be in rank order with ranks 1..n, got ranks {ranks}")
        seen: set[str] = set()
        for candidate in self.candidates:
            if candidate.source in seen:
                raise ValueError(f"source {candidate.source!r} appears twice in candidates (one per source)")
            seen.add(candidate.source)
        return self

    @property
    def found(self) -> bool:
        """Whether the lookup reported evidence (``result["found"]``)."""
        return bool(self.result["found"])

    @property
    def evidence_status(self) -> str | None:
        """``result["evidenceStatus"]``, e.g. ``"ok"`` or ``"no_evidence"``."""
        status = self.result.get("evidenceStatus")
        return status if isinstance(status, str) else None

    @property
    def evidence_contents(self) -> list[str]:
        """The ``content`` of each evidence block, in order."""
        return [block.get("content", "") for block in self.result.get("evidenceBlocks", [])]

    @property
    def received_sources(self) -> list[str] | None:
        """The sources the agent received: those of the context pack's blocks (the text the tool hands over), or
        of the evidence blocks when the result holds no context pack; none when ``found`` is false.

        Candidates ranked below the evidence threshold, or left out of the pack by its token budget, are not
        among them. None when the result does not name its blocks' sources (nothing can be said).
        """
        if not self.found:
            return []
        pack = self.result.get("contextPack")
        blocks = pack.get("blocks") if isinstance(pack, dict) else None
        if not isinstance(blocks, list):
            blocks = self.result.get("evidenceBlocks", [])
        sources = [block.get("source") for block in blocks if isinstance(block, dict)]
        if not all(isinstance(source, str) for source in sources):
            return None
        return [source for source in sources if isinstance(source, str)]


_PLAIN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# The slug of an escaped id keeps no dots, so no prefix before a dot can be a reserved device name.
_SLUG_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9_-]+")
# Device names Windows refuses as file names, whatever the extension.
_WINDOWS_RESERVED = frozenset(
    {"con", "prn", "aux", "nul"} | {f"{port}{n}" for port in ("com", "lpt") for n in range(1, 10)}
)


def fixture_filename(case_id: str) -> str:
    """The fixture file name for a case id: safe on every filesystem, deterministic and collision-free.

    A plain id (letters, digits, ``.``, ``_``, ``-``; starting with a letter or digit; up to 100
    characters; not a reserved device name) is used as it is. Any other id becomes a readable slug
    (letters, digits, ``_``, ``-``, at most 60) plus ``~`` and 12 hex digits of its SHA-256: it cannot
    collide with a plain id (which holds no ``~``) nor, short of a hash collision, with another escaped
    id. Both the recorder and the evaluator must go through this function.

    Note that two plain ids differing only in letter case (``Foo``/``foo``) share a file on
    case-insensitive filesystems (macOS, Windows); keep golden ids unique regardless of case.

    Example:
        >>> fixture_filename("kp-001-AlertmanagerFailedReload")
        'kp-001-AlertmanagerFailedReload.json'
        >>> fixture_filename("../etc/passwd")
        'etc_passwd~7fef78f53440.json'

    Args:
        case_id: A golden case id (any non-empty string).

    Returns:
        A file name (no directory part) ending in ``.json``.
    """
    if _PLAIN_ID.fullmatch(case_id) and case_id.split(".")[0].lower() not in _WINDOWS_RESERVED:
        return f"{case_id}.json"
    slug = _SLUG_UNSAFE_RUN.sub("_", case_id).strip("_-")[:60] or "case"
    digest = hashlib.sha256(case_id.encode("utf-8")).hexdigest()[:12]
    return f"{slug}~{digest}.json"


def fixture_to_json(fixture: Fixture) -> str:
    """Serialise a fixture deterministically: sorted keys, indent 2, trailing newline, floats as-is."""
    data = fixture.model_dump(mode="json")
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def write_fixture(fixture: Fixture, directory: str | Path) -> Path:
    """Write ``fixture`` to ``<directory>/<fixture_filename(case_id)>``, creating the directory.

    The write is atomic (temporary file, then rename), so an interrupted recording never leaves a
    half-written fixture behind. Writing the same fixture twice gives byte-identical files.

    Args:
        fixture: The fixture to write.
        directory: The fixtures directory.

    Returns:
        The path written.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / fixture_filename(fixture.case_id)
    with atomic_write(target, newline="\n") as stream:
        stream.write(fixture_to_json(fixture))
    return target


def load_fixture(directory: str | Path, case_id: str) -> Fixture | None:
    """Read the fixture of one case.

    Args:
        directory: The fixtures directory.
        case_id: The golden case id.

    Returns:
        The fixture, or None when the case has no fixture file.

    Raises:
        FixtureError: The file is not valid JSON, does not match the contract, or holds another case id.
    """
    path = Path(directory) / fixture_filename(case_id)
    try:
        text = read_text(path, FixtureError)
    except FileNotFoundError:
        return None
    fixture = parse_json_object(text, Fixture, str(path), FixtureError)
    if fixture.case_id != case_id:
        raise FixtureError(f"{path}: holds case_id {fixture.case_id!r}, expected {case_id!r}")
    return fixture
