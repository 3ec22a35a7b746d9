"""Job scripts of ``distseg-jobs`` through a real Slurm (the ``slurm`` fixture: munged,
slurmctld and slurmd on this machine): ``sbatch``, ``srun --mpi=pmix`` starting 2
Horovod ranks, the time-limit signal, requeue, ``scancel`` and a killed rank, each
checked in the run directory (the rank logs) and in ``scontrol show job``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from distseg.core import rundir

from support import BIN, log_records, wait_for
from support import jobs_cli as cli

pytestmark = pytest.mark.timeout(420)

#: Steps per epoch of the smoke preset on ``tiny`` at 2 ranks (128 slices, 4 per rank).
STEPS_PER_EPOCH = 16


def _render(tmp_path, data: str, name: str, *train: str,
            time_limit: str = "00:05:00") -> tuple[str, str]:
    """A one-node, 2-rank job script of the smoke preset; (script, run directory)."""
    runs = tmp_path / "runs"
    out = cli("render", "--partition", "generic", "--nodes", "1", "--ranks-per-node", "2",
              "--data", data, "--runs-dir", str(runs), "--name", name, "--preset", "smoke",
              "--time", time_limit, *train)
    assert out.exit_code == 0, out.output
    script = tmp_path / f"{name}.sbatch"
    script.write_text(out.stdout)
    return str(script), str(runs / f"{name}-n1")


def _ends(run_dir: str, rank: int) -> list[dict]:
    return [r for r in log_records(run_dir, rank, running=True) if r["type"] == "end"]


def _steps(run_dir: str, rank: int = 0) -> list[int]:
    return [r["global_step"] for r in log_records(run_dir, rank, running=True) if r["type"] == "step"]


def _output(info: dict) -> str:
    path = info.get("StdOut", "")
    # errors="replace": a progress bar cut in the middle of a character
    return open(path, errors="replace").read() if path and os.path.exists(path) else ""


def _report(run_dir: str, out: str) -> dict:
    res = subprocess.run([f"{BIN}/distseg-report", run_dir, "--out", out], capture_output=True,
                         text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f)


def _submit_sweep(slurm, data: str, tmp_path, name: str, epochs: int):
    """``distseg-jobs sweep`` of one 2-rank training job, then ``bash submit.sh``;
    (runs folder, training job id, report job id, submit.sh's output)."""
    runs, out = tmp_path / "runs", tmp_path / "sweep"
    res = cli("sweep", "--partition", "generic", "--nodes", "1", "--ranks-per-node", "2",
              "--data", data, "--runs-dir", str(runs), "--name", name, "--out", str(out),
              "--preset", "smoke", "--epochs", str(epochs), "--no-validate", "--time", "00:05:00")
    assert res.exit_code == 0, res.output
    sub = slurm.run("bash", str(out / "submit.sh"), cwd=str(tmp_path))
    ids = re.findall(r"as job (\d+)", sub.stdout)
    assert len(ids) == 2, sub.stdout
    return runs, ids[0], ids[1], sub.stdout


def test_sweep_submits_chained_jobs_and_the_report_after_them(slurm, tiny, tmp_path):
    runs, train_id, report_id, submitted = _submit_sweep(slurm, tiny, tmp_path, "sw", 2)
    assert f"(after jobs {train_id})" in submitted
    assert slurm.job(report_id)["Dependency"].startswith(f"afterany:{train_id}")

    report = slurm.wait(report_id, timeout=240)
    train = slurm.job(train_id)
    assert (train["JobState"], train["ExitCode"], train["Restarts"]) == ("COMPLETED", "0:0", "0"), (
        slurm.describe(train_id, train))
    assert (report["JobState"], report["ExitCode"]) == ("COMPLETED", "0:0"), slurm.describe(report_id, report)
    assert report["StartTime"] >= train["EndTime"]
    assert "launcher: srun" in _output(train)

    run_dir = str(runs / "sw-n1")
    assert [_ends(run_dir, r)[-1]["status"] for r in (0, 1)] == ["ok", "ok"]
    assert _steps(run_dir) == list(range(2 * STEPS_PER_EPOCH))
    with open(runs / "sw-report" / "report.json") as f:
        table = json.load(f)["tables"]["runs"]
    assert [(r["run"], r["ranks"], r["nodes"], r["launches"], r["epochs"], r["status"]) for r in table] == [
        ("sw-n1", 2, 1, 1, 2, "ok")]


def _seconds(slurm_time: str) -> int:
    """Seconds of a Slurm duration, ``[D-]HH:MM:SS`` (scontrol's RunTime, TimeLimit)."""
    days, _, clock = slurm_time.rpartition("-")
    hours, minutes, seconds = (int(x) for x in clock.split(":"))
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


#: Epochs of the time-limit test: 100 x 16 = 1,600 steps. The first launch is held
#: (SIGSTOP) from about step 20 until its signal is waiting on both ranks, whatever the
#: machine's speed; the epochs leave the test room to hold it before the run ends, and
#: the second launch trains the rest.
TIME_LIMIT_EPOCHS = 100
#: USR1's bit in /proc/PID/status's masks of pending signals.
USR1_BIT = 1 << (10 - 1)


def _pending(pid: int) -> int:
    """The signals waiting for process ``pid`` (its own and its thread group's)."""
    masks = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("SigPnd:", "ShdPnd:")):
                masks |= int(line.split()[1], 16)
    return masks


