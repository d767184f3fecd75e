"""Typed data that rides on a node between the pipeline stages, and the hit-reason vocabulary.

Every stage works on LlamaIndex ``NodeWithScore`` lists, so the stages compose with stock retrievers and
postprocessors. What a stage learns about a node (the candidate with its raw score and label, the rerank record,
how many chunks of its document matched) is kept as one typed :class:`StageData` under one metadata key, excluded
from the text an LLM or an embedding model sees. A node from a stock retriever has none: :func:`stage_of` derives
what can be derived (the source from ``source``, ``ref_doc_id`` or ``file_path``; the similarity from its score)
and passes the rest through.

Example:
    >>> str(HitReason(kind=HitKind.L0_KEYWORD, detail="RedisMemoryHigh"))
    'l0_keyword:RedisMemoryHigh'
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache
from typing import Any

from llama_index.core.schema import BaseNode, NodeWithScore, TextNode
from pydantic import TypeAdapter

from kb_retrieval.models import Candidate, DocumentSection, ScoreLabel

STAGE_KEY = "kb_stage"


class HitKind(str, Enum):
    """Why a block was chosen. The value is the prefix of the hit reason the agent reads."""

    L1_SEMANTIC = "l1_semantic"
    L1_DOCUMENT = "l1_document"
    L0_TITLE_TERMS = "l0_title_terms"
    L0_TITLE = "l0_title"
    L0_KEYWORD = "l0_keyword"
    L0_ENTITY = "l0_entity"
    L0_CATEGORY = "l0_category"
    BREADCRUMB_MATCH = "breadcrumb_match"
    CONTENT_MATCH = "content_match"
    LEXICAL_BM25 = "lexical_bm25"
    EXACT_MATCH = "exact_match"
    RARE_TERM = "rare_term"
    L1_RANK = "l1_rank"

    @property
    def from_l0(self) -> bool:
        """An L0 hint (keyword/frontmatter) contributed: the block's layer is ``L0+L1``."""
        return self in _L0_KINDS


_L0_KINDS = frozenset(
    {
        HitKind.L0_TITLE_TERMS,
        HitKind.L0_TITLE,
        HitKind.L0_KEYWORD,
        HitKind.L0_ENTITY,
        HitKind.L0_CATEGORY,
        HitKind.BREADCRUMB_MATCH,
        HitKind.CONTENT_MATCH,
    }
)


@dataclass(frozen=True, slots=True)
class HitReason:
    """Why a candidate matched: the kind of hit and its detail (``kind:detail`` as text). A plain frozen dataclass,
    like the stage data that hold it."""

    kind: HitKind
    detail: str

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.detail}"


@lru_cache(maxsize=4096)
def hit_reason(kind: HitKind, detail: str) -> HitReason:
    """``HitReason(kind=kind, detail=detail)``, one shared object per pair: a hit reason is frozen, and the same
    ones (a similarity to three decimals, a matched keyword) recur on every lookup."""
    return HitReason(kind=kind, detail=detail)


class Boost(str, Enum):
    """Named rerank contributions, as the rerank trace records them."""

    L0_TITLE = "l0_title"
    L0_KEYWORD = "l0_keyword"
    L0_ENTITY = "l0_entity"
    L0_CATEGORY = "l0_category"
    BREADCRUMB = "breadcrumb"
    CONTENT = "content"
    TITLE_TERMS = "title_terms"
    LEXICAL = "lexical"
    DOC_FOCUS = "doc_focus"
    EXACT_MATCH = "exact_match"
    RARE_TERM = "rare_term"


#: Boosts that order candidates but say nothing about whether any of them answers (kept out of the evidence score).
RANKING_ONLY = frozenset({Boost.LEXICAL, Boost.TITLE_TERMS, Boost.DOC_FOCUS})


@dataclass(slots=True)
class RerankRecord:
    """What the rerank gave one node: its base and evidence scores, boosts, hit reasons and ranking signals.

    A plain dataclass: the stages build one per candidate and set its fields as they go, all inside the pipeline,
    so nothing is validated (its JSON, and the JSON's validation, are :class:`StageData`'s).

    Attributes:
        ranking: the document ranker's weighted signals (they sum to the node's score).
    """

    base_score: float
    evidence_score: float
    boosts: dict[str, float] = field(default_factory=dict)
    hit_reasons: list[HitReason] = field(default_factory=list)
    ranking: dict[str, float] = field(default_factory=dict)

    def kinds(self) -> set[HitKind]:
        return {r.kind for r in self.hit_reasons}


