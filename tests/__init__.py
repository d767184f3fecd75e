"""The tests mirror the package, so a reader finds a module's tests by its path.

The rule: a test of ``kb_retrieval/a/b.py`` lives in ``tests/a/test_b.py``, or in a file of ``tests/a/`` named after
what it tests (``tests/retrieval/test_postprocessors.py`` for rerank, dedupe and document ranking as LlamaIndex
parts); a test of a top-level module ``kb_retrieval/x.py`` is ``tests/test_x.py``; the ``sidecar`` package's tests
are under ``tests/sidecar/``. Two folders mirror nothing: ``tests/reliability/`` (scenarios across the whole
pipeline: outages, crashes, full disks, hostile input) and ``tests/support/`` (the helpers and test servers the
others share). A test file named after a theme rather than a module goes into the file of the module it tests.

Project-wide checks stay at the top of ``tests/``, each listed here (``tests/test_layout.py`` fails on any other
top-level ``tests/test_*.py`` that is not named after a top-level module, and on a name listed here that is gone):

- ``test_baselines.py``: the committed baselines are current
- ``test_dependencies.py``: shipped code imports only what its install or a named extra brings
- ``test_doctests.py``: the examples in the package's docstrings run and give what they show
- ``test_environment.py``: library code leaves the process environment alone
- ``test_imports.py``: modules import forward (no cycles, the core never imports the sidecar), the public names
- ``test_layout.py``: this rule
- ``test_module_size.py``: no module over 400 lines unless its docstring says why
- ``test_notebook.py``: the notebook runs top to bottom and is committed clean
- ``test_readme.py``: the README's and the docs pages' python blocks run as written
- ``test_start_up_imports.py``: what a process imports to ingest and look up
- ``test_support_servers.py``: the test servers themselves (Milvus standalone, PostgreSQL by URL)
"""
