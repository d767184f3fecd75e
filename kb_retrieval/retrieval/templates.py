"""Alert-template placeholders in a query: syntax, not words about the problem.

An alert rule's annotation pasted as it stands holds template syntax: ``{{ $labels.pod }}``,
``{{ $value | humanizePercentage }}``, a bare ``$value``. A rendered alert holds the values instead
(``monitoring/alertmanager-main-0``) and none of it. To the query encoder each placeholder is seven to twelve word
pieces of braces, dollars, dots and pipes: on the public alert texts they are 45% of the word pieces (56.5 per query,
31 without them), they pull every such query towards every other, and the encoder's time grows with the word
pieces. So the encoder reads the query without them (``KBSettings.retrieval.drop_template_placeholders``); the
exact-identifier index never takes a token from them; BM25 and L0 read the query as it was.

Example:
    >>> without_placeholders("Alertmanager {{ $labels.namespace }}/{{ $labels.pod}} has {{ $value }} members.")
    ('Alertmanager / has members.', 3)
"""

from __future__ import annotations

import re

#: A placeholder of a Prometheus or Alertmanager template: ``{{ ... }}`` (never across another one's braces), or a
#: bare template variable (``$value``, ``$labels.node``).
PLACEHOLDER = re.compile(r"\{\{.*?\}\}|\$\w[\w.]*")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([.,;:)])")
_SPACES = re.compile(r"\s{2,}")


def without_placeholders(text: str) -> tuple[str, int]:
    """``text`` without its template placeholders (spacing tidied), and how many it held."""
    stripped, count = PLACEHOLDER.subn(" ", text)
    if not count:
        return text, 0
    tidy = _SPACES.sub(" ", _SPACE_BEFORE_PUNCTUATION.sub(r"\1", stripped)).strip()
    return tidy or text, count
