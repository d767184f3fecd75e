"""What a newcomer meets, said plainly (issue 41, item 6): a state dir with no knowledge base, a partial pack,
a data dir another process holds, a query from stdin, warnings, ``--help``, the one-time encoder export."""

from __future__ import annotations

import argparse
import io
import logging
from pathlib import Path

import pytest

from kb_retrieval.cli import build_parser, main
from kb_retrieval.cli import lookup as lookup_command
from kb_retrieval.indexing import onnx_query
from kb_retrieval.indexing.milvus import lite_locked_message
from kb_retrieval.log_format import _MaskingFormatter

pytestmark = pytest.mark.unit

COMMANDS = ["ingest", "stats", "lookup", "serve", "traces", "fixtures", "eval", "compare", "golden", "bench", "demo"]


@pytest.mark.parametrize("command", ["lookup", "stats"])
def test_a_state_dir_without_a_knowledge_base_is_said_and_not_created(tmp_path, capsys, command):
    state = tmp_path / "mistyped"
    code = main([command, *(["disk full"] if command == "lookup" else []), "--state-dir", str(state)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"error: no knowledge base in {state} (milvus.db not found)" in err
    assert "ingest KB_DIR --state-dir" in err and "Traceback" not in err
    assert not state.exists()  # nothing created: no folder, no empty milvus.db or traces.db


def test_the_held_dir_error_names_the_servers_way_in():
    message = lite_locked_message(Path("/srv/kb/state"), 4242)
    assert "held by process 4242" in message
    assert "kb-retrieval lookup --server URL" in message and "KB_SERVER_URL" in message


def test_a_query_from_stdin_is_stripped(tmp_path, monkeypatch):
    seen: list[str] = []

    def through_server(url: str, cases: list[lookup_command.QueryCase], args: argparse.Namespace) -> int:
        seen.extend(case.query for case in cases)
        return 0

    monkeypatch.setattr(lookup_command, "_lookup_through_server", through_server)
    monkeypatch.setattr("sys.stdin", io.StringIO("disk full on host-1\n\n"))
    assert main(["lookup", "-", "--server", "http://127.0.0.1:9", "--state-dir", str(tmp_path / "s")]) == 0
    assert seen == ["disk full on host-1"]


def test_log_warnings_read_like_the_clis_own():
    record = logging.LogRecord(
        "kb_retrieval.knowledge.loader", logging.WARNING, __file__, 1, "skipped %s", ("a",), None
    )
    assert _MaskingFormatter().format(record) == "warning: skipped a"
    assert _MaskingFormatter(verbose=True).format(record) == "WARNING kb_retrieval.knowledge.loader: skipped a"


def _helps(parser: argparse.ArgumentParser) -> list[str]:
    texts = [parser.format_help()]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                texts += _helps(sub)
    return texts


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_has_no_rst_backticks(command):
    helps = _helps(build_parser(command))
    assert len(helps) > 1
    assert [text.splitlines()[0] for text in helps if "``" in text] == []


def test_the_one_time_encoder_export_is_announced(tmp_path, monkeypatch, caplog):
    exported: list[Path] = []
    monkeypatch.setattr(onnx_query, "export_onnx", lambda model_dir, path, quantized: exported.append(path))
    monkeypatch.setattr(onnx_query, "_session", lambda path, threads: object())
    with caplog.at_level(logging.WARNING, logger=onnx_query.__name__):
        onnx_query._open_model(tmp_path / "cache", Path(onnx_query.bundled_model_path()), True, 1)
    assert len(exported) == 1
    assert caplog.messages == [
        f"exporting the query encoder to ONNX (int8) into {tmp_path / 'cache'}: once per model and cache folder; "
        "later lookups reuse it"
    ]


def test_a_partial_pack_names_the_budget_not_the_question():
    from kb_retrieval.models import ContextPackSummary, EvidenceBlock
    from kb_retrieval.result import completeness

    block = EvidenceBlock(source="a.md", retrieval_layer="L1", content="x", score=0.9, similarity=0.8)
    cut = ContextPackSummary(budget_tokens=1200, used_tokens=1200, omitted_sources=["b.md"])
    # The budget left out b.md, one of the evidence documents (a source the blocks do not hold is not evidence cut).
    hint = completeness([block, block.model_copy(update={"source": "b.md"})], cut)
    assert hint.startswith("partial: the context budget (1200 tokens), not the question, cut evidence")
    assert "KB_CONTEXT_BUDGET_TOKENS" in hint and "narrower question" not in hint
    whole = ContextPackSummary(budget_tokens=1200, used_tokens=10)
    assert completeness([block], whole).startswith("single_source:")  # a whole pack is not blamed on the budget
