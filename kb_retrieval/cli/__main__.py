"""``python -m kb_retrieval.cli``: the ``kb-retrieval`` command."""

import sys

from kb_retrieval.cli.run import main

sys.exit(main())
