"""``kb-retrieval serve``: one warm process over one ``KnowledgeLookup``, for clients outside it.

HTTP (FastAPI, served by uvicorn) and MCP (the official ``mcp`` SDK, streamable HTTP at ``/mcp``) are thin faces
over the pipeline, like ``as_tool()``:

    settings.py      the server's own settings (``KB_SERVER_*``): address, token, limits
    models.py        request and response contracts (pydantic)
    runner.py        lookups on a bounded thread pool (never on the event loop), per-request setting overrides
    alertmanager.py  an Alertmanager webhook payload -> one query per firing alert
    mcp.py           the ``lookup_knowledge`` MCP tool
    security.py      bearer token, request size limit, the structured access log
    app.py           ``create_app``: the shared state on ``app.state``, middleware, routers, the app's lifespan
    routes.py        the JSON API's routes (an ``APIRouter``, thin): /healthz, /v1/lookup, /v1/alertmanager, /v1/traces
    dependencies.py  what a route needs (runner, lookup, settings), injected by ``Depends`` from ``app.state``
    errors.py        the one error shape (``{"error": ...}``) and the exception handlers
    page.py          the retrieval-test page and /docs (an ``APIRouter``, outside the OpenAPI document)
    server.py        the ``serve`` command: build the lookup once, run uvicorn, drain the traces on SIGTERM
    client.py        what ``kb-retrieval lookup --server URL`` sends (standard library only)
    page/index.html  the retrieval-test page served at ``/``

This package's ``__init__`` imports nothing: ``client`` must load without FastAPI, LlamaIndex or Milvus.
"""
