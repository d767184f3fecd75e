from __future__ import annotations

import argparse
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

    text = (tmp_path / "baseline.json").read_text(encoding="utf-8")
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
    assert (tmp_path / "baseline.json").is_file()  # the report is still written


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

    assert (args.ks, args.fail_under, args.name) == (None, None, "baseline")
    assert run_eval_command(args) == 0