@dataclass(slots=True)
class StageData:
    """Everything the stages know about one node.

    A plain dataclass, built and changed by the pipeline's own stages without validation (a handful per candidate
    per lookup); what leaves the pipeline is its JSON (:func:`stage_json`), and JSON coming back is validated
    (:func:`stage_from_json`).

    Attributes:
        lexical_score: BM25 relative to the query's best hit.
        exact_terms: rare query terms found verbatim in the chunk.
        exact_df: how many documents hold the rarest of them.
        sections: other matched chunks of the same document (dedupe keeps them).
        document: the whole document's sections in order, matched marked (expander).
        notes: what a stage could not do for this node, and why (e.g. no vectors).
    """

    candidate: Candidate
    lexical_score: float | None = None
    exact_terms: list[str] = field(default_factory=list)
    exact_df: int | None = None
    rerank: RerankRecord | None = None
    merged_chunks: int = 1
    sections: list[Candidate] = field(default_factory=list)
    document: list[DocumentSection] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


#: The stage data's JSON schema: pydantic-core serialises and validates the dataclasses as it did the models.
_STAGE_JSON: TypeAdapter[StageData] = TypeAdapter(StageData)
_WITHOUT_CONTENT: dict[str, Any] = {"candidate": {"content"}}  # the node's text is the content: not kept twice


def stage_json(data: StageData) -> dict[str, Any]:
    """``data`` as the JSON under ``metadata[STAGE_KEY]``, without the candidate's content (the node's text).

    Example:
        >>> from kb_retrieval.models import ScoreLabel
        >>> c = Candidate(chunk_id="a", source="a.md", content="text", score=0.5, score_label=ScoreLabel.COSINE,
        ...               path="sdk", similarity=0.5)
        >>> stage_json(StageData(candidate=c, exact_df=2))["exact_df"]
        2
    """
    return _STAGE_JSON.dump_python(data, mode="json", exclude=_WITHOUT_CONTENT)


def stage_from_json(raw: dict[str, Any], content: str) -> StageData:
    """The stage data of ``raw`` (:func:`stage_json`'s form, e.g. after a JSON round trip) with ``content`` as the
    candidate's, validated: bad data raises pydantic's ``ValidationError``."""
    data = dict(raw)
    data["candidate"] = {**raw["candidate"], "content": content}
    return _STAGE_JSON.validate_python(data)


def rank_key(node: NodeWithScore) -> tuple[float, str]:
    """The order every stage leaves its nodes in: best score first, ties by node id (but the document ranker's
    places after the third, which alternate with content:
    :func:`~kb_retrieval.retrieval.doc_rank.interleave_by_content`)."""
    return -(node.score or 0.0), node.node.node_id


def candidate_node(
    candidate: Candidate,
    *,
    lexical_score: float | None = None,
    exact_terms: Iterable[str] = (),
    exact_df: int | None = None,
) -> NodeWithScore:
    """A candidate as a LlamaIndex node scored by its normalised similarity; stage data excluded from LLM text.

    The search's signals are taken as the stage data's types (a float, a list of its own, an int), as validating
    them did: a numpy scalar from a search does not reach the stages' arithmetic or the JSON.
    """
    node = TextNode(id_=candidate.chunk_id, text=candidate.content)
    data = StageData(
        candidate=candidate,
        lexical_score=None if lexical_score is None else float(lexical_score),
        exact_terms=list(exact_terms),
        exact_df=None if exact_df is None else int(exact_df),
    )
    scored = NodeWithScore(node=node, score=candidate.similarity)  # validating is cheaper than model_construct here
    write_stage(scored, data)
    return scored


