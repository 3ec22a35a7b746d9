"""The ``gain`` lr rule on 2 real Horovod ranks (per-rank batches, so the global batch is
twice the one the lr was set for): the lr follows the measured gain, every rank uses the
same one, and a run stopped at an epoch's end and resumed continues it exactly (the
checkpoint carries the noise scale's averages and the gain-weighted progress).
"""

from __future__ import annotations

import pytest

import proc_group
from support import log_records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(2 * TIMEOUT + 60)
LR = 5e-3
THREADS = ["--intra-op-threads", "1", "--inter-op-threads", "1"]
RUN = ["--preset", "smoke", "--lr-scaling", "gain", "--lr", str(LR), "--warmup-epochs", "1",
       "--no-validate"]


def _train(*args):
    out = proc_group.horovodrun("distseg-train", *THREADS, *args, timeout=TIMEOUT)
    assert out.returncode == 0, out.stdout[-3000:]


def _steps(run_dir: str, rank: int) -> dict:
    return {r["global_step"]: (r["loss"], r["lr"]) for r in log_records(run_dir, rank)
            if r["type"] == "step"}


def _rules(run_dir: str, rank: int) -> list[dict]:
    """The epochs' lr rules, without the schedule's horizon: the cut run planned 1
    epoch at first (with the constant schedule it moves no lr)."""
    return [{k: v for k, v in r["lr_rule"].items() if k != "horizon"}
            for r in log_records(run_dir, rank) if r["type"] == "epoch"]


def test_the_gain_rule_is_the_same_on_every_rank_and_resumes_exactly(tiny, tmp_path):
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    _train(*RUN, "--data", tiny, "--run-dir", full, "--epochs", "2")
    _train(*RUN, "--data", tiny, "--run-dir", cut, "--epochs", "1")
    _train("--run-dir", cut, "--resume", "--epochs", "2")
    want = _steps(full, 0)
    lrs = [lr for _, lr in want.values()]
    # Warm-up from LR, then LR x sqrt(gain) with the gain of 2 ranks' batch in [1, 2].
    assert lrs[0] == LR and all(LR <= lr <= LR * 2 ** 0.5 * (1 + 1e-9) for lr in lrs)
    assert len(set(lrs)) > 2  # it moves with the measured gain, step by step
    rules = _rules(full, 0)
    assert [r["rule"] for r in rules] == ["gain", "gain"]
    assert all(1.0 <= r["gain"] <= 2.0 for r in rules)
    assert rules[-1]["lr"] == lrs[-1] and rules[-1]["progress"] > rules[0]["progress"]
    for rank in (0, 1):
        assert _steps(full, rank) == want  # the same lr and global loss on every rank
        assert _steps(cut, rank) == want  # resumed: bit for bit
        assert _rules(cut, rank) == rules
