"""``--lr-schedule`` through ``distseg-train``: counted in samples, so 1 rank x 8 and 2
ranks x 4 of a fixed global batch train with the same lr at every step (and the same
losses, to the allreduce's rounding); a resume that extends ``--epochs`` stretches the
horizon and says so, and here, where the first launch ended inside the warm-up, it
repeats the uninterrupted longer run bit for bit."""

from __future__ import annotations

import math

import pytest

import proc_group
from proc_group import run_group
from support import BIN, command_env, log_records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(5 * TIMEOUT)
THREADS = ["--intra-op-threads", "1", "--inter-op-threads", "1"]
#: 3 epochs of 4 steps of 8 samples; the first epoch is the warm-up.
RUN = ["--preset", "smoke", *THREADS, "--global-batch", "8", "--norm", "group", "--no-validate",
       "--max-steps-per-epoch", "4", "--warmup-epochs", "1", "--lr", "2e-3"]


def _train(*args, ranks: int = 1) -> None:
    cmd = ([f"{BIN}/distseg-train", *args] if ranks == 1
           else proc_group.horovodrun_cmd("distseg-train", *args, ranks=ranks))
    out = run_group(cmd, env=command_env(), timeout=TIMEOUT)
    assert out.returncode == 0, (out.stdout or "")[-3000:] + (out.stderr or "")[-3000:]


def _steps(run_dir: str, rank: int = 0) -> dict:
    return {r["global_step"]: (r["loss"], r["lr"]) for r in log_records(run_dir, rank)
            if r["type"] == "step"}


def test_cosine_gives_1x8_and_2x4_the_same_lr_at_every_step(tiny, tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    args = [*RUN, "--lr-schedule", "cosine", "--data", tiny, "--epochs", "3"]
    _train(*args, "--run-dir", one)
    _train(*args, "--run-dir", two, ranks=2)
    a, b = _steps(one), _steps(two)
    assert sorted(a) == sorted(b) == list(range(12))
    lrs = [lr for _, lr in a.values()]
    assert lrs == [lr for _, lr in b.values()]
    # Warm-up over the first 4 steps (samples 0-31), then the cosine over samples 32-96.
    for k, lr in enumerate(lrs[4:], start=4):
        assert lr == pytest.approx(2e-3 * 0.5 * (1 + math.cos(math.pi * (8 * k - 32) / 64)))
    for (la, _), (lb, _) in zip(a.values(), b.values()):
        assert abs(la - lb) <= 1e-4 * max(abs(la), abs(lb))
    assert log_records(one, 0)[0]["lr_schedule"] == "cosine"


def test_a_resume_with_more_epochs_stretches_the_horizon_and_says_so(tiny, tmp_path):
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    args = [*RUN, "--lr-schedule", "poly", "--data", tiny]
    _train(*args, "--run-dir", full, "--epochs", "3")
    _train(*args, "--run-dir", cut, "--epochs", "1")  # ends with the warm-up: factor 1
    _train("--run-dir", cut, "--resume", "--epochs", "3")
    assert _steps(cut) == _steps(full)
    resumed = [r for r in log_records(cut, 0) if r["type"] == "resume"]
    assert len(resumed) == 1
    assert any("--epochs 1 -> 3 moves the end of the poly lr schedule from 32 to 96 samples"
               in w for w in resumed[0]["warnings"]), resumed[0]["warnings"]
