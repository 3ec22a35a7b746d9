"""benchmarks/bench_horovod.py: what each variant runs (the commands, compared as
lists: one process, two at once, 2 ranks with Horovod's defaults or distseg's over MPI
and Gloo, any of them unpinned), and the script itself on tiny data with its one-process
variant, whose samples/s and ratio it prints."""

from __future__ import annotations

import argparse
import math
import os
import sys

import pytest

from support import BENCHMARKS, run_benchmark

sys.path.insert(0, BENCHMARKS)

import bench_horovod  # noqa: E402

from benchlib import launch  # noqa: E402

SCRIPT = os.path.join(BENCHMARKS, "bench_horovod.py")
ARGS = argparse.Namespace(preset="smoke", data="d.h5", epochs=2, batch_size=4, precision="float32")


def test_each_variant_runs_its_processes_with_its_settings():
    plans = {name: bench_horovod.variant_plan(name, ARGS, "/r") for name in bench_horovod.VARIANTS}
    (one,), env, dirs, ranks = plans["1proc"]
    assert one == launch.train_command(
        ["--preset", "smoke", "--data", "d.h5", "--epochs", "2", "--batch-size", "4", "--no-validate",
         "--checkpoint-every", "0", "--precision", "float32"], "/r", threads=1)
    assert (env, dirs, ranks) == ({}, ["/r"], 1)
    indep, _, dirs, ranks = plans["indep"]
    assert (len(indep), dirs, ranks) == (2, ["/r-a", "/r-b"], 1)
    assert [c[c.index("--run-dir") + 1] for c in indep] == dirs
    for name in ("hvd-default", "mpi", "gloo"):
        (cmd,), env, _, ranks = plans[name]
        assert cmd[:5] == launch.horovodrun(2) and ranks == 2
    assert plans["mpi"][0][0][5] == "--mpi" and plans["gloo"][0][0][5] == "--gloo"
    assert plans["hvd-default"][1] == {"DISTSEG_HOROVOD_DEFAULTS": "0", "DISTSEG_PIN": "0"}
    assert bench_horovod.variant_plan("gloo+nopin", ARGS, "/r")[1] == {"DISTSEG_PIN": "0"}
    with pytest.raises(ValueError, match="'fast' is not one of"):
        bench_horovod.variant_plan("fast", ARGS, "/r")


def test_the_script_times_one_process_on_tiny_data(tiny):
    out = run_benchmark(SCRIPT, "--data", tiny, "--preset", "smoke", "--epochs", "2",
                        "--batch-size", "4", "--variants", "1proc")
    name, samples_per_s, ratio = out.stdout.strip().splitlines()[-1].split()
    assert name == "1proc" and math.isfinite(float(samples_per_s)) and float(samples_per_s) > 0
    assert float(ratio) == 1.0


def test_an_unknown_variant_is_refused_before_any_run():
    out = run_benchmark(SCRIPT, "--variants", "1proc,fast", timeout=60, check=False)
    assert out.returncode == 2 and "--variants: 'fast' is not one of" in out.stderr
