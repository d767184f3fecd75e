"""The LlamaIndex events a lookup emits, once each, as core's retrievers and rerankers emit them.

- ``RetrievalStartEvent`` / ``RetrievalEndEvent`` (instrumentation): one pair per retrieve. Through
  :class:`~kb_retrieval.retriever.KnowledgeRetriever` core's ``BaseRetriever.retrieve`` emits the pair (and the
  legacy ``CBEventType.RETRIEVE`` event); a plain ``lookup()`` gets one pair around its L1 attempts, from
  :func:`lookup_retrieval`, which stays quiet inside a retriever's call.
- ``CBEventType.RERANKING`` (the legacy callback manager): one per reranker call (:func:`reranking`), with the
  payload core's rerankers send (nodes, model name, query, top k), beside the ``ReRankStart/End`` events.
- Spans: the pipeline's own stages are spans (:func:`span`) exactly when a handler other than core's null ones
  listens where they go; with none, the stage is called directly. A core span costs ~77 us on this machine (it
  binds ``inspect.signature``, draws a ``uuid4`` and walks the handlers on every call). The postprocessors' spans
  (core's ``DispatcherSpanMixin`` puts one on every ``_postprocess_nodes``) are skipped the same way by
  :func:`postprocess`, and the query encoder's (on its ``_get_query_embedding``) by
  :func:`~kb_retrieval.indexing.embeddings.embed_query`, through :func:`unspanned`.

Example:
    >>> with lookup_retrieval("redis memory high") as done:  # doctest: +SKIP
    ...     done(nodes)
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.callbacks.schema import CBEventType, EventPayload
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers.null import NullEventHandler
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent, RetrievalStartEvent
from llama_index.core.instrumentation.span_handlers.null import NullSpanHandler
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle

dispatcher = get_dispatcher(__name__)
_F = TypeVar("_F", bound=Callable[..., Any])

#: True while a ``BaseRetriever.retrieve`` of the pipeline runs (it emits the retrieval events itself).
_IN_RETRIEVER: contextvars.ContextVar[bool] = contextvars.ContextVar("kb_in_retriever", default=False)


@contextmanager
def inside_retriever() -> Iterator[None]:
    """Mark the code inside as running under a retriever's ``retrieve`` (which emits the retrieval events)."""
    token = _IN_RETRIEVER.set(True)
    try:
        yield
    finally:
        _IN_RETRIEVER.reset(token)


@contextmanager
def lookup_retrieval(
    query: str | QueryBundle, *, before_end: Callable[[list[NodeWithScore]], None] | None = None
) -> Iterator[Callable[[list[NodeWithScore]], None]]:
    """One ``RetrievalStart/End`` pair around a lookup's retrieval, unless a retriever emits it; call the yielded
    function with the nodes retrieved (the end event is sent with them, or with none if it is never called).

    ``before_end`` is called with those nodes just before the end event, and only when some handler listens
    (:func:`listening`): what the nodes need only if a handler reads them (their stage data as JSON)."""
    # Nobody to hear them: the events are not built (each draws a uuid4, whose os.urandom lets other threads in).
    quiet = _IN_RETRIEVER.get() or not listening()
    found: list[NodeWithScore] = []
    if not quiet:
        dispatcher.event(RetrievalStartEvent(str_or_query_bundle=query))
    try:
        yield found.extend
    finally:
        if not quiet:
            if before_end is not None:
                before_end(found)
            dispatcher.event(RetrievalEndEvent(str_or_query_bundle=query, nodes=found))


def span(stage_dispatcher: Any) -> Callable[[_F], _F]:
    """``stage_dispatcher.span`` when a handler listens, else a direct call (see the module's note on spans).

    Example:
        >>> @span(get_dispatcher(__name__))  # doctest: +SKIP
        ... def pack_context(blocks, budget_tokens): ...
    """

    def decorate(func: _F) -> _F:
        spanned = stage_dispatcher.span(func)

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            if listening(stage_dispatcher):
                return spanned(*args, **kwargs)
            return func(*args, **kwargs)

        return call  # type: ignore[return-value]

    return decorate


