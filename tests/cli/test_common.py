"""What only the CLI's own process does: it is known by ``main`` run without arguments, and its start-up runs
without the cyclic garbage collector, whose survivors are frozen after; a caller of ``main`` keeps its own."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

from kb_retrieval.cli import common
from kb_retrieval.cli.common import own_process, start_up_gc
from tests.support.kb import offline_env

OWN_PROCESS_SCRIPT = textwrap.dedent(
    """
    import sys
    from kb_retrieval.cli import common, run

    run._run = lambda argv: print(argv, common.own_process()) or 0
    run.main(["stats"])  # a program calling main: not the CLI's process
    sys.argv = ["kb-retrieval", "stats"]
    run.main()  # the console script's call
    """
)


def test_main_without_arguments_is_the_clis_own_process() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", OWN_PROCESS_SCRIPT], capture_output=True, text=True, timeout=300, env=offline_env()
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["['stats'] False", "['stats'] True"]


def test_start_up_gc_outside_the_clis_process_changes_nothing() -> None:
    assert not own_process()  # pytest called no main() without arguments
    frozen = gc.get_freeze_count()
    with start_up_gc():
        assert gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_start_up_gc_in_the_clis_process_collects_nothing_then_freezes(monkeypatch) -> None:
    monkeypatch.setattr(common, "_own_process", True)
    frozen = gc.get_freeze_count()
    try:
        with start_up_gc():
            assert not gc.isenabled()
            made = [[] for _ in range(1000)]  # survivors of the start-up
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen + len(made)
    finally:
        gc.unfreeze()  # this test process's objects back in the collector's care
        gc.enable()


SERVE_ENVIRONMENT_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from kb_retrieval.cli import run, serve

    def stop(*args, **kwargs):  # serve's first step after the environment: what numpy would read
        print(os.environ.get("OPENBLAS_NUM_THREADS"), "numpy" in sys.modules)
        raise SystemExit(0)

    serve.require_extra = stop
    sys.argv = ["kb-retrieval", "serve"]
    run.main()
    """
)


def test_lookup_environment_in_the_clis_process_keeps_the_users_values(monkeypatch) -> None:
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    common.set_lookup_environment()  # not the CLI's process: nothing set
    assert "OPENBLAS_NUM_THREADS" not in common.os.environ
    monkeypatch.setattr(common, "_own_process", True)
    common.set_lookup_environment()
    assert common.os.environ["OPENBLAS_NUM_THREADS"] == "1"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    common.set_lookup_environment()
    assert common.os.environ["OPENBLAS_NUM_THREADS"] == "4"


def test_serve_sets_one_blas_thread_before_numpy_is_imported() -> None:
    env = {k: v for k, v in offline_env().items() if k != "OPENBLAS_NUM_THREADS"}
    proc = subprocess.run(
        [sys.executable, "-c", SERVE_ENVIRONMENT_SCRIPT], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["1", "False"]