def _hold_until_usr1(slurm, job: str, run_dir: str, cut_limit) -> None:
    """Stops both ranks (SIGSTOP), calls ``cut_limit()``, waits until Slurm's USR1 has
    reached both (pending while they are stopped), and lets them go on (SIGCONT), so
    the signal finds them training however fast they train. They are let go whatever
    happens."""
    pids = [log_records(run_dir, r, running=True)[0]["pid"] for r in (0, 1)]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        cut_limit()
        slurm.wait_until(job, lambda i: all(_pending(p) & USR1_BIT for p in pids), timeout=120,
                         poll=0.5, what="USR1 waiting on both ranks")
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


@pytest.mark.timeout(1200)
def test_time_limit_signals_checkpoints_requeues_and_resumes(slurm, tiny, tmp_path):
    # When the signal comes is the test's doing, not the machine's speed. slurmctld (22.05)
    # checks running jobs every 30 s: it sends the --signal (B:USR1@LEAD) at the first
    # check with end - now <= LEAD + 30, and ends the job at the first with now >= end
    # (end = start + TimeLimit, whole minutes). Rendered for 10 minutes, LEAD is 120 s
    # (signal_lead): nothing fires by itself for 7.5 minutes. Once the ranks train, the
    # test cuts the limit to the fewest minutes that leave end - now >= 95 s (RunTime is
    # floored): end - now is then in [95, 155) s, so USR1 comes at the next check (above
    # 150 s, at most 5 s later), within about 36 s, and the end is still over a minute
    # (95 - 31 s) after it: time to checkpoint, stop and requeue. (With a 3-minute script,
    # LEAD 60 s, that needs end - now between about 60 and 90 s: narrower than the minute
    # steps of the limit.)
    epochs = TIME_LIMIT_EPOCHS
    script, run_dir = _render(tmp_path, tiny, "tl", "--epochs", str(epochs), "--no-validate",
                              time_limit="00:10:00")
    assert "#SBATCH --signal=B:USR1@120" in open(script).read()
    job = slurm.sbatch(script, cwd=str(tmp_path))
    _wait_for_step(slurm, job, run_dir, 20)

    def cut_limit():
        elapsed = _seconds(slurm.job(job)["RunTime"])
        limit = -(-(elapsed + 95) // 60)
        slurm.run("scontrol", "update", f"JobId={job}", f"TimeLimit={limit}")
    _hold_until_usr1(slurm, job, run_dir, cut_limit)

    # What the test waits for is the requeue (Restarts), whatever states the job shows
    # on the way (RUNNING, SIGNALING, COMPLETING, REQUEUED, PENDING); it fails with
    # Slurm's logs on the job if the job ends instead.
    info = slurm.wait_until(job, lambda i: i["Restarts"] != "0", timeout=180, what="requeued")
    assert info["Restarts"] == "1", slurm.describe(job, info)
    first = _ends(run_dir, 0)
    assert [e["status"] for e in first] == ["interrupted"], (first, slurm.describe(job, info))
    assert "USR1" in first[0]["reason"]
    with open(rundir.latest_path(run_dir)) as f:
        stopped_at = json.load(f)
    # Slurm holds a requeued job for 2 minutes (its BeginTime); an administrator's
    # `scontrol update` starts it now, under a longer limit, so the test ends after two
    # launches, not after as many as the remaining epochs would need. Not before the
    # first launch is over (PENDING: no longer COMPLETING or REQUEUED) and a second
    # later: slurmd revokes the job's credentials as of the second it killed the first
    # launch, and refuses a launch whose credential is of that second ("Job N already
    # killed, do not launch batch job"): a launch that writes nothing. The 15-minute
    # limit signals at 12.5 minutes at the earliest, far past what the rest takes.
    slurm.wait_until(job, lambda i: i["JobState"] == "PENDING", timeout=60, poll=0.5,
                     what="pending again")
    time.sleep(2)
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now", "TimeLimit=00:15:00")
    info = slurm.wait_until(job, lambda i: i["JobState"] in slurm.ENDED or i["Restarts"] != "1",
                            timeout=900, what="ended or requeued again")
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), (
        slurm.describe(job, info, tail=6000))

    for rank in (0, 1):
        assert [e["status"] for e in _ends(run_dir, rank)] == ["interrupted", "ok"]
    resumes = [r for r in log_records(run_dir, 0) if r["type"] == "resume"]
    assert [(r["from_epoch"], r["from_step"]) for r in resumes] == [(stopped_at["epoch"], stopped_at["step"])]
    # Every step once: the first launch stopped at its checkpoint, the second went on
    # from the step after it; every epoch once.
    assert _steps(run_dir) == list(range(epochs * STEPS_PER_EPOCH))
    epochs_logged = [r["epoch"] for r in log_records(run_dir, 0) if r["type"] == "epoch"]
    assert epochs_logged == list(range(epochs))
    table = _report(run_dir, str(tmp_path / "report"))["tables"]["runs"]
    assert [(r["launches"], r["epochs"], r["status"]) for r in table] == [(2, epochs, "ok")]


