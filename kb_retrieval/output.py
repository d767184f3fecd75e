"""How a lookup result is written out: the one JSON text that ``kb-retrieval lookup --json`` prints, that each
``--queries`` line holds (its ``caseId`` first) and that ``POST /v1/lookup`` answers.

Light on purpose (the standard library only): the ``--server`` client prints a server's answer with it, without
loading the pipeline, and the output is then byte for byte what an in-process lookup prints.

Example:
    >>> result_json({"found": True, "message": "Found 1 evidence block(s) from 1 source(s)."}, "q1")
    '{"caseId": "q1", "found": true, "message": "Found 1 evidence block(s) from 1 source(s)."}'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: ``json.dumps(..., ensure_ascii=False)``'s encoder without its check for circular references: the same bytes
#: (the same C encoder), ~0.1 ms less of a served lookup's ~30 KB response. A result's dict is a tree (a pydantic
#: dump), so there is no cycle to find.
_ENCODER = json.JSONEncoder(ensure_ascii=False, check_circular=False)


def result_json(result: Mapping[str, Any], case_id: str | None = None) -> str:
    """``result`` (a ``LookupResult.to_json_dict()``, or the same dict read back from a server) as one JSON line,
    non-ASCII text kept as it is; with ``case_id``, the ``--queries`` line: ``caseId`` first."""
    return _ENCODER.encode(result if case_id is None else {"caseId": case_id, **result})
