"""The plumbing every benchmark shares (benchmarks/benchlib/launch.py, args.py,
machine.py): one command line of a distseg-train run for one process, a pinned one, a
step variant or N Horovod ranks; one environment; one ``--results-dir``; one revision.
No run starts: the commands are compared as lists."""

from __future__ import annotations

import argparse
import os
import sys

import pytest

from support import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))

from benchlib import args as bench_args  # noqa: E402
from benchlib import launch, machine  # noqa: E402

TRAIN = os.path.join(launch.BIN, "distseg-train")


def test_one_process_runs_the_console_script_with_the_flags_then_run_dir_then_threads():
    cmd = launch.train_command(["--preset", "demo", "--intra-op-threads", "4"], "/r", threads=1)
    assert cmd == [TRAIN, "--preset", "demo", "--intra-op-threads", "4", "--run-dir", "/r",
                   "--intra-op-threads", "1", "--inter-op-threads", "1"]
    # Without threads distseg-train's own (or a --config's) stand.
    assert launch.train_command(["--preset", "demo"], "/r") == [TRAIN, "--preset", "demo",
                                                                 "--run-dir", "/r"]


def test_a_pinned_process_runs_under_taskset_and_a_variant_under_train_variant():
    cmd = launch.train_command(["--epochs", "2"], "/r", core=1, variant=["--step", "nocheck"])
    assert cmd == ["taskset", "-c", "1", sys.executable, "-m", "benchlib.train_variant",
                   "--step", "nocheck", "--", "--epochs", "2", "--run-dir", "/r"]


def test_ranks_run_under_horovodrun_on_this_machine_with_its_options_first():
    cmd = launch.train_command(["--epochs", "2"], "/r", ranks=2, threads=1, horovodrun_options=["--gloo"])
    assert cmd == [os.path.join(launch.BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
                   TRAIN, "--epochs", "2", "--run-dir", "/r", "--intra-op-threads", "1",
                   "--inter-op-threads", "1"]
    assert launch.horovodrun(4) == [os.path.join(launch.BIN, "horovodrun"), "-np", "4", "-H", "localhost:4"]
    with pytest.raises(ValueError, match="cannot be pinned"):
        launch.train_command([], "/r", ranks=2, core=0)


def test_the_environment_finds_this_venv_and_benchlib_and_takes_extra_settings(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = launch.command_env(DISTSEG_PIN="0")
    assert env["PATH"] == f"{launch.BIN}:/usr/bin"
    assert env["PYTHONPATH"] == os.pathsep.join([os.path.join(REPO, "benchmarks"), "/elsewhere"])
    assert (env["TF_CPP_MIN_LOG_LEVEL"], env["DISTSEG_PIN"]) == ("2", "0")


def test_results_go_to_bench_results_of_the_checkout_unless_told(tmp_path):
    p = bench_args.add_results_dir(argparse.ArgumentParser())
    assert p.parse_args([]).results_dir == os.path.join(REPO, "bench", "results")
    assert p.parse_args(["--results-dir", str(tmp_path)]).results_dir == str(tmp_path)
    path = launch.write_result({"a": 1}, str(tmp_path / "new"), "x")
    assert os.path.basename(path).startswith("x-") and os.listdir(tmp_path / "new") == [os.path.basename(path)]


def test_the_revision_is_the_checkouts_commit_or_none_outside_one(tmp_path):
    full, short = machine.revision(REPO), machine.revision(REPO, short=True)
    if full is None:
        pytest.skip("no git checkout here")
    assert len(full) == 40 and full.startswith(short) and len(short) < 40
    assert machine.revision(str(tmp_path)) is None
