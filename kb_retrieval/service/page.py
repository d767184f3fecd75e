"""The pages a browser reads: the retrieval-test page at ``/`` and the API reference at ``/docs``, both served whole
by this app (no CDN: they work on a machine with no network).

    GET  /                 the retrieval-test page (HTML; its script at /page/app.js)
    POST /page/lookup      one lookup as the page shows it: ``{"result": <the /v1/lookup JSON>, "view": ...}``, the
                           view in the terminal's words (why a block was chosen, in-pack marks, matched sections
                           once each with their heading, near misses); not part of the API
    GET  /docs             the API reference, drawn from /openapi.json by /page/docs.js

Knowledge-base content and the query are put in the pages as text, never as HTML, and the pages' scripts come from
this server only (``PAGE_HEADERS``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from kb_retrieval.models import LookupResult
from kb_retrieval.output import result_json
from kb_retrieval.result import relevance
from kb_retrieval.scoring_profile import ScoringProfile
from kb_retrieval.service.dependencies import Lookup, Runner
from kb_retrieval.service.models import LookupRequest
from kb_retrieval.terminal import (
    completeness_in_words,
    matched_sections,
    near_miss_words,
    not_found_lines,
    pack_mark,
    why,
)

PAGE_DIR = Path(__file__).parent / "page"
#: The pages' scripts come from this server only: even text that slipped into HTML could not run.
PAGE_HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "cache-control": "no-cache",
}
_FILES = {
    "app.js": "text/javascript",
    "docs.js": "text/javascript",
    "index.html": "text/html",
    "docs.html": "text/html",
}

router = APIRouter(include_in_schema=False)


def _file(name: str) -> Response:
    return Response((PAGE_DIR / name).read_bytes(), media_type=_FILES[name], headers=PAGE_HEADERS)


@router.get("/")
def page() -> Response:
    """The retrieval test page."""
    return _file("index.html")


@router.get("/page/app.js")
def page_script() -> Response:
    """The retrieval test page's script."""
    return _file("app.js")


@router.get("/docs")
def docs() -> Response:
    """The API reference page."""
    return _file("docs.html")


@router.get("/page/docs.js")
def docs_script() -> Response:
    """The API reference page's script (it draws the page from /openapi.json)."""
    return _file("docs.js")


@router.post("/page/lookup")
async def page_lookup(body: LookupRequest, request: Request, runner: Runner, lookup: Lookup) -> Response:
    """What ``POST /v1/lookup`` answers, with the page's view of it beside."""
    request.scope["state"]["access"]["query"] = body.query
    runner.check_length(body.query)
    result = await runner.lookup(body.query, body.overrides(), filters=body.filters)
    scoring = lookup.settings.scoring
    text = '{"result": ' + result_json(result.to_json_dict()) + ', "view": ' + result_json(page_view(result, scoring))
    return Response(text + "}", media_type="application/json")


def page_view(result: LookupResult, scoring: ScoringProfile) -> dict[str, Any]:
    """The result in the terminal's words, one entry per evidence block (in the result's order).

    Example:
        >>> page_view(result, BUILT_IN_PROFILE)["blocks"][0]["pack"]  # doctest: +SKIP
        'in pack'
    """
    summary = result.context_pack.summary
    return {
        "confidence": result.confidence,
        "completeness": completeness_in_words(result.completeness_hint),
        "blocks": [
            {
                "source": block.source,
                "pack": pack_mark(summary, block.source),
                "relevance": f"{relevance([block], scoring)} {block.similarity:.2f}",
                "why": why(block, limit=len(block.hit_reasons)),
                "sections": [
                    {"heading": heading, "breadcrumb": breadcrumb, "why": words}
                    for heading, breadcrumb, words in matched_sections(block)
                ],
                "sectionsNotMatched": sum(not s.matched for s in block.sections),
            }
            for block in result.evidence_blocks
        ],
        "notFound": not_found_lines(result),
        "nearMisses": [
            {
                "source": miss.source,
                "title": miss.title,
                "similarity": miss.similarity,
                "evidenceScore": miss.evidence_score,
                "threshold": miss.threshold,
                "words": near_miss_words(miss),
            }
            for miss in result.near_misses
        ],
        "leftOut": list(summary.omitted_sources),
        "cut": list(summary.truncated_sources),
    }
