"""TensorBoard scalars of real 2-rank runs against their JSON logs: what rank 0 writes
live to ``RUN/tensorboard`` (a finished run, a killed one, the same run resumed), what
``distseg-report --tensorboard`` writes from the logs, and what a real ``tensorboard``
server serves over HTTP. Event files are read by TensorBoard's own reader, which
honours the purge a resumed launch writes.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest

from distseg.core import rundir, schema
from distseg.core import tbscalars as tb

import proc_group
from support import BIN, background, command_env, kill_group, wait_for, wait_for_log

TIMEOUT = 300
THREADS = ["--intra-op-threads", "1", "--inter-op-threads", "1"]
#: Tags the logs give directly: tag -> (record type, field) of rank 0's records.
DIRECT = {"train/loss": ("step", "loss"), "train/lr": ("step", "lr"),
          "train/step_time": ("step", "step_time"), "train/data_wait": ("step", "data_wait"),
          "batch/per_rank": ("step", "samples"), "epoch/train_loss": ("epoch", "train_loss"),
          "epoch/val_loss": ("epoch", "val_loss"), "epoch/train_time": ("epoch", "train_time"),
          "noise/b_simple": ("epoch", "noise_scale.b_simple"),
          "noise/tr_sigma": ("epoch", "noise_scale.tr_sigma"),
          "lr_rule/gain": ("epoch", "lr_rule.gain")}


def _train(*args):
    out = proc_group.horovodrun("distseg-train", *THREADS, *args, timeout=TIMEOUT)
    assert out.returncode == 0, out.stdout[-3000:]


def read_events(logdir: str) -> dict[str, list[tuple[int, float, float]]]:
    """tag -> [(step, value, wall time)] as TensorBoard loads the directory."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def records(run_dir: str, rank: int) -> list[dict]:
    """Rank ``rank``'s records by the schema's one rule (a killed launch may have left
    a cut-off line)."""
    recs, _ = schema.read_log(rundir.log_path(run_dir, rank))
    return recs


def _field(rec: dict, dotted: str):
    for part in dotted.split("."):
        rec = rec.get(part) if isinstance(rec, dict) else None
    return rec


def launches(run_dir: str, rank: int) -> list[tuple[dict, list[dict]]]:
    """(run record, its step and epoch records) per launch, each launch's steps before
    the first global step of a later launch (what a resumed launch's purge leaves)."""
    out: list[tuple[dict, list[dict]]] = []
    for rec in records(run_dir, rank):
        if rec["type"] == "run":
            out.append((rec, []))
        elif rec["type"] in ("step", "epoch") and out:
            out[-1][1].append(rec)
    for i, (_, recs) in enumerate(out):
        cut = min((r["global_step"] for _, later in out[i + 1:] for r in later
                   if r["type"] == "step"), default=math.inf)
        last = {}
        for r in recs:
            if r["type"] == "step" and r["global_step"] < cut:
                last[r["epoch"]] = r["global_step"]
        recs[:] = [dict(r, _at=r["global_step"] if r["type"] == "step" else last[r["epoch"]])
                   for r in recs if (r["global_step"] < cut if r["type"] == "step"
                                     else r["epoch"] in last)]
    return out


def expected(run_dir: str) -> dict[str, dict[int, float]]:
    """From the JSON logs of every rank: tag -> {global step: value}, as the mapping's
    documentation says (``distseg.core.tbscalars``)."""
    size = records(run_dir, 0)[0]["size"]
    by_rank = [launches(run_dir, r) for r in range(size)]
    want: dict[str, dict[int, float]] = {}
    for li, (run, recs) in enumerate(by_rank[0]):
        for rec in recs:
            for tag, (kind, name) in DIRECT.items():
                if rec["type"] == kind and _field(rec, name) is not None:
                    want.setdefault(tag, {})[rec["_at"]] = _field(rec, name)
            if rec["type"] == "step":
                want.setdefault("batch/global", {})[rec["_at"]] = rec["samples"] * run["size"]
            if rec["type"] != "epoch":
                continue
            for cls, dice in rec["val_dice"].items():
                want.setdefault(f"epoch/val_dice/{cls}", {})[rec["_at"]] = dice
            means, samples, train = [], 0, []
            for rank in range(size):
                _, theirs = by_rank[rank][li]
                times = [r["step_time"] for r in theirs
                         if r["type"] == "step" and r["epoch"] == rec["epoch"]]
                means.append(sum(times) / len(times))
                (ep,) = [r for r in theirs if r["type"] == "epoch" and r["epoch"] == rec["epoch"]]
                samples, train = samples + ep["samples"], train + [ep["train_time"]]
            want.setdefault("ranks/slowest_step_time", {})[rec["_at"]] = max(means)
            want.setdefault("ranks/slowest_rank", {})[rec["_at"]] = int(np.argmax(means))
            want.setdefault("ranks/imbalance_ratio", {})[rec["_at"]] = max(means) / np.mean(means)
            want.setdefault("epoch/samples_per_s", {})[rec["_at"]] = samples / max(train)
    return want


