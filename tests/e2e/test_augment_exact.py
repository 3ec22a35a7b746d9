"""``data.augment default`` through ``distseg-train``: the draws are keyed by (seed,
epoch, sample id), so a fixed global batch of 8 trains the same model as 1 rank x 8
and as 2 ranks x 4 (step losses, epoch losses and weight checksums within 1e-4), a
run stopped mid-epoch and resumed repeats the uninterrupted run's steps bit for bit,
and the augmentation does change training (against ``none``). GroupNorm, so the
2-rank split is exact up to the allreduce's rounding.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from distseg.core import rundir

import proc_group
from proc_group import run_group
from support import BIN, background, command_env, log_records, wait_for, wait_for_log

TIMEOUT = 300
pytestmark = pytest.mark.timeout(6 * TIMEOUT)
THREADS = ["--intra-op-threads", "1", "--inter-op-threads", "1"]
#: 128 training slices of the ``tiny`` phantom: 16 steps of a global batch of 8 an epoch.
RUN = ["--preset", "smoke", *THREADS, "--global-batch", "8", "--norm", "group", "--no-validate"]
#: 1 x 8 against 2 x 4: 3 epochs of 4 steps. Past ~15 steps the rounding of the
#: 2-rank allreduce grows past 1e-4 in the tiny model, augmented or not.
EXACT, EPOCHS, STEPS, REL = [*RUN, "--max-steps-per-epoch", "4"], 3, 4, 1e-4


def _config(tmp_path, kind: str) -> str:
    path = tmp_path / f"augment-{kind}.json"
    path.write_text(json.dumps({"data": {"augment": kind}}))
    return str(path)


def _train(*args, ranks: int) -> None:
    cmd = ([f"{BIN}/distseg-train", *args] if ranks == 1
           else proc_group.horovodrun_cmd("distseg-train", *args, ranks=ranks))
    out = run_group(cmd, env=command_env(), timeout=TIMEOUT)
    assert out.returncode == 0, (out.stdout or "")[-3000:] + (out.stderr or "")[-3000:]


def _run(tmp_path_factory, tiny, kind: str, ranks: int, args=tuple(EXACT)) -> str:
    base = tmp_path_factory.mktemp(f"{kind}-np{ranks}")
    run_dir = str(base / "run")
    _train(*args, "--data", tiny, "--config", _config(base, kind), "--run-dir", run_dir,
           "--epochs", str(EPOCHS), ranks=ranks)
    return run_dir


@pytest.fixture(scope="module")
def one_rank(tiny, tmp_path_factory):
    return _run(tmp_path_factory, tiny, "default", 1)


@pytest.fixture(scope="module")
def two_ranks(tiny, tmp_path_factory):
    return _run(tmp_path_factory, tiny, "default", 2)


def _steps(run_dir: str, rank: int = 0, running: bool = False) -> dict:
    return {r["global_step"]: r["loss"] for r in log_records(run_dir, rank, running)
            if r["type"] == "step"}


def _epochs(run_dir: str, rank: int = 0, running: bool = False) -> list:
    return [(r["epoch"], r["sample_digest"], r["samples"], r["train_loss"], r["weight_checksum"])
            for r in log_records(run_dir, rank, running) if r["type"] == "epoch"]


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b))


def test_the_runs_say_they_augmented(one_rank, two_ranks):
    for run_dir in (one_rank, two_ranks):
        with open(rundir.config_path(run_dir)) as f:
            assert json.load(f)["data"]["augment"] == "default"


def test_one_rank_by_8_and_two_ranks_by_4_train_the_same_model(one_rank, two_ranks):
    one = _steps(one_rank)
    assert len(one) == EPOCHS * STEPS
    for rank in (0, 1):
        two = _steps(two_ranks, rank)
        assert sorted(two) == sorted(one)
        assert all(_close(one[s], two[s]) for s in one), [(s, one[s], two[s]) for s in one
                                                           if not _close(one[s], two[s])]
    whole = _epochs(one_rank)
    for rank in (0, 1):
        for (e1, _, _, loss1, sums1), (e2, _, _, loss2, sums2) in zip(whole, _epochs(two_ranks, rank)):
            assert e1 == e2 and _close(loss1, loss2), (e1, loss1, loss2)
            assert all(_close(a, b) for a, b in zip(sums1, sums2)), (e1, sums1, sums2)


def test_augmentation_changes_training(one_rank, tiny, tmp_path_factory):
    plain = _run(tmp_path_factory, tiny, "none", 1)
    augmented, unaugmented = _epochs(one_rank), _epochs(plain)
    # The same samples in the same batches (the digests), other images in them.
    assert [e[1] for e in augmented] == [e[1] for e in unaugmented]
    first = min(_steps(plain))
    assert not _close(_steps(one_rank)[first], _steps(plain)[first])
    assert all(not _close(a[3], b[3]) for a, b in zip(augmented, unaugmented))


def test_a_run_stopped_mid_epoch_and_resumed_repeats_the_uninterrupted_steps(
        tiny, tmp_path, tmp_path_factory):
    full = _run(tmp_path_factory, tiny, "default", 2, args=RUN)  # whole epochs of 16 steps
    cut = str(tmp_path / "cut")
    cmd = proc_group.horovodrun_cmd("distseg-train", *RUN, "--data", tiny,
                                    "--config", _config(tmp_path, "default"),
                                    "--run-dir", cut, "--epochs", "1000")
    with background(cmd, env=command_env()) as proc:
        # Polled often: a smoke step takes tens of milliseconds; epoch 1 is steps 16-31.
        wait_for_log(cut, 1, '"global_step":20,', proc, TIMEOUT, poll=0.01)
        pids = [log_records(cut, r, running=True)[0]["pid"] for r in (0, 1)]
        for pid in pids:  # Slurm at the time limit: every rank gets SIGTERM
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: proc.poll() is not None, 60, "the stopped run's launcher ended")
    with open(rundir.latest_path(cut)) as f:
        kept = json.load(f)
    assert kept["epoch"] in (1, 2) and kept["step"] > 0, kept  # mid-epoch is the point
    _train("--run-dir", cut, "--resume", "--epochs", str(EPOCHS), ranks=2)
    for rank in (0, 1):
        assert _steps(cut, rank) == _steps(full, rank)
        assert _epochs(cut, rank) == _epochs(full, rank)
        kinds = [r["type"] for r in log_records(cut, rank)]
        assert kinds.count("resume") == 1 and kinds.count("end") == 2