def postprocess(
    postprocessor: BaseNodePostprocessor, nodes: list[NodeWithScore], query_bundle: QueryBundle | None
) -> list[NodeWithScore]:
    """``postprocessor.postprocess_nodes(nodes, query_bundle=query_bundle)``, without core's span around its
    ``_postprocess_nodes`` when no handler listens where that span goes (the events it sends itself are sent
    either way). A postprocessor with its own ``postprocess_nodes`` is always called through it."""
    kind = type(postprocessor)
    # Read from the class on every call (a few attribute reads), not cached: a method replaced on the class later
    # (a subclass, a test's spy) is the one called, and one without core's span is called through the entry point.
    own_entry = kind.postprocess_nodes is not BaseNodePostprocessor.postprocess_nodes
    method = None if own_entry else unspanned(kind, "_postprocess_nodes")
    if method is None:
        return postprocessor.postprocess_nodes(nodes, query_bundle=query_bundle)
    ranked: list[NodeWithScore] = method(postprocessor, nodes, query_bundle)
    return ranked


def unspanned(kind: type, name: str) -> Callable[..., Any] | None:
    """The function under the span core's ``DispatcherSpanMixin`` put on ``kind.<name>`` (an implementation of an
    abstract method: a postprocessor's ``_postprocess_nodes``, an embedding's ``_get_query_embedding``), when no
    handler listens where that span goes; ``None`` when the method has no such span or a handler listens.

    Read from the class on each call, not cached (a method replaced later is the one returned)."""
    method = getattr(getattr(kind, name, None), "__wrapped__", None)
    if method is None or listening(_span_dispatcher(kind.__module__)):
        return None
    return method


@functools.lru_cache(maxsize=64)
def _span_dispatcher(module: str) -> Any:
    """The dispatcher a postprocessor class's ``_postprocess_nodes`` span goes to (core names it by the module)."""
    return get_dispatcher(module)


def listening(start: Any = None) -> bool:
    """Whether an instrumentation event or span handler other than core's null ones is attached where this
    module's (or ``start``'s) events and spans go (the dispatcher and the ones they propagate to)."""
    current: Any = dispatcher if start is None else start
    while current is not None:  # asked several times a lookup: loops, no list or generator built per dispatcher
        for handler in current.event_handlers:
            if not isinstance(handler, _NULL_HANDLERS):
                return True
        for handler in current.span_handlers:
            if not isinstance(handler, _NULL_HANDLERS):
                return True
        current = current.parent if current.propagate else None
    return False


_NULL_HANDLERS = (NullEventHandler, NullSpanHandler)


@contextmanager
def reranking(
    callback_manager: CallbackManager | None, model_name: str, nodes: list[NodeWithScore], query: QueryBundle | None
) -> Iterator[Any]:
    """A ``CBEventType.RERANKING`` event for callback-manager users; ``on_end`` it with the reranked nodes. None
    when the manager has no handler (the event would reach nobody): ``on_end`` is then a no-op."""
    if callback_manager is None or not callback_manager.handlers:  # not an empty manager made to ask it (a uuid4)
        yield _NO_EVENT
        return
    manager = callback_manager
    payload: dict[str, Any] = {
        EventPayload.NODES: nodes,
        EventPayload.MODEL_NAME: model_name,
        EventPayload.QUERY_STR: query.query_str if query is not None else None,
        EventPayload.TOP_K: len(nodes),
    }
    with manager.event(CBEventType.RERANKING, payload=payload) as event:
        yield event


class _NoEvent:
    """What :func:`reranking` yields when no callback handler would receive the event."""

    def on_end(self, payload: dict[str, Any] | None = None) -> None:
        """Nothing to end."""


_NO_EVENT = _NoEvent()