class _StageJSON(dict[str, Any]):
    """What ``metadata[STAGE_KEY]`` holds: the stage data as JSON, which any LlamaIndex part can read, copy and
    serialise, plus the typed object it was written from (``typed``), so the next stage of a pipeline reads it back
    without validating it again. A copy that lost ``typed`` (a JSON round trip) is validated as before.

    Inside :func:`deferred_stage_writes` the JSON is written once, by :func:`publish_stage`, for the nodes that leave
    the pipeline (``stale`` until then), not at every stage for every candidate."""

    typed: StageData
    stale: bool


#: Set while the pipeline's own chain runs (:func:`deferred_stage_writes`): stage data is kept typed only.
_DEFERRED: ContextVar[bool] = ContextVar("kb_stage_deferred", default=False)


@contextmanager
def deferred_stage_writes() -> Iterator[None]:
    """Within the block, :func:`write_stage` keeps the typed data only; the caller then calls :func:`publish_stage`
    on the nodes it hands on. For a chain of the pipeline's own stages, where nothing else reads the JSON between
    them (the lookup's attempts); a stock pipeline writes the JSON at every stage, as before.
    """
    token = _DEFERRED.set(True)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


def write_stage(node: NodeWithScore, data: StageData) -> None:
    """Record ``data`` on the node. Stage data read with :func:`stage_of` and changed is written back with this."""
    inner = node.node
    if _DEFERRED.get():
        raw = inner.metadata.get(STAGE_KEY)
        if not isinstance(raw, _StageJSON):
            raw = inner.metadata[STAGE_KEY] = _StageJSON()
        raw.typed, raw.stale = data, True
    else:
        inner.metadata[STAGE_KEY] = _stage_json(data)
    for excluded in (inner.excluded_llm_metadata_keys, inner.excluded_embed_metadata_keys):
        if STAGE_KEY not in excluded:
            excluded.append(STAGE_KEY)


def publish_stage(nodes: Iterable[NodeWithScore]) -> None:
    """Write the JSON of stage data kept typed by :func:`deferred_stage_writes` (nodes already written: unchanged)."""
    for node in nodes:
        raw = node.node.metadata.get(STAGE_KEY)
        if isinstance(raw, _StageJSON) and getattr(raw, "stale", False):
            node.node.metadata[STAGE_KEY] = _stage_json(raw.typed)


def _stage_json(data: StageData) -> _StageJSON:
    raw = _StageJSON(stage_json(data))
    raw.typed, raw.stale = data, False
    return raw


def stage_of(node: NodeWithScore) -> StageData:
    """The node's stage data; derived from its metadata and score when it comes from a stock retriever.

    Data this pipeline wrote is returned as written (the same object: change it, then :func:`write_stage` it);
    its content is the node's text, so a postprocessor that replaced the text is seen.
    """
    raw = node.node.metadata.get(STAGE_KEY)
    content = _content(node.node)
    if isinstance(raw, _StageJSON):
        typed = raw.typed
        if typed.candidate.content != content:
            typed.candidate = typed.candidate.model_copy(update={"content": content})
        return typed
    if raw is not None:
        return stage_from_json(raw, content)
    return StageData(candidate=external_candidate(node))


def _content(inner: BaseNode) -> str:
    """``inner.get_content()``: a node class that keeps TextNode's returns its text, read here directly (stage data
    is read several times per node and stage)."""
    return inner.text if type(inner).get_content is TextNode.get_content else inner.get_content()  # type: ignore[attr-defined]


def external_candidate(node: NodeWithScore) -> Candidate:
    """What a stock node tells: source from ``source``, ``file_path``, ``file_name``, ``ref_doc_id`` or its id."""
    inner = node.node
    meta = inner.metadata
    source = meta.get("source") or meta.get("file_path") or meta.get("file_name") or inner.ref_doc_id or inner.node_id
    score = float(node.score or 0.0)
    return Candidate(
        chunk_id=inner.node_id,
        source=str(source),
        title=_text(meta.get("title")) or _text(meta.get("file_name")),
        breadcrumb=_text(meta.get("breadcrumb")),
        category=_text(meta.get("category")),
        content=inner.get_content(),
        keywords=_strings(meta.get("keywords")),
        entities=_strings(meta.get("entities")),
        score=score,
        score_label=ScoreLabel.EXTERNAL,
        path="external",
        similarity=min(1.0, max(0.0, score)),
    )


def _text(value: object) -> str | None:
    return str(value) if value not in (None, "") else None


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return []
