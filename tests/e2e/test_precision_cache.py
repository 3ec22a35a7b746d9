"""``--precision auto`` decided once per configuration, and no rank left waiting in its
trial, at 2 Horovod ranks through ``distseg-train``: the second launch of a config takes
the kept decision (both ranks, the same precision, "cached" in the run record), and one
rank failing inside the trial ends both ranks within seconds, with one message naming
the rank, a non-zero exit and nothing that looks like a run.

The CPU comes from a copy of /proc/cpuinfo with ``avx512_bf16`` (``DISTSEG_CPUINFO``), so
the trial runs on any machine; which precision it picks depends on the machine, so only
what holds anywhere is asserted. The cache is the test's own (``DISTSEG_CACHE_DIR``).
"""

from __future__ import annotations

import os
import time

import pytest

from distseg.core import rundir
from distseg.training.startup import precision, precision_cache

import proc_group
from proc_group import run_group
from support import background, command_env, finish, log_records, wait_for

TIMEOUT = 300
pytestmark = pytest.mark.timeout(4 * TIMEOUT)
SMALL = ["--preset", "demo", "--image-size", "32", "--base-filters", "4", "--depth", "2",
         "--max-steps-per-epoch", "2", "--epochs", "1", "--no-validate", "--no-tensorboard",
         "--intra-op-threads", "1", "--inter-op-threads", "1"]
WITH_BF16 = "processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
#: How soon after one rank fails in the trial every process must be gone.
FAILURE_REACHES_ALL_S = 30


def _env(tmp_path, **extra) -> dict:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(WITH_BF16)
    return command_env(**{precision.CPUINFO_ENV: str(cpuinfo),
                          precision_cache.DIR_ENV: str(tmp_path / "cache")}, **extra)


def _train_two(tiny, run_dir, env) -> str:
    cmd = proc_group.horovodrun_cmd("distseg-train", *SMALL, "--data", tiny, "--run-dir", run_dir)
    out = run_group(cmd, env=env, timeout=TIMEOUT, merge_stderr=True)
    assert out.returncode == 0, out.stdout[-4000:]
    return out.stdout


def _decided(run_dir) -> list[dict]:
    return [log_records(run_dir, r)[0]["precision"] for r in (0, 1)]


def test_the_second_launch_of_a_config_takes_the_kept_decision(tiny, tmp_path):
    env = _env(tmp_path)
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    _train_two(tiny, first, env)
    measured = _decided(first)
    assert [d["source"] for d in measured] == ["trial", "trial"] and measured[0]["trial_s"] > 0
    assert len(os.listdir(tmp_path / "cache")) == 1

    said = _train_two(tiny, second, env)
    kept = _decided(second)
    assert [d["source"] for d in kept] == ["cache", "cache"], kept
    agreed = [{k: v for k, v in d.items() if k != "decision_s"} for d in kept]  # each rank's clock
    assert agreed[0] == agreed[1] and kept[0]["trial_s"] == 0.0
    assert kept[0]["reason"].startswith(f"cached, from {kept[0]['cached']['from']}")
    assert kept[0]["choice"] == measured[0]["choice"] == measured[1]["choice"]
    assert kept[0]["seconds"] == measured[0]["seconds"]
    assert "cached, from" in said
    for run_dir in (first, second):
        assert log_records(run_dir, 0)[0]["model"]["precision"] == measured[0]["choice"]


@pytest.mark.parametrize("piece", ["build", "step"])
def test_one_rank_failing_in_the_trial_ends_every_rank_with_one_message(tiny, tmp_path, piece):
    run_dir = str(tmp_path / "run")
    output = tmp_path / "output.txt"
    env = _env(tmp_path, **{precision.FAIL_ENV: f"1:{piece}"})
    cmd = proc_group.horovodrun_cmd("distseg-train", *SMALL, "--data", tiny, "--run-dir", run_dir)
    with open(output, "w") as out, background(cmd, env=env, stdout=out) as proc:
        wait_for(lambda: f"rank 1 fails in the trial's {piece} piece" in output.read_text(),
                 2 * TIMEOUT, "rank 1's injected failure", proc=proc, poll=0.05)
        failed_at = time.monotonic()
        finish(proc, FAILURE_REACHES_ALL_S, f"every rank ended within {FAILURE_REACHES_ALL_S} s "
                                            "of rank 1's failure in the trial")
        took = time.monotonic() - failed_at
    assert proc.returncode != 0
    errors = {line.split("error: ", 1)[1] for line in output.read_text().splitlines()
              if "error: " in line}
    assert len(errors) == 1, (took, output.read_text()[-4000:])
    (message,) = errors
    assert "--precision auto's trial" in message and "[rank 1]" in message, message
    assert precision.FAIL_ENV in message
    assert rundir.existing_run(run_dir) is None
    assert not os.path.exists(rundir.checkpoint_dir(run_dir))
    assert not os.path.exists(tmp_path / "cache")  # no decision kept from a failed trial
