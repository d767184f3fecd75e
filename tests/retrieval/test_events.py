"""The postprocessor call of the pipeline: core's span around ``_postprocess_nodes`` only when a handler listens."""

from __future__ import annotations

from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.span_handlers import SimpleSpanHandler
from llama_index.core.schema import NodeWithScore, TextNode

from kb_retrieval.retrieval.dedupe import SourceDeduplicator
from kb_retrieval.retrieval.events import listening, postprocess


def _nodes() -> list[NodeWithScore]:
    return [
        NodeWithScore(node=TextNode(id_=f"c{i}", text=f"chunk {i}", metadata={"source": source}), score=score)
        for i, (source, score) in enumerate([("a.md", 0.9), ("b.md", 0.7), ("a.md", 0.8)])
    ]


def _spans(handler: SimpleSpanHandler) -> list[str]:
    return [span.id_ for span in handler.completed_spans if "SourceDeduplicator._postprocess_nodes" in span.id_]


def test_postprocess_answers_what_postprocess_nodes_answers() -> None:
    dedupe = SourceDeduplicator()
    direct = postprocess(dedupe, _nodes(), None)
    stock = dedupe.postprocess_nodes(_nodes())
    assert [(n.node.node_id, n.score) for n in direct] == [(n.node.node_id, n.score) for n in stock]
    assert [n.node.node_id for n in direct] == ["c0", "c1"]


def test_postprocess_keeps_core_span_when_a_span_handler_listens() -> None:
    root = get_dispatcher()
    handler = SimpleSpanHandler()
    root.add_span_handler(handler)
    try:
        postprocess(SourceDeduplicator(), _nodes(), None)
    finally:
        root.span_handlers.remove(handler)
    assert len(_spans(handler)) == 1


def test_a_method_replaced_on_the_class_after_a_first_call_is_the_one_called(monkeypatch) -> None:
    dedupe = SourceDeduplicator()
    postprocess(dedupe, _nodes(), None)  # a first call: nothing about the class may be remembered from it
    seen: list[int] = []

    def spy(self: SourceDeduplicator, nodes: list[NodeWithScore], query_bundle: object = None) -> list[NodeWithScore]:
        seen.append(len(nodes))
        return nodes

    monkeypatch.setattr(SourceDeduplicator, "_postprocess_nodes", spy)
    assert len(postprocess(dedupe, _nodes(), None)) == 3
    assert seen == [3]


class _Heard(BaseEventHandler):
    def handle(self, event, **kwargs) -> None:  # type: ignore[no-untyped-def]
        return None


def test_listening_sees_a_handler_of_either_kind_on_the_dispatcher_or_a_parent_it_propagates_to() -> None:
    own = get_dispatcher("kb_retrieval.retrieval.rerank")
    root = get_dispatcher()
    assert not listening(own)  # core's null handlers only
    for dispatcher, handlers in ((own, own.event_handlers), (own, own.span_handlers), (root, root.event_handlers)):
        handler = _Heard() if handlers is dispatcher.event_handlers else SimpleSpanHandler()
        handlers.append(handler)
        try:
            assert listening(own)
        finally:
            handlers.remove(handler)
    assert not listening(own)
