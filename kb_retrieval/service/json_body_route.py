"""A route class that answers a well-formed JSON request without FastAPI's per-request machinery, and hands every
other request to FastAPI's own handler, so a client sees the same answers (errors included) either way.

FastAPI's handler spends more than half of a lookup's time in the app outside the lookup (~0.16 of ~0.27 ms here) on
work a well-formed lookup does not need: ``json.loads`` and then validation of the decoded body, the query
parameters and each dependency's own (empty) parameters, per request. :class:`JSONBodyRoute` validates the raw bytes
with the body model's ``model_validate_json`` instead, and calls each dependency that reads ``app.state`` directly,
when all of these hold:

* the route's endpoint takes one JSON body model, the request, query parameters that have defaults and dependencies
  that take the request only (``dependencies.py``), and returns a ``Response`` (no response model to serialise);
* the request has no query string, says ``Content-Type: application/json`` and its body is valid for the model;
* no dependency override is set (tests).

Anything else (a body that fails, another content type, ``?view=terminal``) goes to FastAPI's handler as it came,
body included (the request caches it): its 400 and 422 answers, and the route's, are FastAPI's own. The route is
declared as any other, so ``/openapi.json`` is what FastAPI draws from the same declaration.

Example:
    >>> router = APIRouter(route_class=JSONBodyRoute)  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from pydantic import BaseModel

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class JSONBodyRoute(APIRoute):
    """An ``APIRoute`` whose handler takes the short way for a request it can answer exactly as FastAPI would."""

    def get_route_handler(self) -> Handler:
        stock: Handler = super().get_route_handler()
        plan = _ShortWay.for_route(self)
        if plan is None:
            return stock
        overrides = self.dependency_overrides_provider

        async def handler(request: Request) -> Response:
            if request.scope.get("query_string") or not _is_json(request.headers.get("content-type")):
                return await stock(request)
            if overrides is not None and getattr(overrides, "dependency_overrides", None):
                return await stock(request)
            try:
                body = plan.model.model_validate_json(await request.body())
            except Exception:  # FastAPI's own parse and validation say what is wrong, in its words
                return await stock(request)
            return await plan.call(request, body)

        return handler


class _ShortWay:
    """What the short way needs of a route: its body model and the parameter names to call its endpoint with."""

    def __init__(self, dependant: Dependant, body: str, model: type[BaseModel], state: list[tuple[str, Any]]) -> None:
        self.endpoint = dependant.call
        self.request_name = dependant.request_param_name
        self.body_name = body
        self.model = model
        self.state = state  # (parameter name, async function of the request) per dependency

    @classmethod
    def for_route(cls, route: APIRoute) -> _ShortWay | None:
        """The plan for ``route``, or ``None`` when FastAPI's handler must answer every request of it."""
        dependant = route.dependant
        if (
            route.response_field is not None
            or not inspect.iscoroutinefunction(dependant.call)
            or len(dependant.body_params) != 1
            or dependant.path_params
            or dependant.header_params
            or dependant.cookie_params
            or any(field.field_info.is_required() for field in dependant.query_params)
            or any(_special_params(dependant))
        ):
            return None
        (field,) = dependant.body_params
        model = field.field_info.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or not field.field_info.is_required():
            return None
        if getattr(route, "_embed_body_fields", False):
            return None
        state = []
        for sub in dependant.dependencies:
            if not _reads_request_only(sub) or sub.name is None:
                return None
            state.append((sub.name, sub.call))
        return cls(dependant, field.name, model, state)

    async def call(self, request: Request, body: BaseModel) -> Response:
        values: dict[str, Any] = {self.body_name: body}
        if self.request_name:
            values[self.request_name] = request
        for name, read in self.state:
            values[name] = await read(request)
        assert self.endpoint is not None
        response = await self.endpoint(**values)
        if not isinstance(response, Response):  # the route's declaration promised one (no response model)
            raise TypeError(f"{self.endpoint.__name__} returned {type(response).__name__}, not a Response")
        return response


def _special_params(dependant: Dependant) -> tuple[str | None, ...]:
    return (
        dependant.websocket_param_name,
        dependant.http_connection_param_name,
        dependant.response_param_name,
        dependant.background_tasks_param_name,
        dependant.security_scopes_param_name,
    )


def _reads_request_only(sub: Dependant) -> bool:
    """A dependency such as ``get_runner(request)``: async, the request its one parameter, nothing of its own."""
    return (
        inspect.iscoroutinefunction(sub.call)
        and sub.request_param_name is not None
        and not (sub.path_params or sub.query_params or sub.header_params or sub.cookie_params or sub.body_params)
        and not sub.dependencies
        and not any(_special_params(sub))
        and len(inspect.signature(sub.call).parameters) == 1
    )


def _is_json(content_type: str | None) -> bool:
    """``application/json`` (with parameters or not): what FastAPI decodes as JSON too."""
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == "application/json"