def test_scancel_checkpoints_and_does_not_requeue(slurm, tiny, tmp_path):
    script, run_dir = _render(tmp_path, tiny, "cancel", "--epochs", "400", "--no-validate")
    job = slurm.sbatch(script, cwd=str(tmp_path))
    _wait_for_step(slurm, job, run_dir, 20)
    slurm.run("scancel", job)
    # The job shows COMPLETING until every process of it (the batch shell and the ranks)
    # has ended, and CANCELLED after: so the ranks have written their end records, and
    # the script, the only thing that could requeue the job, has decided.
    info = slurm.wait(job, timeout=90)
    assert (info["JobState"], info["Restarts"]) == ("CANCELLED", "0"), slurm.describe(job, info)
    ends = [_ends(run_dir, r) for r in (0, 1)]
    assert [[e["status"] for e in e_] for e_ in ends] == [["interrupted"], ["interrupted"]], ends
    # scancel sends TERM to the batch shell (which passes USR1 on) and to every rank:
    # whichever comes first is the reason.
    assert re.search(r"SIG(TERM|USR1)", ends[0][0]["reason"]), ends
    with open(rundir.latest_path(run_dir)) as f:
        latest = json.load(f)
    assert latest["epoch"] * STEPS_PER_EPOCH + latest["step"] >= 20
    # Not queued again: the script, which has ended (above), did not requeue it (TERM,
    # not USR1), and the job is still the ended one.
    assert "requeueing" not in _output(info), _output(info)[-3000:]
    now = slurm.job(job)
    assert (now["JobState"], now["Restarts"]) == ("CANCELLED", "0")

    # Resumable by hand: the same script submitted again continues the run.
    again = slurm.sbatch(script, "--time=00:05:00", cwd=str(tmp_path))
    _wait_for_step(slurm, again, run_dir, latest["epoch"] * STEPS_PER_EPOCH + latest["step"] + 3)
    slurm.run("scancel", again)
    slurm.wait(again, timeout=90)
    resumes = [r for r in log_records(run_dir, 0, running=True) if r["type"] == "resume"]
    assert [(r["from_epoch"], r["from_step"]) for r in resumes] == [(latest["epoch"], latest["step"])]


def _wait_for_step(slurm, job: str, run_dir: str, step: int, timeout: float = 120) -> None:
    """Waits until rank 1 of the job's first launch has logged global step ``step``;
    fails with the job's output and Slurm's logs on it when the job ends or is requeued
    first, or the time runs out (then it is cancelled)."""
    path = rundir.log_path(run_dir, 1)

    def logged(info: dict) -> bool:
        if os.path.exists(path) and f'"global_step":{step},' in open(path).read():
            return True
        if info["Restarts"] != "0":
            pytest.fail(f"job {job} was requeued before global step {step}\n{slurm.describe(job, info)}")
        return False

    slurm.wait_until(job, logged, timeout=timeout, poll=0.5, what=f"at global step {step}")


