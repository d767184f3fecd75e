"""``python -m kb_retrieval.evaluation``: the ``eval`` command without the rest of the CLI."""

from __future__ import annotations

import sys

from kb_retrieval.evaluation.runner import main

if __name__ == "__main__":
    sys.exit(main())
