"""``distseg.core.ranktime``: the throughput and the imbalance ratio of a synchronous
run, on numbers known by hand, and the three places that show them (the report's
tables, the TensorBoard scalars, the benchmarks' run reader) agreeing on one written
run."""

import math
import os
import sys

import pytest

from analysis import logs, tables
from distseg.core import ranktime, tbscalars
from tests.analysis_fixtures.runs import RunSpec, write_run

from support import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from benchlib import runlogs  # noqa: E402


def test_an_epoch_lasts_as_long_as_its_slowest_rank():
    # Two epochs of 2 ranks: 8 + 8 samples in max(3, 4) s, then 8 + 8 in max(2, 2) s.
    epochs = [[(8, 3.0), (8, 4.0)], [(8, 2.0), (8, 2.0)]]
    assert ranktime.epochs_throughput(epochs) == 32 / 6.0
    assert ranktime.epochs_throughput([[(8, None), (8, 4.0)]]) == 16 / 4.0  # a rank untimed
    assert ranktime.epochs_throughput([]) is None
    assert ranktime.epochs_throughput([[(8, None)]]) is None
    assert ranktime.throughput(32, 6.0) == 32 / 6.0 and ranktime.throughput(32, 0.0) is None


def test_the_imbalance_is_the_slowest_over_the_mean():
    assert ranktime.imbalance(1.5, 1.25) == pytest.approx(1.2)
    assert ranktime.imbalance(1.0, 1.0) == 1.0
    assert ranktime.imbalance(0.0, 0.0) is None


def test_the_report_tensorboard_and_the_benchmarks_agree_on_one_run(tmp_path):
    # Rank 1 takes 1.5 s a step, rank 0 1 s: every step lasts 1.5 s; 16 samples, 4 steps.
    spec = RunSpec(size=2, epochs=3, step_time=[1.0, 1.5])
    run_dir = write_run(str(tmp_path / "np2"), spec)
    run = logs.load_run(run_dir)
    report = tables.time_per_epoch([run])["throughput_samples_s"].iloc[0]
    bench = runlogs.run_throughput(run_dir, 2)  # the epochs after the first, as the report
    per_epoch = {}
    for rank, recs in enumerate(runlogs.rank_records(run_dir, 2)):
        for r in recs:
            if r["type"] == "epoch":
                per_epoch.setdefault(r["epoch"], []).append(
                    tbscalars.RankEpoch(rank, math.nan, r["samples"], r["train_time"]))
    board = [{s.tag: s.value for s in tbscalars.balance_scalars(ranks, 0, 0.0)}
             for epoch, ranks in sorted(per_epoch.items()) if epoch > 0]
    assert report == bench == 16 / 6.0
    assert [b["epoch/samples_per_s"] for b in board] == [16 / 6.0] * 2

    balance = tables.rank_balance([run])
    ranks = [tbscalars.RankEpoch(r, t, 8, 6.0) for r, t in enumerate(balance["mean_step_s"])]
    board = {s.tag: s.value for s in tbscalars.balance_scalars(ranks, 0, 0.0)}
    assert list(balance["imbalance_ratio"]) == [1.2] * 2
    assert board["ranks/imbalance_ratio"] == pytest.approx(1.2)
