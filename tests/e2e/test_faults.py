"""Jobs die: signals, killed and hung ranks, resume. Each test launches real Horovod
ranks under a hard deadline, injects the fault, and checks that every process is gone
in time, what each rank's log says, and that nothing finished is lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest

from distseg.core import rundir

import proc_group
from support import background, command_env, log_records, wait_for, wait_for_log

TIMEOUT = 300
pytestmark = pytest.mark.timeout(TIMEOUT + 60)
THREADS = ["--intra-op-threads", "1", "--inter-op-threads", "1"]
SMOKE = ["--preset", "smoke", *THREADS]


def horovodrun(*args, controller="mpi"):
    return proc_group.horovodrun("distseg-train", *THREADS, *args, controller=controller,
                                 timeout=TIMEOUT, launcher="horovodrun")


def records(run_dir: str, rank: int) -> list[dict]:
    """Rank ``rank``'s whole records (the run may still be writing)."""
    return log_records(run_dir, rank, running=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@contextlib.contextmanager
def launch(run_dir, data_path, controller, *extra):
    """A 2-rank run in the background (``support.background``: its whole process group
    is killed when the block ends, a test that failed included)."""
    cmd = proc_group.horovodrun_cmd("distseg-train", *SMOKE, "--data", data_path,
                                    "--run-dir", run_dir, "--epochs", "1000", "--no-validate",
                                    *extra, controller=controller, launcher="horovodrun")
    with background(cmd, env=command_env()) as proc:
        yield Launch(run_dir, proc)


class Launch:
    """A 2-rank run in the background, with the ranks' pids once they log."""

    def __init__(self, run_dir, proc):
        self.run_dir = run_dir
        self.proc = proc

    def wait_for_step(self, global_step: int, timeout: float = 120) -> list[int]:
        # Polled often: a smoke step takes tens of milliseconds, and a test that signals
        # "in the middle of an epoch" must not find the ranks an epoch further on.
        wait_for_log(self.run_dir, 1, f'"global_step":{global_step},', self.proc, timeout, poll=0.01)
        return [records(self.run_dir, r)[0]["pid"] for r in (0, 1)]

    def wait_gone(self, pids: list[int], limit: float) -> None:
        """Waits until the ranks ``pids`` and the launcher have ended, and fails the test
        if any is alive ``limit`` seconds after the call: the limit is the assertion
        (how fast a fault must end every process), so callers compare nothing after it
        (a returned duration would always be below the limit)."""
        wait_for(lambda: not any(_alive(p) for p in pids + [self.proc.pid]), limit,
                 f"every process of the run gone within {limit} s of the fault")

    def ends(self) -> list[tuple | None]:
        out = []
        for r in (0, 1):
            end = [x for x in records(self.run_dir, r) if x["type"] == "end"]
            out.append((end[-1]["status"], end[-1]["reason"]) if end else None)
        return out


def _no_tmp(run_dir):
    return not [f for f in os.listdir(rundir.checkpoint_dir(run_dir)) if ".tmp" in f]


@pytest.mark.parametrize("controller", ["mpi", "gloo"])
def test_sigterm_to_the_launcher_alone_stops_every_rank(tiny, tmp_path, controller):
    """`kill PID`, `timeout` or `docker stop` on horovodrun: the ranks notice, stop at
    the next step after a checkpoint, and say so."""
    with launch(str(tmp_path / "run"), tiny, controller) as run:
        pids = run.wait_for_step(20)
        os.kill(run.proc.pid, signal.SIGTERM)
        run.wait_gone(pids, 10)
    ends = run.ends()
    assert [e[0] for e in ends] == ["interrupted", "interrupted"], ends
    assert _no_tmp(run.run_dir)


@pytest.mark.parametrize("controller", ["mpi", "gloo"])
def test_sigterm_to_one_rank_stops_every_rank_after_a_checkpoint(tiny, tmp_path, controller):
    with launch(str(tmp_path / "run"), tiny, controller) as run:
        pids = run.wait_for_step(20)
        os.kill(pids[1], signal.SIGTERM)
        run.wait_gone(pids, 10)
        assert run.proc.wait() != 0
    ends = run.ends()
    assert ends[1][0] == "interrupted" and ends[1][1].startswith("received signal 15 (SIGTERM)")
    assert ends[0][0] == "interrupted" and "another rank was asked to stop" in ends[0][1]
    latest = json.load(open(rundir.latest_path(run.run_dir)))
    assert latest["epoch"] * 16 + latest["step"] >= 20  # no finished step lost
    assert _no_tmp(run.run_dir)


def test_a_killed_rank_is_named_by_the_survivor(tiny, tmp_path):
    """Gloo leaves rank 0 alive long enough to write its end (under MPI, mpirun kills
    every rank at once, which is faster still and leaves nothing to write)."""
    with launch(str(tmp_path / "run"), tiny, "gloo") as run:
        pids = run.wait_for_step(20)
        os.kill(pids[1], signal.SIGKILL)
        run.wait_gone(pids, 10)
    status, reason = run.ends()[0]
    assert status == "error" and reason.startswith("lost rank(s) 1: killed or exited"), reason


@pytest.mark.parametrize("controller", ["mpi", "gloo"])
def test_a_hung_rank_ends_the_run_with_its_name(tiny, tmp_path, controller):
    with launch(str(tmp_path / "run"), tiny, controller, "--hang-timeout", "5") as run:
        pids = run.wait_for_step(20)
        os.kill(pids[1], signal.SIGSTOP)  # left stopped; the block's end kills it if need be
        run.wait_gone(pids, 60)
    status, reason = run.ends()[0]
    assert status == "error" and reason.startswith("waited 5 s in ")
    assert "rank(s) 1 stopped answering" in reason


def _steps_and_epochs(run_dir, rank):
    recs = records(run_dir, rank)
    steps = {r["global_step"]: r["loss"] for r in recs if r["type"] == "step"}
    epochs = [(r["epoch"], r["sample_digest"], r["samples"], r["train_loss"])
              for r in recs if r["type"] == "epoch"]
    return steps, epochs


def test_interrupted_and_resumed_equals_uninterrupted(tiny, tmp_path):
    """SIGTERM in the middle of epoch 1 of 3, then --resume: every rank logs the same
    step losses (bitwise) and, per epoch, the same sample digest and training loss as
    a run that was never interrupted."""
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    out = horovodrun("--preset", "smoke", "--data", tiny, "--run-dir", full, "--epochs", "3",
                     "--no-validate")
    assert out.returncode == 0, out.stdout[-3000:]
    with launch(cut, tiny, "mpi") as run:
        pids = run.wait_for_step(18)  # epoch 1 is global steps 16-31
        for pid in pids:  # Slurm at the time limit: every rank gets SIGTERM
            os.kill(pid, signal.SIGTERM)
        run.wait_gone(pids, 10)
    cp = json.load(open(rundir.latest_path(cut)))
    # Inside an epoch (mid-epoch resume is the point), before the full run's end. CI under
    # load once saw the ranks reach the end of epoch 1 before the signal arrived.
    assert cp["epoch"] in (1, 2) and cp["step"] > 0, cp
    again = horovodrun("--run-dir", cut, "--resume", "--epochs", "3")
    assert again.returncode == 0, again.stdout[-3000:]
    for rank in (0, 1):
        want_steps, want_epochs = _steps_and_epochs(full, rank)
        got_steps, got_epochs = _steps_and_epochs(cut, rank)
        assert got_steps == want_steps and got_epochs == want_epochs
        kinds = [r["type"] for r in records(cut, rank)]
        assert kinds.count("resume") == 1 and kinds.count("end") == 2