def _rank_pids(job: str, slurm) -> list[int]:
    """The distseg-train processes of ``job`` on this node (``scontrol listpids``)."""
    out = slurm.run("scontrol", "listpids", job).stdout
    pids = []
    for line in out.splitlines()[1:]:
        pid = line.split()[0]
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"distseg-train" in f.read():
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def _importing_tensorflow(pids: list[int]) -> list[int]:
    """Those of ``pids`` that have TensorFlow's library mapped: inside ``import
    tensorflow`` or past it."""
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                if "libtensorflow" in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def test_signal_during_start_up_stops_cleanly(slurm, tiny, tmp_path):
    script, run_dir = _render(tmp_path, tiny, "early", "--epochs", "400", "--no-validate")
    job = slurm.sbatch(script, cwd=str(tmp_path))
    slurm.wait_running(job)
    # Both ranks inside the imports of TensorFlow and Horovod (seconds here), where
    # issue 22's USR1 killed both ranks; the check below proves the ranks had not
    # started training.
    wait_for(lambda: len(_importing_tensorflow(_rank_pids(job, slurm))) >= 2, 60,
             f"both ranks of job {job} importing TensorFlow", poll=0.1)
    assert os.path.exists(run_dir) and not os.path.exists(rundir.log_path(run_dir, 0)), \
        "the ranks started logging before the signal: not a start-up signal"
    # What `#SBATCH --signal=B:USR1@...` does when it fires early: USR1 to the batch shell.
    slurm.run("scancel", "--batch", "--signal=USR1", job)
    info = slurm.wait_until(job, lambda i: i["Restarts"] != "0" or i["JobState"] in slurm.ENDED,
                            timeout=120)
    slurm.run("scancel", job, check=False)  # the requeued job need not run again
    out = _output(info)
    # Stopped cleanly: no rank died of the signal, both logged `interrupted` at their
    # first step after a whole checkpoint, and the job requeued itself to go on.
    assert "User defined signal" not in out and "exited with status 130" in out, out[-3000:]
    assert info["Restarts"] == "1", out[-3000:]
    for rank in (0, 1):
        ends = _ends(run_dir, rank)
        assert [e["status"] for e in ends] == ["interrupted"], out[-3000:]
        assert "USR1" in ends[0]["reason"]
    with open(rundir.latest_path(run_dir)) as f:
        latest = json.load(f)
    assert latest["epoch"] * STEPS_PER_EPOCH + latest["step"] <= 2


def test_a_killed_rank_fails_the_job_and_the_report_still_runs(slurm, tiny, tmp_path):
    runs, train_id, report_id, _ = _submit_sweep(slurm, tiny, tmp_path, "kill", 400)
    run_dir = str(runs / "kill-n1")
    _wait_for_step(slurm, train_id, run_dir, 10)
    ranks = {}
    for pid in _rank_pids(train_id, slurm):
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        ranks[int(env[b"SLURM_PROCID"])] = pid
    assert sorted(ranks) == [0, 1], ranks
    os.kill(ranks[1], 9)

    report = slurm.wait(report_id, timeout=240)
    train = slurm.job(train_id)
    text = _output(train)
    assert train["JobState"] == "FAILED" and train["ExitCode"] != "0:0", slurm.describe(train_id, train)
    assert train["Restarts"] == "0"
    assert "error: rank 1 (Killed) ended first; rank(s) 0 1 ended without an end record" in text \
        or "error: rank 1 (Killed) ended first; rank(s) 1 ended without an end record" in text, text[-3000:]
    assert (report["JobState"], report["ExitCode"]) == ("COMPLETED", "0:0"), slurm.describe(report_id, report)
    with open(runs / "kill-report" / "report.json") as f:
        table = json.load(f)["tables"]["runs"]
    # The report names the failed run: rank 1 has no end record, rank 0 was ended by
    # srun (killed, or an error record if its hang watchdog fired first).
    assert [r["run"] for r in table] == ["kill-n1"], table
    assert table[0]["status"] != "ok" and not table[0]["status"].startswith("ok on 2"), table
