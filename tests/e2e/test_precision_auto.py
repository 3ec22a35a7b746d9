"""``--precision auto`` as a user meets it: a CPU without bfloat16 trains in float32
without a trial; one with it times both precisions, trains in the faster, and the trial
leaves no trace (the same steps as a run told the chosen precision); a resumed run
keeps the choice; 2 ranks take one decision.

The CPU's flags come from a copy of /proc/cpuinfo (``DISTSEG_CPUINFO``), so each
branch runs on any machine. A small U-Net (``demo`` preset shrunk to 32x32) keeps
each launch to seconds.
"""

from __future__ import annotations

import json
import os

import pytest

from distseg.core import rundir
from distseg.training.startup import precision, precision_cache

import proc_group
from proc_group import run_group
from support import BIN, command_env, log_records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(4 * TIMEOUT)
SMALL = ["--preset", "demo", "--image-size", "32", "--base-filters", "4", "--depth", "2",
         "--max-steps-per-epoch", "3", "--intra-op-threads", "1", "--inter-op-threads", "1"]
WITH_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
WITHOUT = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512pf avx512er\n"


def _cpuinfo(tmp_path, text: str) -> str:
    path = tmp_path / f"cpuinfo-{abs(hash(text))}"
    path.write_text(text)
    return str(path)


def _train(*args, cpuinfo: str, ranks: int = 1):
    # The test's own cache (beside the CPU's description): every launch here runs its trial.
    env = command_env(**{precision.CPUINFO_ENV: cpuinfo,
                         precision_cache.DIR_ENV: os.path.join(os.path.dirname(cpuinfo), "cache"),
                         precision_cache.TRIAL_ENV: "always"})
    args = args if "--resume" in args else (*SMALL, *args)
    if ranks == 1:
        out = run_group([f"{BIN}/distseg-train", *args], env=env, timeout=TIMEOUT)
    else:
        out = run_group(proc_group.horovodrun_cmd("distseg-train", *args, ranks=ranks),
                        env=env, timeout=TIMEOUT)
    assert out.returncode == 0, (out.stdout or "")[-3000:] + (out.stderr or "")[-3000:]


def _config_precision(run_dir: str) -> str:
    with open(rundir.config_path(run_dir)) as f:
        return json.load(f)["model"]["precision"]


def _steps(run_dir: str, rank: int = 0) -> list:
    # grad_sq: only on the steps that measure the noise scale (``--noise-every``).
    return [(r["loss"], r.get("grad_sq")) for r in log_records(run_dir, rank) if r["type"] == "step"]


def _checksums(run_dir: str, rank: int = 0) -> list:
    return [r["weight_checksum"] for r in log_records(run_dir, rank) if r["type"] == "epoch"]


def test_a_cpu_without_bfloat16_trains_in_float32_without_a_trial(tiny, tmp_path):
    run_dir = str(tmp_path / "knl")
    _train("--data", tiny, "--run-dir", run_dir, "--epochs", "1",
           cpuinfo=_cpuinfo(tmp_path, WITHOUT))
    chosen = log_records(run_dir, 0)[0]["precision"]
    assert (chosen["choice"], chosen["seconds"], chosen["trial_s"]) == ("float32", None, 0.0)
    assert "no bfloat16 flag" in chosen["reason"]
    assert _config_precision(run_dir) == "float32"


def test_the_trial_picks_one_leaves_no_trace_and_a_resumed_run_keeps_it(tiny, tmp_path):
    auto = str(tmp_path / "auto")
    _train("--data", tiny, "--run-dir", auto, "--epochs", "2", cpuinfo=_cpuinfo(tmp_path, WITH_BF16))
    run = log_records(auto, 0)[0]
    chosen = run["precision"]
    assert set(chosen["seconds"]) == {"float32", "bfloat16"} and chosen["trial_s"] > 0
    assert chosen["choice"] == precision.choose(chosen["seconds"])
    assert _config_precision(auto) == chosen["choice"] == run["model"]["precision"]
    # The same run told the chosen precision: the same steps, bit for bit.
    told = str(tmp_path / "told")
    _train("--data", tiny, "--run-dir", told, "--epochs", "2", "--precision", chosen["choice"],
           cpuinfo=_cpuinfo(tmp_path, WITHOUT))
    assert _steps(auto) == _steps(told) and _checksums(auto) == _checksums(told)
    # Resumed (one epoch more): the config's precision, no trial, whatever the CPU.
    _train("--run-dir", auto, "--resume", "--epochs", "3", cpuinfo=_cpuinfo(tmp_path, WITHOUT))
    runs = [r for r in log_records(auto, 0) if r["type"] == "run"]
    assert [r["precision"]["choice"] for r in runs] == [chosen["choice"]] * 2
    assert runs[1]["precision"]["requested"] == chosen["choice"]
    assert _config_precision(auto) == chosen["choice"]


def test_two_ranks_take_one_decision(tiny, tmp_path):
    run_dir = str(tmp_path / "two")
    _train("--data", tiny, "--run-dir", run_dir, "--epochs", "1", ranks=2,
           cpuinfo=_cpuinfo(tmp_path, WITH_BF16))
    decided = [log_records(run_dir, r)[0]["precision"] for r in (0, 1)]
    assert decided[0]["seconds"] == decided[1]["seconds"]
    assert decided[0]["choice"] == decided[1]["choice"] == _config_precision(run_dir)
    assert _checksums(run_dir, 0) == _checksums(run_dir, 1)
    assert not os.path.exists(os.path.join(run_dir, "logs", "rank-00002.jsonl"))
