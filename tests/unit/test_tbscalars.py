"""The record -> TensorBoard scalar mapping (``distseg.core.tbscalars``), its event
files read back by TensorBoard's own reader, and the export of any run's logs
(``analysis.board``): a killed and resumed run from before TensorBoard scalars existed
(schema 1), exported with TensorFlow blocked, reads back as its logs' numbers with
every redone step once.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from analysis.board import kept_steps, run_name
from analysis.logfile import RankLog
from distseg.core import rundir
from distseg.core import tbscalars as tb
from tests.analysis_fixtures.runs import Launch, RunSpec, write_run

from support import REPO, import_blocker

START = 1.7e9


def read_events(logdir: str) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar of a TensorBoard run directory as TensorBoard loads it (purges
    honoured): tag -> [(step, value, wall time)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def f32(x: float) -> float:
    """``x`` as TensorBoard stores a scalar (float32)."""
    return float(np.float32(x))


def by_tag(scalars) -> dict:
    return {s.tag: s for s in scalars}


STEP = {"type": "step", "rank": 0, "time": START + 12.5, "epoch": 1, "step": 3,
        "global_step": 19, "t": 12.0, "step_time": 0.5, "data_wait": 0.1, "loss": -0.25,
        "loss_local": -0.2, "lr": 2e-3, "samples": 4, "grad_sq": [1.0, 2.0, 3.0, 4.0]}


def test_a_step_record_maps_to_the_global_series_at_its_global_step():
    got = by_tag(tb.step_scalars(STEP, 2, START))
    assert {t: s.value for t, s in got.items()} == {
        "train/loss": -0.25, "train/lr": 2e-3, "train/step_time": 0.5, "train/data_wait": 0.1,
        "train/samples_per_s": 16.0, "batch/per_rank": 4.0, "batch/global": 8.0}
    assert {(s.step, s.wall_time) for s in got.values()} == {(19, START + 12.0)}
    assert set(got) <= set(tb.TAGS)
    (own,) = tb.rank_step_scalars(STEP, 3, START)
    assert own == tb.Scalar("ranks/step_time/rank-00003", 0.5, 19, START + 12.0)


def test_missing_null_and_non_finite_fields_write_nothing():
    rec = {**STEP, "loss": None, "lr": float("nan"), "data_wait": "x"}
    del rec["step_time"]
    got = by_tag(tb.step_scalars(rec, 2, None))
    assert set(got) == {"batch/per_rank", "batch/global"}
    assert got["batch/global"].wall_time == START + 12.5  # no start time: the record's own
    assert tb.step_scalars({"loss": 1.0}, 1, START) == []  # no global step: no place


def test_a_range_test_maps_each_sweep_step_and_the_choice():
    run = {"type": "run", "start_time": 1.7e9,
           "lr_find": {"lr": 0.004, "lrs": [1e-5, 1e-4, 1e-3], "losses": [-0.1, -0.2, math.nan],
                       "smoothed": [-0.1, -0.15, -0.3]}}
    got = {(s.tag, s.step): s.value for s in tb.lr_find_scalars(run)}
    assert got[("lr_find/chosen", 0)] == 0.004
    assert [got[("lr_find/lr", k)] for k in range(3)] == [1e-5, 1e-4, 1e-3]
    assert got[("lr_find/smoothed", 2)] == -0.3 and ("lr_find/loss", 2) not in got  # NaN: none
    assert all(s.wall_time == 1.7e9 for s in tb.lr_find_scalars(run))
    assert tb.lr_find_scalars({"type": "run"}) == []


def test_an_epoch_record_maps_at_the_epochs_last_step():
    rec = {"type": "epoch", "rank": 0, "time": 0.0, "epoch": 2, "t": 30.0, "epoch_time": 9.0,
           "train_time": 8.0, "samples": 32, "train_loss": -0.3, "val_loss": -0.4,
           "val_dice": {"background": 0.9, "liver tumour": None, "liver": 0.5},
           "noise_scale": {"b_simple": 12.0, "b_simple_raw": 10.0, "g2": 1.5, "tr_sigma": 18.0,
                           "method": "ranks"},
           "lr_rule": {"rule": "gain", "lr": 1e-3, "gain": 1.4, "progress": 22.5},
           "goodput": {"per_rank": 2, "next_per_rank": 4, "switched": True,
                       "goodput": {"2": 10.0, "4": 12.5}},
           "comm": {"steps": 16, "gradient_s": 0.07, "gradient_wait_s": 0.01,
                    "small_s": 0.0001, "small_wait_s": 0.02}}
    got = by_tag(tb.epoch_scalars(rec, 47, START))
    assert {t: s.value for t, s in got.items()} == {
        "epoch/epoch": 2.0, "epoch/train_loss": -0.3, "epoch/val_loss": -0.4,
        "epoch/val_dice/background": 0.9, "epoch/val_dice/liver": 0.5,
        "epoch/epoch_time": 9.0, "epoch/train_time": 8.0, "noise/b_simple": 12.0,
        "noise/b_simple_raw": 10.0, "noise/g2": 1.5, "noise/tr_sigma": 18.0, "lr_rule/gain": 1.4,
        "lr_rule/progress": 22.5, "goodput/per_rank": 2.0,
        "goodput/next_per_rank": 4.0, "goodput/switched": 1.0,
        "goodput/predicted_gain": 1.25, "goodput/goodput/2": 10.0,
        "goodput/goodput/4": 12.5, "comm/gradient_s": 0.07, "comm/gradient_wait_s": 0.01,
        "comm/small_s": 0.0001, "comm/small_wait_s": 0.02}
    assert {(s.step, s.wall_time) for s in got.values()} == {(47, START + 30.0)}
    assert tb.tag_part("liver tumour/2") == "liver_tumour_2"


def test_the_epoch_balance_takes_the_report_s_imbalance_and_throughput_rules():
    """The balance scalars of an epoch: the slowest rank, and the imbalance and samples/s
    by ``core.ranktime``'s rules, the ones the report's rank-balance and time-per-epoch
    tables call."""
    from distseg.core import ranktime
    ranks = [tb.RankEpoch(0, 0.2, 16, 4.0), tb.RankEpoch(1, 0.3, 16, 5.0),
             tb.RankEpoch(2, 0.25, 16, 4.5)]
    got = {s.tag: s.value for s in tb.balance_scalars(ranks, 7, START)}
    assert got == pytest.approx({"ranks/slowest_step_time": 0.3, "ranks/slowest_rank": 1.0,
                                 "ranks/imbalance_ratio": ranktime.imbalance(0.3, 0.25),
                                 "epoch/samples_per_s": ranktime.throughput(48, 5.0)})
    assert got["ranks/imbalance_ratio"] == pytest.approx(0.3 / 0.25)
    # A rank without step times still counts its samples; without any, no balance.
    got = {s.tag for s in tb.balance_scalars([tb.RankEpoch(0, math.nan, 16, 4.0)], 7, START)}
    assert got == {"epoch/samples_per_s"}


def test_a_purge_step_hides_what_a_killed_launch_wrote_from_there_on(tmp_path):
    logdir = str(tmp_path / "tb")
    first = tb.ScalarWriter(logdir, purge_step=0, suffix=".1")
    first.write([tb.Scalar("train/loss", float(k), k, START + k) for k in range(10)])
    first.flush()  # then killed: no close
    second = tb.ScalarWriter(logdir, purge_step=6, suffix=".2")
    second.write([tb.Scalar("train/loss", 100.0 + k, k, START + 50 + k) for k in range(6, 9)])
    second.close()
    got = read_events(logdir)["train/loss"]
    assert [(s, v) for s, v, _ in got] == [(k, float(k)) for k in range(6)] + [
        (k, 100.0 + k) for k in range(6, 9)]


def test_kept_steps_keep_each_global_step_of_the_latest_launch_that_ran_it():
    seg = [0] * 6 + [1] * 3 + [2] * 4
    gs = [0, 1, 2, 3, 4, 5, 3, 4, 5, 4, 5, 6, 7]  # killed at 5, resumed at 3, again at 4
    log = RankLog(rank=0, path="x", steps=pd.DataFrame(
        {"segment": np.array(seg, np.int32), "epoch": 0.0, "step": np.array(gs, float),
         "global_step": np.array(gs, float), "t": 0.0, "step_time": np.arange(13.0),
         "data_wait": 0.0, "loss": 0.0, "lr": 0.0, "samples": 1.0}))
    kept = kept_steps(log)
    assert list(zip(kept["segment"], kept["global_step"])) == [
        (0, 0), (0, 1), (0, 2), (1, 3), (2, 4), (2, 5), (2, 6), (2, 7)]


def test_run_names_stay_inside_the_export_directory():
    assert run_name("np2") == "np2"
    assert run_name("/abs/runs/np2") == os.path.join("abs", "runs", "np2")
    assert run_name("../../x") == "x"


def _expected(run_dir: str, size: int) -> dict[str, dict[int, float]]:
    """From the JSON logs: each launch's steps before the next launch's first step
    (the fixture's launches restart at epoch boundaries), rank 0's loss and every
    rank's step time; rank 0's epochs' losses at their last kept step."""
    want: dict[str, dict[int, float]] = {}
    for rank in range(size):
        launches = []
        for line in open(rundir.log_path(run_dir, rank), encoding="utf-8"):
            start = line.rfind('{"type"')  # a killed launch's cut-off line, then a record
            if start < 0:
                continue
            try:
                rec = json.loads(line[start:])
            except ValueError:
                continue
            if rec["type"] == "run":
                launches.append([])
            elif rec["type"] in ("step", "epoch"):
                launches[-1].append(rec)
        for i, recs in enumerate(launches):
            cut = min((r["global_step"] for later in launches[i + 1:] for r in later
                       if r["type"] == "step"), default=math.inf)
            steps = [r for r in recs if r["type"] == "step" and r["global_step"] < cut]
            for r in steps:
                want.setdefault(tb.rank_tag(rank), {})[r["global_step"]] = r["step_time"]
                if rank == 0:
                    want.setdefault("train/loss", {})[r["global_step"]] = r["loss"]
            for r in recs:
                last = [s["global_step"] for s in steps if s["epoch"] == r["epoch"]]
                if rank == 0 and r["type"] == "epoch" and last:
                    want.setdefault("epoch/train_loss", {})[max(last)] = r["train_loss"]
    return want


EXPORT = import_blocker("tensorflow", "horovod", "keras", "tf_keras") + r"""
from analysis.cli import report
report.main(sys.argv[1:], prog_name="distseg-report", standalone_mode=True)
"""


@pytest.mark.timeout(300)
def test_an_old_killed_and_resumed_run_exports_as_its_logs_without_tensorflow(tmp_path):
    spec = RunSpec(size=2, epochs=3, launches=[Launch(0, 2, killed_after=3), Launch(2, 3)])
    run = write_run(str(tmp_path / "np2"), spec)
    other = write_run(str(tmp_path / "np1"), RunSpec(size=1, epochs=2))
    out = tmp_path / "tb"
    env = dict(os.environ, PYTHONPATH=REPO, MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, "-c", EXPORT, run, other, "--out",
                           str(tmp_path / "report"), "--tensorboard", str(out)],
                          capture_output=True, text=True, timeout=240, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"of 2 run(s) in {out}" in done.stderr
    assert sorted(os.listdir(out)) == ["np1", "np2"]
    got = read_events(str(out / "np2"))
    want = _expected(run, 2)
    # 3 epochs of 4 steps, once each: the killed launch's steps 8-10 were run again.
    assert sorted(want["train/loss"]) == list(range(12))
    assert sum('"global_step":8,' in line for line in open(rundir.log_path(run, 0))) == 2
    for tag, series in want.items():
        assert [(s, v) for s, v, _ in got[tag]] == [(k, f32(v)) for k, v in sorted(series.items())]
    # Wall times: the launch's start + t (the second launch starts 1000 s later).
    (first, *_), last = got["train/loss"], got["train/loss"][-1]
    assert first[2] == pytest.approx(START + 1.0) and last[2] > START + 1000
    assert got["ranks/imbalance_ratio"] and all(v == 1.0 for _, v, _ in got["ranks/imbalance_ratio"])
    # Exported again: the same, not twice.
    again = subprocess.run([sys.executable, "-c", EXPORT, run, "--out", str(tmp_path / "r2"),
                            "--tensorboard", str(out)], capture_output=True, text=True,
                           timeout=240, env=env, cwd=str(tmp_path))
    assert again.returncode == 0, again.stderr[-3000:]
    assert read_events(str(out / "np2")) == got


class _Failing:
    logdir = "RUN/tensorboard"

    def __init__(self):
        self.closed = False

    def write(self, scalars):
        raise OSError(28, "No space left on device")

    def close(self):
        self.closed = True


def test_a_board_that_cannot_write_warns_once_and_the_run_goes_on(monkeypatch, capsys):
    from distseg.training.epoch import board as board_lib

    gathered = []
    monkeypatch.setattr(board_lib.dist, "allgather_object",
                        lambda obj: gathered.append(obj) or [obj, (0.5, 8, 2.0)])
    failing = _Failing()
    board = board_lib.Board(failing, size=2, start_time=START)
    board.on_step({**STEP, "global_step": 0, "step_time": 0.25})
    board.on_step({**STEP, "global_step": 1, "step_time": 0.75})
    assert board.writer is None and failing.closed
    board.on_epoch_end({"epoch": 0, "t": 3.0, "samples": 8, "train_time": 1.5})
    # Still a part of the epoch's collective, with this rank's own step times.
    assert gathered == [(0.5, 8, 1.5)]
    err = capsys.readouterr().err
    assert err.count("warning: RUN/tensorboard: TensorBoard scalars stopped") == 1
    assert "No space left on device" in err and "the logs are complete" in err


def test_two_ranks_points_on_one_step_and_wall_time_keep_each_series_in_order(tmp_path):
    """An export writes rank 0's step times, then rank 1's. Where a rank-1 record has the
    same step and wall time as a rank-0 one (to the clock's last bit: it happened in a
    resumed 2-rank run), its point must stay in rank 1's series order, not join rank 0's
    earlier event (TensorBoard then read rank 1's series as [1, 0, 1, 2])."""
    same = START + 1.5
    scalars = [tb.Scalar(tb.rank_tag(0), 0.1, s, START + s) for s in (0, 2)]
    scalars.insert(1, tb.Scalar(tb.rank_tag(0), 0.1, 1, same))
    scalars += [tb.Scalar(tb.rank_tag(1), 0.2, s, same if s == 1 else START + s + 0.25)
                for s in (0, 1, 2)]
    writer = tb.ScalarWriter(str(tmp_path / "tb"))
    writer.write(scalars)
    writer.close()
    got = read_events(str(tmp_path / "tb"))
    assert [s for s, _, _ in got[tb.rank_tag(0)]] == [0, 1, 2]
    assert [s for s, _, _ in got[tb.rank_tag(1)]] == [0, 1, 2]
