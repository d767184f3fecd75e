from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from kb_retrieval.evaluation import add_eval_arguments, main, run_eval_command

pytestmark = pytest.mark.unit


def run_cli(golden: Path, fixtures: Path, out: Path, *extra: str) -> int:
    return main(["--golden", str(golden), "--fixtures", str(fixtures), "--out", str(out), *extra])


def test_writes_reports_and_prints_summary(
    golden_path: Path, fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(golden_path, fixtures_dir, tmp_path, "--name", "nightly") == 0

    out, err = capsys.readouterr()
    assert (tmp_path / "nightly.json").is_file() and (tmp_path / "nightly.md").is_file()
    assert out.splitlines()[0].split() == ["metric", "overall", "aiops", "chat"]
    assert "recall@10" in out and "ndcg@10" in out
    assert "2 case(s) not run" in err


def test_k_values_are_configurable(golden_path: Path, fixtures_dir: Path, tmp_path: Path) -> None:
    assert (
        run_cli(golden_path, fixtures_dir, tmp_path, "--k", "2", "--k", "1", "7", "--fail-under", "recall@7=0.6") == 0
    )

    text = (tmp_path / "golden.json").read_text(encoding="utf-8")
    assert '"ks": [\n    1,\n    2,\n    7\n  ]' in text
    assert '"recall@10"' not in text


@pytest.mark.parametrize(
    "thresholds",
    [["recall@5=0.6"], ["mrr@10=0.36", "ndcg@10=0.3"], ["strong_rate=0.4", "--fail-under", "recall@1=0"]],
)
def test_fail_under_met_exits_zero(
    golden_path: Path, fixtures_dir: Path, tmp_path: Path, thresholds: list[str]
) -> None:
    assert run_cli(golden_path, fixtures_dir, tmp_path, "--fail-under", *thresholds) == 0


def test_fail_under_not_met_exits_one_and_names_the_metric(
    golden_path: Path, fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_cli(golden_path, fixtures_dir, tmp_path, "--fail-under", "recall@5=0.8", "mrr@10=0.1")

    out = capsys.readouterr().out
    assert code == 1
    assert "FAILED --fail-under: recall@5 = 0.6000 is below 0.8" in out
    assert "mrr@10" not in out.split("FAILED")[-1]
    assert (tmp_path / "golden.json").is_file()  # the report is still written


@pytest.mark.parametrize("threshold", ["precision@5=0.5", "recall@7=0.5", "avg_first_hit_rank=2"])
def test_unknown_metric_exits_two(
    golden_path: Path, fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], threshold: str
) -> None:
    code = run_cli(golden_path, fixtures_dir, tmp_path / "out", "--fail-under", threshold)

    err = capsys.readouterr().err
    assert code == 2
    assert f"unknown metric '{threshold.split('=')[0]}'" in err
    assert "recall@5" in err  # lists the known names
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "arguments", [["--fail-under", "recall@5"], ["--fail-under", "recall@5=high"], ["--k", "0"], ["--name", "a/b"]]
)
def test_malformed_arguments_exit_two(
    golden_path: Path, fixtures_dir: Path, tmp_path: Path, arguments: list[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_cli(golden_path, fixtures_dir, tmp_path, *arguments)

    assert exit_info.value.code == 2


def test_bad_inputs_exit_two_with_a_clear_message(
    golden_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"case_id": "a", "scenario": "chat", "query": ""}\n', encoding="utf-8")

    assert run_cli(bad, tmp_path, tmp_path / "out") == 2
    assert "bad.jsonl:1: field 'query': must not be blank" in capsys.readouterr().err

    assert run_cli(golden_path, tmp_path / "absent", tmp_path / "out") == 2
    assert "fixtures directory not found" in capsys.readouterr().err

    assert run_cli(tmp_path / "absent.jsonl", tmp_path, tmp_path / "out") == 2
    assert "absent.jsonl" in capsys.readouterr().err


def test_arguments_plug_into_a_subcommand(golden_path: Path, fixtures_dir: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="kb-retrieval")
    commands = parser.add_subparsers(dest="command", required=True)
    add_eval_arguments(commands.add_parser("eval"))

    args = parser.parse_args(
        ["eval", "--golden", str(golden_path), "--fixtures", str(fixtures_dir), "--out", str(tmp_path)]
    )

    assert (args.ks, args.fail_under, args.name) == (None, None, None)
    assert run_eval_command(args) == 0


# --- issue 23 item 6: inputs that used to give tracebacks ----------------------------------------------------------


def _cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``kb-retrieval eval`` as the console does; the one stderr line of a user error (exit 2, no traceback)."""
    from kb_retrieval.cli import main as cli_main

    code = cli_main(["eval", *argv])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _copied(fixtures_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "fixtures"
    shutil.copytree(fixtures_dir, target)
    return target


def test_golden_file_that_is_not_utf8_is_one_line_naming_file_and_line(
    golden_path: Path, fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    utf16 = tmp_path / "golden-utf16.jsonl"
    utf16.write_bytes(golden_path.read_text(encoding="utf-8").encode("utf-16"))  # starts \xff\xfe
    line = _cli_error(["--golden", str(utf16), "--fixtures", str(fixtures_dir), "--out", str(tmp_path / "o")], capsys)
    assert line.startswith(f"error: {utf16}:1: not UTF-8 text (byte 0xff at offset 0;") and "UTF-16?" in line
    later = tmp_path / "golden-latin1.jsonl"
    later.write_bytes(golden_path.read_bytes() + '{"case_id": "é"}\n'.encode("latin-1"))
    line = _cli_error(["--golden", str(later), "--fixtures", str(fixtures_dir), "--out", str(tmp_path / "o")], capsys)
    lines = golden_path.read_bytes().count(b"\n")
    assert line.startswith(f"error: {later}:{lines + 1}: not UTF-8 text (byte 0xe9")


def test_fixture_that_is_not_utf8_or_nests_deeply_is_one_line_naming_file_and_line(
    golden_path: Path, fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fixtures = _copied(fixtures_dir, tmp_path)
    victim = sorted(fixtures.glob("*.json"))[0]
    original = victim.read_text(encoding="utf-8")
    argv = ["--golden", str(golden_path), "--fixtures", str(fixtures), "--out", str(tmp_path / "o")]

    victim.write_bytes(original.encode("utf-16"))
    assert _cli_error(argv, capsys).startswith(f"error: {victim}:1: not UTF-8 text (byte 0xff at offset 0;")

    victim.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")  # json.loads: RecursionError
    line = _cli_error(argv, capsys)
    assert line == f"error: {victim}: invalid JSON: nested deeper than 200 levels (line 1, column 201)"

    victim.write_text('{\n  "case_id": "x",\n  "result": ' + "[" * 5000 + "]" * 5000 + "\n}\n", encoding="utf-8")
    assert _cli_error(argv, capsys).endswith("nested deeper than 200 levels (line 3, column 212)")


def test_golden_line_nesting_deeply_is_one_line(
    fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = tmp_path / "deep.jsonl"
    golden.write_text('{"case_id": "a", "scenario": "chat", "query": "q"}\n' + "[" * 100_000 + "\n", encoding="utf-8")
    line = _cli_error(["--golden", str(golden), "--fixtures", str(fixtures_dir), "--out", str(tmp_path / "o")], capsys)
    assert line == f"error: {golden}:2: invalid JSON: nested deeper than 200 levels (column 201)"


@pytest.mark.parametrize("content", ["", "\n\n  \n", "\ufeff"])
def test_empty_golden_file_is_an_error(
    content: str, fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = tmp_path / "empty.jsonl"
    golden.write_text(content, encoding="utf-8")
    line = _cli_error(["--golden", str(golden), "--fixtures", str(fixtures_dir), "--out", str(tmp_path / "o")], capsys)
    assert line == f"error: {golden}: no golden case in it (the file is empty)"
    assert not (tmp_path / "o").exists()  # no report of zero cases
