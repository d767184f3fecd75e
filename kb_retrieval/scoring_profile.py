"""The scoring profile: every fitted weight and cut-off of the rule reranker, the document ranking, dedupe and result
assembly, as one versioned, frozen object.

These numbers were chosen by measurement on the public golden sets (docs/tuning-history.md), not by a user turning
a knob, so they are not environment settings: a lookup reads one profile as a whole, and its version is recorded
with every trace row and bench report. The built-in profile is :data:`BUILT_IN_PROFILE`. To try another, write a
JSON file of a profile, complete or partial (the weights it leaves out are the built-in's), with a ``version`` of its
own, and name it in ``KB_SCORING_PROFILE``; the tuning tools pass one in Python
(``KBSettings(scoring=ScoringProfile(...))``). Each knowledge base still adjusts the document ranking's mixture when
an index version is first opened (``fit_ranking``; :mod:`kb_retrieval.retrieval.rank_fit`).

**Version** ``<year>.<month>.<n>``: the month of the change and its number within the month, from 1. Bump it
whenever a value of the built-in profile changes (a weight refitted, a cut-off moved, a field added, renamed or
removed); a description alone does not bump it. A profile file's version must differ from the built-in's.

Example:
    >>> BUILT_IN_PROFILE.version
    '2026.12.1'
    >>> BUILT_IN_PROFILE.ranking_weights()["doc_text"]
    1.5
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["BUILT_IN_PROFILE", "ENVIRONMENT_VARIABLE", "ProfileError", "ScoringProfile", "load_profile"]

#: The variable naming a profile file (``KBSettings.scoring_profile``).
ENVIRONMENT_VARIABLE = "KB_SCORING_PROFILE"
#: The built-in profile's version (see the module docstring for when it changes).
BUILT_IN_VERSION = "2026.12.1"


class ProfileError(ValueError):
    """A scoring profile file that cannot be used; the message names the file and the key."""


class ScoringProfile(BaseModel):
    """Every weight and cut-off of the rule reranker, dedupe, document ranking and result assembly, each with the
    reason or measurement it was chosen with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = Field(
        default=BUILT_IN_VERSION,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$",
        description="Which profile this is, recorded in traces and bench reports: the built-in one's is "
        "<year>.<month>.<n>, bumped when any of its values changes; a profile file names its own.",
    )

    # --- rule reranker boosts (RuleReranker): set by hand on the public runbook sets in the first sessions ------
    boost_l0_title: float = Field(default=0.15, ge=0, le=1, description="The document's title was matched by L0.")
    boost_l0_keyword: float = Field(
        default=0.15, ge=0, le=1, description="A frontmatter keyword of the document (e.g. an alert name) matched."
    )
    boost_l0_entity: float = Field(default=0.05, ge=0, le=1, description="An entity of the document matched.")
    boost_l0_category: float = Field(
        default=0.03,
        ge=0,
        le=1,
        description="The document's category is an L0 domain: weak, domains are wide.",
    )
    boost_breadcrumb: float = Field(
        default=0.04, ge=0, le=1, description="A matched keyword or entity occurs in the chunk's breadcrumb."
    )
    boost_content: float = Field(
        default=0.04, ge=0, le=1, description="A matched keyword or entity occurs in the chunk's text."
    )
    boost_title_terms: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="Times the L0 title coverage (0.5-1): the query holds much of the title, term by term "
        "(0.15/0.2/0.3 tried on the public sets; 0.2 best).",
    )
    boost_exact_match: float = Field(
        default=0.6,
        ge=0,
        le=1,
        description="Divided by the documents holding it: a chunk holds a rare identifier of the query verbatim (and "
        "is evidence whatever its similarity). The one literal holder outranks a document-focus boost (0.45).",
    )
    exact_match_max_df: int = Field(
        default=2,
        ge=0,
        description="An identifier is rare enough to be evidence when at most this many documents hold it "
        "(2: measured on the public sets to fire rarely and rightly; 0 turns the signal off).",
    )
    rare_term_max_df: int = Field(
        default=1,
        ge=0,
        description="A plain word or UpperCamel name of the query is a rare term (evidence, like an identifier) when "
        "at most this many documents hold it and such a document names it in its title or a heading (1: see "
        "retrieval/exact.py for the measurement; 0 turns the signal off).",
    )
    focus_saturation: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Document focus (matched chunks / (chunks + 2)) at which the focus boost is full: among "
        "focused documents more focus says nothing more.",
    )
    focus_padding: int = Field(
        default=2, ge=0, description="Added to a document's chunk count: a one-chunk page is not all about a query."
    )
    close_call_margin: float = Field(
        default=0.1,
        ge=0,
        description="The first document leads clearly when its final score is at least this far above the second's; "
        "below, the result's confidence says 'close call' and names both (on the public runbook sets the first "
        "document was right in 96% of lookups at a lead of 0.1 or more, in 62% below it; 11 of the 19 lookups whose "
        "right runbook came second were below).",
    )
    relevance_high: float = Field(
        default=0.6,
        ge=0,
        le=1,
        description="Top similarity from which relevance is high (set on the runbooks; each knowledge base raises it "
        "to what its own out-of-document questions reach: calibrate_thresholds).",
    )
    relevance_medium: float = Field(
        default=0.45, ge=0, le=1, description="Top similarity from which relevance is medium (below: low)."
    )
    min_content_tokens: int = Field(
        default=12, ge=1, description="A packed block needs room for at least this much content, else it is omitted."
    )
    l0_max_keyword_documents: int = Field(
        default=3, ge=1, description="A keyword shared by more documents than this is too generic to be a hint."
    )
    l0_title_coverage_min: float = Field(
        default=0.5, ge=0, le=1, description="Title coverage below this is not a hint (half the title at least)."
    )
    l0_title_coverage_limit: int = Field(default=20, ge=1, description="Title-coverage hints kept per query.")

    # --- document ranking (DocumentRanker): one linear model over the signals of a document ------------------
    # Fitted on the public golden sets (every runbooks set, both settings: a listwise softmax loss over each
    # query's candidate documents, then rounded); 4-fold cross-validation by query gave the alert sets within 0.02
    # of the fitted figures and paraphrase hit@1 0.63 / 0.67 (runbooks / mixed) against 0.54 / 0.53 before
    # document ranking (0.58 / 0.67 without the static model's signal).
    rank_title: float = Field(
        default=0.75,
        ge=0,
        le=5,
        description="Times the query's similarity to the document's title vector (fitted, see rank_text).",
    )
    rank_summary: float = Field(
        default=0.75,
        ge=0,
        le=5,
        description="Times the similarity to the title + opening section vector (fitted, see rank_text).",
    )
    rank_text: float = Field(
        default=1.5,
        ge=0,
        le=5,
        description="Times the similarity to the text vector (its chunks' mean). The rank_* weights were fitted on "
        "the public runbook sets (a listwise softmax loss over each query's candidate documents, rounded; 4-fold "
        "cross-validation by query: paraphrase hit@1 0.63 / 0.67, runbooks / mixed, against 0.54 / 0.53 without "
        "document ranking).",
    )
    rank_static_summary: float = Field(
        default=0.5,
        ge=0,
        le=5,
        description="Times the static model's similarity of the query to the title + opening section "
        "(kb_retrieval.indexing.static_embed; fitted, see rank_text).",
    )
    rank_static_title: float = Field(
        default=0.75,
        ge=0,
        le=5,
        description="Times the static model's similarity of the query to the document's title, words weighted by "
        "their rarity in the knowledge base (the title vector's weight, not fitted: on the public sets 0.5-1.0 "
        "gave the same figures within a query or two per set).",
    )
    static_common_min_documents: int = Field(
        default=20,
        ge=0,
        description="From this many documents the static model's signals leave out the direction every document's "
        "static vector shares (its first singular vector, kb_retrieval.indexing.doc_vectors.common_direction); 0: "
        "never. Fewer documents do not estimate it.",
    )
    rank_chunk: float = Field(
        default=0.0,
        ge=0,
        le=5,
        description="Times the best chunk's similarity. The fallback: each knowledge base chooses its own when an "
        "index version is first opened (fit_ranking; the runbooks keep 0, the Prometheus docs choose more), and this "
        "value holds when the fit is off, has too few sections, or gains less than the noise. Fitted -0.25 on the "
        "public sets once the document vectors are there, so 0 (it still decides which section is the evidence, "
        "and whether any is).",
    )
    rank_lexical: float = Field(
        default=0.3,
        ge=0,
        le=5,
        description="Times the rule reranker's lexical boost (fitted, see rank_text; the ranking fit may choose "
        "another per knowledge base).",
    )
    rank_title_terms: float = Field(
        default=2.2, ge=0, le=5, description="Times the title-terms boost (fitted, see rank_text)."
    )
    rank_l0: float = Field(
        default=1.7,
        ge=0,
        le=5,
        description="Times the L0 boosts (title, keyword, entity, category, breadcrumb, content; fitted, see "
        "rank_text).",
    )
    rank_doc_focus: float = Field(
        default=0.05,
        ge=0,
        le=5,
        description="Times the document-focus boost (fitted 0.05: the document vectors say what focus said).",
    )
    rank_exact_match: float = Field(
        default=1.0, ge=0, le=5, description="Times the exact-identifier boost (too rare in the sets to fit: kept)."
    )

    # --- how each knowledge base adjusts the ranking (kb_retrieval.retrieval.rank_fit) -------------------------
    fit_ranking: bool = Field(
        default=True,
        description="Let each knowledge base choose, when an index version is first opened, the best section's "
        "weight (rank_chunk), its BM25's weight (rank_lexical) and a factor on the identity weights (rank_title, "
        "rank_summary, rank_static_*) on questions made from its own sections (kb_retrieval.retrieval.rank_fit); "
        "off, or with too few sections, the rank_* weights as set.",
    )
    fit_queries: int = Field(
        default=200, ge=0, le=2000, description="Pseudo-queries the ranking fit asks at most (0: no fit)."
    )
    fit_min_queries: int = Field(
        default=50, ge=1, le=2000, description="Fewer pseudo-queries than this: the rank_* weights as set."
    )

    @property
    def exact_signals(self) -> bool:
        """Whether a lookup needs the exact-identifier index (identifiers or rare terms on)."""
        return self.exact_match_max_df > 0 or self.rare_term_max_df > 0

    def ranking_weights(self) -> dict[str, float]:
        """The document ranker's weights by the names its trace records."""
        return {
            "doc_title": self.rank_title,
            "doc_summary": self.rank_summary,
            "doc_text": self.rank_text,
            "doc_static": self.rank_static_summary,
            "doc_static_title": self.rank_static_title,
            "chunk": self.rank_chunk,
            "lexical": self.rank_lexical,
            "title_terms": self.rank_title_terms,
            "l0": self.rank_l0,
            "doc_focus": self.rank_doc_focus,
            "exact_match": self.rank_exact_match,
        }

    def fit_inputs(self) -> dict[str, float]:
        """What a knowledge base's ranking fit depends on besides the knowledge base: the ranking weights (the
        grid's first point, the one a choice must beat) and how many pseudo-queries it asks (``fit_queries``,
        ``fit_min_queries``). A fit stored under other inputs is taught again (``RankFit.taught_under``)."""
        return {
            **self.ranking_weights(),
            "fit_queries": float(self.fit_queries),
            "fit_min_queries": float(self.fit_min_queries),
        }

    def boosts(self) -> dict[str, float]:
        """The rerank boosts by the names the rerank trace records."""
        return {
            "l0_title": self.boost_l0_title,
            "l0_keyword": self.boost_l0_keyword,
            "l0_entity": self.boost_l0_entity,
            "l0_category": self.boost_l0_category,
            "breadcrumb": self.boost_breadcrumb,
            "content": self.boost_content,
            "title_terms": self.boost_title_terms,
            "exact_match": self.boost_exact_match,
        }

    def variant(self, suffix: str, **weights: Any) -> ScoringProfile:
        """This profile with ``weights`` changed and its version marked ``+suffix`` (what a tuning tool runs), so a
        trace never takes the variant for the profile.

        Example:
            >>> BUILT_IN_PROFILE.variant("fit-off", fit_ranking=False).version
            '2026.12.1+fit-off'
        """
        return ScoringProfile.model_validate({**self.model_dump(), **weights, "version": f"{self.version}+{suffix}"})


