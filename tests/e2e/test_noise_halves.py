"""One rank's noise scale from the two halves of its batch (``steps.can_halve``): a
1-rank run of a fixed global batch of 8 logs, step by step, the gradient norms that 2
ranks of 4 log for the same training (to the allreduce's rounding), so both read the
same noise scale; where BatchNorm normalises the whole batch, one rank keeps
consecutive gradients. The cadence (``--noise-every``): fixed, and ``auto`` decided
once for every rank."""

from __future__ import annotations

import numpy as np
import pytest

from distseg.training.progress import noise

import proc_group
from proc_group import run_group
from support import BIN, command_env, log_records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(4 * TIMEOUT)
RUN = ["--preset", "smoke", "--intra-op-threads", "1", "--inter-op-threads", "1",
       "--global-batch", "8", "--no-validate", "--max-steps-per-epoch", "4", "--epochs", "2",
       "--noise-every", "1"]


def _train(*args, ranks: int = 1) -> str:
    cmd = ([f"{BIN}/distseg-train", *args] if ranks == 1
           else proc_group.horovodrun_cmd("distseg-train", *args, ranks=ranks))
    out = run_group(cmd, env=command_env(), timeout=TIMEOUT)
    assert out.returncode == 0, (out.stdout or "")[-3000:] + (out.stderr or "")[-3000:]
    return out.stdout or ""


def _grad_sq(run_dir: str) -> np.ndarray:
    return np.array([r["grad_sq"] for r in log_records(run_dir, 0) if r["type"] == "step"],
                    dtype=float)


def _noise(run_dir: str, rank: int = 0) -> list[dict]:
    return [r["noise_scale"] for r in log_records(run_dir, rank) if r["type"] == "epoch"]


def _measured_steps(run_dir: str, rank: int = 0) -> list[int]:
    """The global steps whose record holds the noise scale's norms."""
    return [r["global_step"] for r in log_records(run_dir, rank)
            if r["type"] == "step" and "grad_sq" in r]


@pytest.mark.parametrize("norm", [["--norm", "group"], ["--norm", "batch", "--bn-ghost-batch", "2"]],
                         ids=["groupnorm", "batchnorm-ghost2"])
def test_one_rank_logs_the_norms_two_ranks_log(tiny, tmp_path, norm):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    _train(*RUN, *norm, "--data", tiny, "--run-dir", one)
    _train(*RUN, *norm, "--data", tiny, "--run-dir", two, ranks=2)
    a, b = _grad_sq(one), _grad_sq(two)
    assert a.shape == b.shape == (8, 4)
    np.testing.assert_allclose(a, b, rtol=1e-3)  # from the very first step
    first, second = _noise(one), _noise(two)
    assert [n["method"] for n in first] == ["halves"] * 2
    assert [n["method"] for n in second] == ["ranks"] * 2
    assert first[-1]["small_batch"] == second[-1]["small_batch"] == 4
    assert first[-1]["b_simple"] == pytest.approx(second[-1]["b_simple"], rel=1e-3)


def test_batchnorm_over_the_whole_batch_keeps_consecutive_gradients(tiny, tmp_path):
    run = str(tmp_path / "run")
    _train(*RUN, "--norm", "batch", "--bn-ghost-batch", "0", "--data", tiny, "--run-dir", run)
    assert np.isnan(_grad_sq(run)[0]).all()  # a launch's first step: no last gradient
    assert {n["method"] for n in _noise(run)} == {"consecutive"}


def test_a_fixed_cadence_measures_every_kth_step(tiny, tmp_path):
    run = str(tmp_path / "run")
    _train(*RUN, "--norm", "batch", "--bn-ghost-batch", "2", "--data", tiny, "--run-dir", run,
           "--noise-every", "3")
    assert _measured_steps(run) == [0, 3, 6]
    assert [n["cadence"] for n in _noise(run)] == [{"every": 3, "auto": False, "steers": False,
                                                     "decision": None}] * 2
    assert all(n["b_simple"] is not None for n in _noise(run))


def test_auto_decides_one_cadence_for_every_rank(tiny, tmp_path):
    # 4 steps an epoch, every 4th measuring until decided: the launch's first step
    # traces (untimed), so the second measuring step timed is step 8, and the third
    # epoch's end decides.
    run = str(tmp_path / "run")
    assert RUN[-2:] == ["--noise-every", "1"]
    args = RUN[:-2]  # the default: auto
    out = _train(*args, "--epochs", "4", "--data", tiny, "--run-dir", run, ranks=2)
    cadences = [[n["cadence"] for n in _noise(run, rank)] for rank in range(2)]
    assert cadences[0] == cadences[1]
    first = noise.FIRST_EVERY
    assert [c["every"] for c in cadences[0][:2]] == [first] * 2
    decision = cadences[0][2]["decision"]  # the epoch whose end decided shows it
    assert decision is not None and decision["global_step"] == 12
    assert cadences[0][2]["every"] == cadences[0][3]["every"] == decision["every"] >= 1
    assert decision["share"] <= noise.COST_SHARE or decision["every"] == noise.MOST_EVERY
    want = [s for s in range(12) if s % first == 0]
    want += [s for s in range(12, 16) if s % decision["every"] == 0]
    assert _measured_steps(run, 0) == _measured_steps(run, 1) == want
    assert f"measured every {decision['every']} step(s) from step 12" in out
