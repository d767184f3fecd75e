"""Progress on long work (ingest, fixtures record, compare, bench): a tqdm bar on stderr, with its rate and ETA.

A bar is drawn only when asked for and stderr is a terminal: a script, a pipe, a log file or ``--json`` output never
sees one (tqdm's control characters would be noise there).

Example:
    >>> bar = progress_bar(3, "recording fixtures", "case", enabled=False)
    >>> bar.disable
    True
"""

from __future__ import annotations

import sys

from tqdm import tqdm


def on_terminal() -> bool:
    """Whether stderr is a terminal a person watches (where progress belongs)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def progress_bar(total: int, desc: str, unit: str, *, enabled: bool | None = None) -> tqdm:
    """A bar of ``total`` steps on stderr; drawn only when ``enabled`` (default: stderr is a terminal) and there
    is something to do."""
    show = on_terminal() if enabled is None else enabled and on_terminal()
    return tqdm(total=total, desc=desc, unit=unit, disable=not show or total == 0, file=sys.stderr, dynamic_ncols=True)