#: The built-in profile: what every lookup reads unless ``KB_SCORING_PROFILE`` names another.
BUILT_IN_PROFILE = ScoringProfile()


def load_profile(path: Path) -> ScoringProfile:
    """The profile a JSON file holds: an object with its own ``version`` and any of :class:`ScoringProfile`'s
    weights (the others are the built-in's), each of the weight's type (a number, an integer, true/false).

    Raises:
        ProfileError: the file is missing or not JSON, a key is unknown, a value has the wrong type or range, or
            the version is missing or the built-in's; the message names the file and the key.
    """
    where = f"scoring profile {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(f"{where}: no such file") from None
    except OSError as error:
        raise ProfileError(f"{where}: cannot be read ({error.strerror or type(error).__name__})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ProfileError(f"{where}: not JSON ({error.msg} at line {error.lineno} column {error.colno})") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: must be a JSON object of weights by name, with a version")
    return _validated(data, where)


def _validated(data: Mapping[str, Any], where: str) -> ScoringProfile:
    if unknown := sorted(set(data) - set(ScoringProfile.model_fields)):
        hints = [f"{name!r}" + _close(name) for name in unknown]
        raise ProfileError(f"{where}: unknown key {', '.join(hints)} (the keys are docs/configuration.md's)")
    version = data.get("version")
    if version is None:
        raise ProfileError(f"{where}: key 'version' is missing (a profile file names its own version)")
    if version == BUILT_IN_VERSION:
        raise ProfileError(
            f"{where}: key 'version' is {version!r}, the built-in profile's: give this profile a version of its own, "
            "so a trace never takes one for the other"
        )
    try:
        return ScoringProfile.model_validate({**BUILT_IN_PROFILE.model_dump(), **data}, strict=True)
    except ValidationError as error:
        problems = [f"key {'.'.join(str(p) for p in e['loc'])!r}: {e['msg']}" for e in error.errors(include_url=False)]
        raise ProfileError(f"{where}: {'; '.join(problems)}") from None


def _close(name: str) -> str:
    match = difflib.get_close_matches(name, ScoringProfile.model_fields, n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def environment_refusal(environ: Mapping[str, object]) -> str | None:
    """Why the environment cannot be used, or None: it sets a weight one by one (``KB_SCORING__<NAME>`` or a whole
    ``KB_SCORING``), which is no longer read; the profile is chosen as a whole by ``KB_SCORING_PROFILE``.

    Example:
        >>> environment_refusal({"KB_SCORING__BOOST_L0_TITLE": "0.2"})[:47]
        'KB_SCORING__BOOST_L0_TITLE is no longer read: t'
    """
    names = sorted(k.upper() for k in environ if k.upper() == "KB_SCORING" or k.upper().startswith("KB_SCORING__"))
    if not names:
        return None
    return (
        f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} no longer read: the scoring weights are one "
        f"versioned profile (kb_retrieval.scoring_profile); write the weights to change in a JSON file with a version "
        f"of its own and set {ENVIRONMENT_VARIABLE} to it (docs/configuration.md, 'The scoring profile')"
    )