def assert_same(got: dict, want: dict) -> None:
    """Every expected tag holds exactly the expected steps, once each, with the logs'
    values (TensorBoard keeps float32)."""
    for tag, series in want.items():
        assert [s for s, _, _ in got[tag]] == sorted(series), tag
        assert [v for _, v, _ in got[tag]] == pytest.approx(
            [series[k] for k in sorted(series)], rel=1e-6, abs=1e-9), tag


def export(tmp_path, run_dir: str) -> dict:
    """``distseg-report RUN --tensorboard DIR``; the run's exported scalars."""
    out = tmp_path / "exported"
    done = proc_group.run_group([f"{BIN}/distseg-report", run_dir, "--out", str(tmp_path / "rep"),
                                 "--tensorboard", str(out)], env=command_env(), timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    return read_events(str(out / os.path.basename(run_dir)))


def assert_export_matches(live: dict, exported: dict, run_dir: str) -> None:
    """The export holds the live series (same steps, values and times) and each rank's
    step times."""
    assert set(live) <= set(exported)
    for tag, series in live.items():
        assert [s for s, _, _ in exported[tag]] == [s for s, _, _ in series], tag
        assert [v for _, v, _ in exported[tag]] == pytest.approx([v for _, v, _ in series],
                                                                 rel=1e-6, abs=1e-9), tag
        assert [w for _, _, w in exported[tag]] == pytest.approx([w for _, _, w in series],
                                                                 abs=1e-3), tag
    for rank in (0, 1):
        own = {r["_at"]: r["step_time"] for _, recs in launches(run_dir, rank) for r in recs
               if r["type"] == "step"}
        assert_same(exported, {tb.rank_tag(rank): own})


@pytest.fixture(scope="module")
def finished(tiny, tmp_path_factory) -> str:
    """A finished 2-rank run of 2 epochs x 6 steps, validated."""
    run_dir = str(tmp_path_factory.mktemp("tb") / "finished")
    _train("--preset", "smoke", "--data", tiny, "--run-dir", run_dir, "--epochs", "2",
           "--max-steps-per-epoch", "6")
    return run_dir


@pytest.mark.timeout(TIMEOUT + 60)
def test_a_finished_run_shows_its_logs_numbers_live_and_exported(finished, tmp_path):
    live = read_events(rundir.tensorboard_dir(finished))
    want = expected(finished)
    assert sorted(want["train/loss"]) == list(range(12))
    assert {"epoch/val_dice/liver", "noise/b_simple", "ranks/imbalance_ratio"} <= set(want)
    assert_same(live, want)
    # Every tag written is one the mapping documents; wall times are on the agreed clock.
    patterns = [t.replace("CLASS", "").replace("B", "").replace("NNNNN", "") for t in tb.TAGS]
    assert all(any(tag.startswith(p) for p in patterns) for tag in live)
    start = records(finished, 0)[0]["start_time"]
    steps = [r for r in records(finished, 0) if r["type"] == "step"]
    assert [w for _, _, w in live["train/loss"]] == pytest.approx(
        [start + r["t"] for r in steps], abs=1e-3)
    assert_export_matches(live, export(tmp_path, finished), finished)


def _killed_in_epoch_4(tiny: str, run_dir: str) -> int:
    """A 2-rank run of 6 epochs, checkpointed every 3, killed (SIGKILL, every process)
    in epoch index 4; returns its steps per epoch."""
    cmd = proc_group.horovodrun_cmd("distseg-train", "--preset", "smoke", *THREADS, "--data",
                                    tiny, "--run-dir", run_dir, "--epochs", "6",
                                    "--checkpoint-every", "3", "--no-validate")
    with background(cmd, env=command_env()) as proc:
        wait_for_log(run_dir, 1, '"type":"run"', proc)
        spe = records(run_dir, 1)[0]["steps_per_epoch"]
        wait_for_log(run_dir, 1, f'"global_step":{4 * spe + 2},', proc, TIMEOUT, poll=0.01)
        pids = [records(run_dir, r)[0]["pid"] for r in (0, 1)]
        for pid in pids:  # killed where it stands: no checkpoint, no end record
            os.kill(pid, signal.SIGKILL)
        kill_group(proc)
    return spe


@pytest.mark.timeout(2 * TIMEOUT + 60)
def test_a_killed_run_stays_readable_and_its_resume_repeats_no_step(tiny, tmp_path):
    run_dir = str(tmp_path / "cut")
    spe = _killed_in_epoch_4(tiny, run_dir)
    latest = json.load(open(rundir.latest_path(run_dir)))["manifest"]
    assert json.load(open(os.path.join(rundir.checkpoint_dir(run_dir), latest)))[
        "global_step"] == 3 * spe
    board = rundir.tensorboard_dir(run_dir)
    killed = read_events(board)
    # Readable: every epoch up to the last one rank 0 finished, as the logs say.
    assert [int(v) for _, v, _ in killed["epoch/epoch"]] == [0, 1, 2, 3]
    logged = expected(run_dir)
    done = [s for s, _, _ in killed["train/loss"]]
    assert done[:4 * spe] == list(range(4 * spe))
    assert_same(killed, {tag: {k: v for k, v in s.items() if k in done}
                         for tag, s in logged.items() if tag.startswith("train/")})

    _train("--run-dir", run_dir, "--resume")
    assert len(os.listdir(board)) == 2  # the killed launch's file, and the resumed one's
    live = read_events(board)
    want = expected(run_dir)
    assert sorted(want["train/loss"]) == list(range(6 * spe))
    assert_same(live, want)  # steps 3 x spe and on: the resumed launch's, once each
    resumed_at = [r for r in records(run_dir, 0) if r["type"] == "run"][1]["start_time"]
    assert all((w > resumed_at) == (s >= 3 * spe) for s, _, w in live["train/loss"])
    assert_export_matches(live, export(tmp_path, run_dir), run_dir)


#: What ``tensorboard --port 0`` prints once it listens on the port the kernel gave it.
SERVING = re.compile(r"TensorBoard \S+ at http://127\.0\.0\.1:(\d+)/")


def _served_port(output) -> int | None:
    """The port a ``tensorboard --port 0`` writing to file ``output`` listens on, once
    it says so (no port is picked here and handed on: another process could take it)."""
    found = SERVING.search(output.read_text(errors="replace")) if output.exists() else None
    return int(found.group(1)) if found else None


def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return None


@pytest.mark.timeout(TIMEOUT + 60)
def test_a_tensorboard_server_serves_the_runs_scalars(finished, tmp_path):
    cmd = [f"{BIN}/tensorboard", "--logdir", os.path.dirname(finished), "--host", "127.0.0.1",
           "--port", "0", "--reload_interval", "1"]
    run = f"{os.path.basename(finished)}/{rundir.TENSORBOARD_DIR}"
    want = expected(finished)
    output = tmp_path / "tensorboard.out"
    with open(output, "w") as out, background(cmd, env=command_env(), stdout=out) as server:
        port = wait_for(lambda: _served_port(output), 120, "tensorboard listening", proc=server)
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: run in (_get(f"{base}/data/runs") or []), 120,
                 f"run {run} served by tensorboard", poll=1.0, proc=server)
        for tag in ("train/loss", "epoch/val_loss", "ranks/imbalance_ratio"):
            query = urllib.parse.urlencode({"run": run, "tag": tag})
            rows = wait_for(lambda: _get(f"{base}/data/plugin/scalars/scalars?{query}"), 60,
                            f"{tag} over HTTP", poll=1.0, proc=server)
            assert [step for _, step, _ in rows] == sorted(want[tag])
            assert [value for _, _, value in rows] == pytest.approx(
                [want[tag][k] for k in sorted(want[tag])], rel=1e-6)
