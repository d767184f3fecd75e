"""``kb-retrieval demo``: ingest the bundled sample KB into Milvus Lite and answer a few questions, then say what
to try next."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from kb_retrieval.cli.common import command_name
from kb_retrieval.cli_args import add_lookup_arguments, settings_from_args

SAMPLE_KB = Path(__file__).parent.parent / "sample_kb"
DEMO_QUESTIONS = (
    "RedisMemoryHigh: Redis memory usage above 90% of maxmemory on redis-cache-01:6379",
    "How do I choose a garbage collector for a latency-sensitive JVM service?",
    "MySQLReplicationLag: replica db-replica-2 is 340 seconds behind the primary",
    "pods keep restarting with CrashLoopBackOff after a deploy",
    "How do I tune Kafka consumer group rebalancing?",
)
#: The question the demo suggests trying next: one the sample KB answers (the demo's own no-answer case is Kafka).
DEMO_NEXT_QUESTION = "disk full on a node"


def run(args: argparse.Namespace) -> int:
    """Ingest the sample KB, answer the questions (default: :data:`DEMO_QUESTIONS`) and print the next steps."""
    from sqlalchemy.exc import SQLAlchemyError

    from kb_retrieval.engine import KnowledgeLookup
    from kb_retrieval.indexing.ingest import ingest
    from kb_retrieval.terminal import why
    from kb_retrieval.traces import TraceStore

    settings = settings_from_args(args)
    print(f"== ingesting the sample knowledge base into Milvus ({settings.mask(settings.resolved_milvus_uri())})")
    summary = ingest([SAMPLE_KB], settings, progress=True)
    print(
        f"   {summary.documents} documents, {summary.chunks_added + summary.chunks_updated + summary.chunks_unchanged} "
        f"chunks ({summary.chunks_embedded} embedded this run) in {summary.seconds}s"
    )
    lookup = KnowledgeLookup(settings, trace_store=TraceStore.from_settings(settings))
    for question in args.questions or DEMO_QUESTIONS:
        result = lookup.lookup(question)
        print(f"\n== lookup_knowledge: {question}")
        trace = result.retrieval_trace
        print(
            f"   found={result.found} relevance={result.relevance_level} layer={result.retrieval_layer} "
            f"filter={result.query_transform.category_filter} fallback={trace.fallback_reason} "
            f"path={trace.path_served} {result.elapsed_ms:.0f} ms"
        )
        if not result.found:
            print(f"   {result.message}")
        for i, block in enumerate(result.evidence_blocks[:3], start=1):
            print(f"   [{i}] {block.source}  ({block.breadcrumb})  score={block.score:.3f}")
            print(f"       why: {why(block)}")
    where = settings.mask(settings.resolved_trace_db_url())
    try:
        print(f"\n{lookup.traces.count()} tool_invocation rows in {where}")
    except SQLAlchemyError as exc:  # the lookups answered regardless; their lost rows were logged
        print(f"\ntrace store {where} unavailable ({type(exc).__name__}): {lookup.traces.failures} rows not recorded")
    lookup.close()
    print("\n" + demo_next_steps(settings.storage.state_dir))
    return 0


def demo_next_steps(state_dir: Path) -> str:
    """The three commands a newcomer tries after the demo, pointed at the demo's own state dir."""
    state, command = shlex.quote(state_dir.as_posix()), command_name()
    steps = [
        (f'{command} lookup --state-dir {state} "{DEMO_NEXT_QUESTION}"', "ask your own question"),
        (f"{command} ingest path/to/your/kb --state-dir .kb-state/mine", "index your own knowledge base"),
        (f'{command} lookup --state-dir .kb-state/mine --full "your question"', "and look it up"),
    ]
    width = max(len(step) for step, _ in steps)
    return "Next, try:\n" + "\n".join(f"  {step:<{width}}  # {why}" for step, why in steps)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], command: str | None) -> None:
    """The ``demo`` command's options."""
    p = sub.add_parser("demo", help="ingest the bundled sample KB into Milvus Lite and answer a few questions")
    p.add_argument("questions", nargs="*", metavar="QUESTION", help="questions to ask (default: five samples)")
    add_lookup_arguments(p)
    p.set_defaults(func=run)
