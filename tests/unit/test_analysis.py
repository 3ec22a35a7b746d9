"""``analysis``: the report's numbers on hand-built logs whose answers are known.

The run directories come from ``tests/analysis_fixtures/runs.py``, which writes logs in
the format of ``distseg.training.runlog`` with exact times, losses, Dice values and shards, so
every expected number below follows from the fixture by hand.
"""

import json
import math
import os
import subprocess

import h5py
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from analysis import logfile, tables
from analysis.cli import report as report_cmd
from analysis.report import CSV_FILES, ReportOptions, build, write
from analysis.stepmodel import Fabric, allreduce_seconds
from distseg.core import rundir, schema
from tests.analysis_fixtures.runs import Launch, RunSpec, note_lines, one_row, shards, write_run

from support import BIN, command_env

H = 3600.0


def _log(run_dir, rank):
    return rundir.log_path(run_dir, rank)


def _rewrite(path, edit):
    """Applies ``edit(list of lines) -> list of lines`` to a log file."""
    with open(path) as f:
        lines = f.read().splitlines(keepends=True)
    with open(path, "w") as f:
        f.writelines(edit(lines))


# ----------------------------------------------------------------------------- targets


def _linear_loss(k):
    # -0.75 exactly at global step 209, which ends at (209 + 1) x 60 s = 3.5 h.
    return -0.5 - 0.25 * k / 209


@pytest.fixture
def slow_run(tmp_path):
    # 2 ranks, 16 samples, batch 2: 4 steps per epoch of 60 s; 60 epochs = 240 steps.
    return write_run(str(tmp_path / "np2"), RunSpec(size=2, epochs=60, step_time=60.0,
                                                    loss=_linear_loss))


def test_loss_crosses_target_at_exactly_3_5_hours(slow_run):
    rep = build([slow_run], ReportOptions(target_loss=(-0.75, -0.76, -0.9)))
    hours = rep.tables.hours_to_target
    first = one_row(hours, target=-0.75)
    assert first["reached"] and first["hours"] == pytest.approx(3.5, abs=1e-12)
    assert first["global_step"] == 209 and first["epoch"] == 209 // 4
    assert first["result"] == "3.500 h"
    # -0.76 first at k = 218 (0.26 x 209 / 0.25 = 217.4): (218 + 1) x 60 s.
    assert one_row(hours, target=-0.76)["hours"] == pytest.approx(219 * 60 / H)
    never = one_row(hours, target=-0.9)
    assert not never["reached"] and math.isnan(never["hours"])
    assert never["result"] == "not reached"


def test_smoothing_delays_the_crossing_by_the_trailing_window(slow_run):
    # The trailing mean of 3 steps of a linear curve is its value one step earlier.
    rep = build([slow_run], ReportOptions(target_loss=(-0.75,), smooth=3))
    row = one_row(rep.tables.hours_to_target, target=-0.75)
    assert row["global_step"] == 210 and row["hours"] == pytest.approx(211 * 60 / H)
    assert "smoothed 3" in row["metric"]
    curve = rep.tables.loss_vs_time
    train = curve[curve["series"] == "train"]
    assert len(train) == 240
    k = train["global_step"].to_numpy()
    expected = np.where(k >= 2, _linear_loss(k - 1), np.nan)
    np.testing.assert_allclose(train["loss_smoothed"].to_numpy()[2:], expected[2:])
    np.testing.assert_allclose(train["hours"].to_numpy(), (k + 1) * 60 / H)


def test_dice_target_is_reached_at_the_first_epoch_whose_global_dice_is_high_enough(tmp_path):
    # Global Dice of an epoch: mean over ranks of 0.5 + 0.1 epoch + 0.01 rank, i.e.
    # 0.505 + 0.1 epoch; 0.8 is first reached at epoch 3, which ends at 4 x 4 x 1 s.
    run = write_run(str(tmp_path / "np2"), RunSpec(epochs=5))
    rep = build([run], ReportOptions(target_dice=(0.8, 0.99)))
    hours = rep.tables.hours_to_target
    hit = one_row(hours, target=0.8)
    assert hit["reached"] and hit["epoch"] == 3 and hit["hours"] == pytest.approx(16 / H)
    assert hit["metric"] == "val_dice (mean liver+lesion)"
    assert not one_row(hours, target=0.99)["reached"]


# ----------------------------------------------------------------------------- scaling


@pytest.fixture
def study(tmp_path):
    """1, 2 and 4 ranks; steps get slower with more ranks; the first epoch is slower."""
    common = dict(epochs=4, train_samples=16, batch_size=2, val_time=0.5, warmup_step_time=3.0)
    return [
        write_run(str(tmp_path / "np1"), RunSpec(size=1, step_time=1.0, **common)),
        write_run(str(tmp_path / "np2"), RunSpec(size=2, step_time=1.1, **common)),
        write_run(str(tmp_path / "np4"), RunSpec(size=4, step_time=1.25,
                                                 hosts=["a", "a", "b", "b"], **common)),
    ]


def test_time_per_epoch_uses_training_time_and_skips_the_warmup_epoch(study):
    rep = build(study)
    tpe = rep.tables.time_per_epoch
    # steps per epoch: 8, 4, 2 (16 samples, batch 2 per rank)
    for run, ranks, nodes, steps, step_s in (("np1", 1, 1, 8, 1.0), ("np2", 2, 1, 4, 1.1),
                                             ("np4", 4, 2, 2, 1.25)):
        row = one_row(tpe, run=run)
        assert (row["ranks"], row["nodes"], row["epochs"], row["steady_epochs"]) == (
            ranks, nodes, 4, 3)
        assert row["warmup_train_s"] == pytest.approx(steps * 3.0)
        for col in ("median_train_s", "mean_train_s", "min_train_s", "max_train_s"):
            assert row[col] == pytest.approx(steps * step_s)
        assert row["warmup_epoch_s"] == pytest.approx(steps * 3.0 + 0.5)
        assert row["median_epoch_s"] == pytest.approx(steps * step_s + 0.5)
        assert row["samples_per_epoch"] == 16
        # global samples / slowest rank's train_time, validation excluded
        assert row["throughput_samples_s"] == pytest.approx(16 / (steps * step_s))
        assert row["throughput_per_rank"] == pytest.approx(16 / (steps * step_s) / ranks)
        assert row["time"] == tables.TRAIN_TIME


def test_what_an_epoch_pays_outside_training_is_its_share_of_the_wall_clock(tmp_path):
    # 4 steps of 1 s, 0.5 s of validation, 0.3 s of epoch end after the record: the
    # wall clock from one epoch's end to the next is 4.8 s, of which 0.8 s outside.
    run = write_run(str(tmp_path / "np2"), RunSpec(size=2, val_time=0.5, end_time=0.3))
    row = one_row(build([run]).tables.time_per_epoch, run="np2")
    assert row["median_train_s"] == pytest.approx(4.0)
    assert row["median_wall_epoch_s"] == pytest.approx(4.8)
    assert row["outside_training_pct"] == pytest.approx(100 * 0.8 / 4.8)
    # One epoch after warm-up: no epoch follows another, nothing to say.
    short = write_run(str(tmp_path / "short"), RunSpec(size=1, epochs=1))
    assert math.isnan(one_row(build([short]).tables.time_per_epoch, run="short")["outside_training_pct"])


def test_scaling_against_the_smallest_run(study):
    sc = build(study).tables.scaling
    np2, np4 = one_row(sc, run="np2"), one_row(sc, run="np4")
    assert set(sc["base"]) == {"np1"}
    assert np2["speedup"] == pytest.approx(8.0 / 4.4)
    assert np2["efficiency"] == pytest.approx(8.0 / 4.4 / 2)
    assert np4["normalised_time"] == pytest.approx(2.5 / 8.0)
    assert np4["efficiency"] == pytest.approx(8.0 / 2.5 / 4)
    assert np4["throughput_speedup"] == pytest.approx(6.4 / 2.0)
    assert np4["throughput_efficiency"] == pytest.approx(0.8)
    assert one_row(sc, run="np1")["efficiency"] == 1.0


def test_epoch_time_is_the_fallback_when_train_time_is_not_logged(tmp_path):
    run = write_run(str(tmp_path / "old"), RunSpec(size=1, val_time=2.0))
    _rewrite(_log(run, 0), lambda lines: [
        json.dumps({k: v for k, v in json.loads(l).items() if k != "train_time"}) + "\n"
        for l in lines])
    row = one_row(build([run]).tables.time_per_epoch, run="old")
    assert row["median_train_s"] == pytest.approx(8 + 2.0)
    assert row["time"] == tables.EPOCH_TIME_FALLBACK


def test_rank_balance_names_the_slowest_rank(tmp_path):
    run = write_run(str(tmp_path / "np2"), RunSpec(size=2, step_time=[1.0, 1.5],
                                                   data_wait=[0.1, 0.3]))
    rep = build([run])
    bal = rep.tables.rank_balance
    r0, r1 = one_row(bal, rank=0), one_row(bal, rank=1)
    assert r0["mean_step_s"] == pytest.approx(1.0) and r1["mean_step_s"] == pytest.approx(1.5)
    assert r1["mean_data_wait_s"] == pytest.approx(0.3)
    assert r1["data_wait_share"] == pytest.approx(0.2)
    assert r0["steps"] == 8  # 3 epochs x 4 steps, the warm-up epoch left out
    assert list(bal["slowest"]) == [False, True] and set(bal["slowest_rank"]) == {1}
    assert list(bal["imbalance_ratio"]) == pytest.approx([1.5 / 1.25] * 2)
    summary = one_row(rep.tables.rank_balance_summary, run="np2")
    assert summary["slowest_rank"] == 1 and summary["most_waiting_rank"] == 1


def test_val_dice_spread_over_ranks(tmp_path):
    run = write_run(str(tmp_path / "np4"), RunSpec(size=4, epochs=2))
    spread = build([run]).tables.val_dice_spread
    row = one_row(spread, epoch=1, **{"class": "liver"})
    # 0.5 + 0.1 x 1 + 0.01 x rank for ranks 0..3
    assert (row["ranks"], row["min"], row["max"]) == (4, pytest.approx(0.6), pytest.approx(0.63))
    assert row["median"] == pytest.approx(0.615) and row["global"] == pytest.approx(0.615)
    assert set(spread["class"]) == {"background", "liver", "lesion", "mean_foreground"}


# ----------------------------------------------------------------------------- coverage


def _h5_split(path, n_train, n_val, train_first=True):
    split = np.r_[np.zeros(n_train), np.ones(n_val)] if train_first else np.r_[
        np.ones(n_val), np.zeros(n_train)]
    with h5py.File(path, "w") as f:
        f["split"] = split.astype(np.uint8)
    return str(path)


def test_coverage_true_against_the_data_file(tmp_path):
    data = _h5_split(tmp_path / "d.h5", 16, 4)
    run = write_run(str(tmp_path / "np2"), RunSpec(size=2, epochs=1, data_path=data))
    cov = build([run]).tables.coverage
    row = one_row(cov, epoch=0)
    assert row["covered"] == True and row["digest_matches"] == True  # noqa: E712
    assert row["reference"] == "train split of the data file"
    assert row["reference_digest"] == schema.sample_digest(range(16))


def test_coverage_false_when_the_data_file_split_differs(tmp_path):
    # Same counts, but the train ids in the file are 4..19, not the 0..15 trained on.
    data = _h5_split(tmp_path / "d.h5", 16, 4, train_first=False)
    run = write_run(str(tmp_path / "np2"), RunSpec(size=2, epochs=2, data_path=data))
    cov = build([run]).tables.coverage
    assert list(cov["covered"]) == [False, False]
    assert cov["status"].str.startswith("NOT covered: combined digest").all()


def test_coverage_detects_an_overlap_from_the_digests_alone(tmp_path):
    spec = RunSpec(size=2, epochs=3)
    run = write_run(str(tmp_path / "np2"), spec)
    # Epoch 1: rank 1 saw one of rank 0's samples instead of one of its own: counts
    # still add up, but one sample is seen twice and one never.
    own, other = np.concatenate(shards(spec, 1)[1]), np.concatenate(shards(spec, 1)[0])
    bad = schema.sample_digest(list(own[1:]) + [int(other[0])])

    def edit(lines):
        out = []
        for line in lines:
            rec = json.loads(line)
            if rec["type"] == "epoch" and rec["epoch"] == 1:
                rec["sample_digest"] = bad
            out.append(json.dumps(rec) + "\n")
        return out
    _rewrite(_log(run, 1), edit)
    rep = build([run])
    cov = rep.tables.coverage
    assert list(cov["covered"]) == [True, False, True]
    assert list(cov["samples"]) == [16, 16, 16]
    assert "2 of 3 complete epochs" in cov["reference"].iloc[0]
    summary = one_row(rep.tables.coverage_summary, run="np2")
    assert (summary["covered"], summary["not_covered"]) == (2, 1)
    assert summary["first_problem"].startswith("epoch 1: NOT covered")


def test_coverage_count_mismatch_and_single_epoch_cross_run(tmp_path):
    # Two one-epoch runs of the same data: each alone proves nothing, together they agree.
    a = write_run(str(tmp_path / "np1"), RunSpec(size=1, epochs=1))
    b = write_run(str(tmp_path / "np2"), RunSpec(size=2, epochs=1))
    cov = build([a, b]).tables.coverage
    assert list(cov["covered"]) == [True, True]
    alone = build([a]).tables.coverage
    assert alone["covered"].isna().all()
    assert alone["status"].iloc[0].startswith("count right, digest not checked")

    def drop_one(lines):
        out = []
        for line in lines:
            rec = json.loads(line)
            if rec["type"] == "epoch":
                rec["samples"] -= 1
            out.append(json.dumps(rec) + "\n")
        return out
    _rewrite(_log(b, 0), drop_one)
    row = build([b]).tables.coverage.iloc[0]
    assert row["covered"] == False and "15 samples seen, 16 expected" in row["status"]  # noqa: E712


# ----------------------------------------------------------------------------- edge cases


def test_killed_run_truncated_last_line(tmp_path):
    run = write_run(str(tmp_path / "killed"), RunSpec(
        size=2, epochs=3, launches=[Launch(0, 2, killed_after=3)]))
    rep = build([run], ReportOptions(target_loss=(-5.0,)))
    lines = note_lines(rep)
    assert sum("truncated last line" in n for n in lines) == 2, lines
    tpe = one_row(rep.tables.time_per_epoch, run="killed")
    assert tpe["epochs"] == 2 and tpe["status"].startswith("no end record")
    # the 3 steps of the unfinished epoch count in the curve and the balance
    train = rep.tables.loss_vs_time.query("series == 'train'")
    assert len(train) == 11
    assert one_row(rep.tables.hours_to_target, target=-5.0)["result"] == (
        "not reached (run not finished)")


def test_missing_rank_log(tmp_path):
    run = write_run(str(tmp_path / "np4"), RunSpec(size=4, epochs=3))
    os.remove(_log(run, 2))
    rep = build([run])
    assert any("log of rank(s) 2 missing (1 of 4)" in n for n in note_lines(rep, "skipped"))
    tpe = one_row(rep.tables.time_per_epoch, run="np4")
    assert tpe["ranks"] == 4 and tpe["samples_per_epoch"] == 16  # 3 ranks' 12, scaled up
    cov = rep.tables.coverage
    assert cov["covered"].isna().all() and cov["status"].str.contains("3 of 4 ranks").all()
    assert sorted(rep.tables.rank_balance["rank"]) == [0, 1, 3]


def test_run_still_in_progress(tmp_path):
    # A live run: complete lines, no end record yet, an epoch half done.
    run = write_run(str(tmp_path / "live"), RunSpec(size=2, epochs=3))
    _rewrite(_log(run, 0), lambda lines: lines[:-4])  # drop the end record, epoch 2's record
    _rewrite(_log(run, 1), lambda lines: lines[:-4])  # and epoch 2's last 2 steps
    rep = build([run])
    assert not rep.runs[0].finished
    assert rep.runs[0].status == "no end record (still running, or killed)"
    assert one_row(rep.tables.time_per_epoch, run="live")["epochs"] == 2
    assert not note_lines(rep, "skipped")


def test_resumed_run_continues_its_logs(tmp_path):
    # Killed 3 steps into epoch 2 (at t = 11 s), resumed from epoch 2 in a new launch.
    spec = RunSpec(size=2, epochs=4, launches=[Launch(0, 2, killed_after=3), Launch(2, 4)],
                   loss=lambda k: -0.1 * k)
    run = write_run(str(tmp_path / "resumed"), spec)
    rep = build([run], ReportOptions(target_loss=(-1.15,)))
    data = rep.runs[0]
    assert len(data.segments) == 2 and data.finished
    assert list(data.segments["duration_s"]) == [11.0, 8.0]
    assert sorted(data.epochs.query("rank == 0")["epoch"]) == [0, 1, 2, 3]
    lines = note_lines(rep)
    assert any("resumed run: 2 launches" in n for n in lines)
    assert sum("truncated record followed by another" in n for n in lines) == 2
    # loss -1.15 is first reached at global step 12: epoch 3's first step, the 5th step
    # of the second launch, so 11 s + 5 s of wall-clock time.
    row = one_row(rep.tables.hours_to_target, target=-1.15)
    assert row["global_step"] == 12 and row["hours"] == pytest.approx(16 / H)
    tpe = one_row(rep.tables.time_per_epoch, run="resumed")
    # epochs 0 and 2 each open a launch: both are warm-up
    assert (tpe["epochs"], tpe["steady_epochs"]) == (4, 2)


def test_unknown_fields_and_records_are_ignored_with_a_note(tmp_path):
    plain = write_run(str(tmp_path / "plain"), RunSpec(size=2))
    extra = write_run(str(tmp_path / "extra"), RunSpec(
        size=2, extra_step_fields={"gpu_mem": 123, "io": {"reads": 4}},
        extra_epoch_fields={"power_w": 250.0}))
    with open(_log(extra, 0), "a") as f:
        f.write(json.dumps({"type": "profile", "rank": 0, "time": 1.0}) + "\n")
    rep = build([plain, extra])
    lines = note_lines(rep, "skipped")
    assert any("step.gpu_mem (2 of 2 logs)" in n and "step.io" in n and "epoch.power_w" in n
               for n in lines), lines
    assert any("unknown type 'profile'" in n for n in note_lines(rep))
    tpe = rep.tables.time_per_epoch.set_index("run")
    cols = ["median_train_s", "throughput_samples_s", "epochs"]
    pd.testing.assert_series_equal(tpe.loc["plain", cols], tpe.loc["extra", cols],
                                   check_names=False)


def test_corrupt_line_in_the_middle_is_skipped(tmp_path):
    run = write_run(str(tmp_path / "np1"), RunSpec(size=1, epochs=2))
    _rewrite(_log(run, 0), lambda lines: lines[:3] + ['{"type":"step","rank":0,"ep\n']
             + lines[3:])
    rep = build([run])
    assert any("1 line(s) that are not log records" in n for n in note_lines(rep, "skipped"))
    assert len(rep.tables.loss_vs_time.query("series == 'train'")) == 16


def test_config_mismatch_is_flagged(tmp_path):
    a = write_run(str(tmp_path / "a"), RunSpec(size=1, seed=0))
    b = write_run(str(tmp_path / "b"), RunSpec(size=2, seed=1, image_size=64))
    rep = build([a, b])
    warnings = note_lines(rep, "warning")
    assert any("differ in global seed: 0 vs 1" in n for n in warnings), warnings
    assert any("differ in model" in n and "image_size 32 vs 64" in n for n in warnings)
    same = build([a, write_run(str(tmp_path / "c"), RunSpec(size=2))])
    assert not note_lines(same, "warning")


def test_empty_log_and_log_without_run_record(tmp_path):
    run = write_run(str(tmp_path / "np2"), RunSpec(size=2))
    open(_log(run, 1), "w").close()
    rep = build([run])
    assert one_row(rep.tables.time_per_epoch, run="np2")["epochs"] == 3
    os.makedirs(rundir.log_dir(str(tmp_path / "bare")))
    with open(rundir.log_path(str(tmp_path / "bare"), 0), "w") as f:
        f.write('{"type":"step","rank":0,"t":1}\n')
    rep = build([str(tmp_path / "bare")])
    assert any("no run record" in n for n in note_lines(rep))
    write(rep, str(tmp_path / "out"))  # renders with nothing to show


# ----------------------------------------------------------------------------- projection


def test_projection_matches_a_hand_computation(tmp_path):
    common = dict(epochs=3, train_samples=64, batch_size=2, params=1_000_000)
    runs = [write_run(str(tmp_path / "np1"), RunSpec(size=1, step_time=1.0, **common)),
            write_run(str(tmp_path / "np2"), RunSpec(size=2, step_time=1.1, **common))]
    rep = build(runs, ReportOptions(project_nodes=(2, 8, 64)))
    proj = rep.projection.table
    g, bw, lat = 4e6, 100e9 / 8, 2e-6           # 1e6 float32 params, 100 Gb/s, 2 us
    a2 = 2 * 1 / 2 * g / bw + lat * 2 * 1       # 3.24e-4 s
    assert allreduce_seconds(2, g, Fabric()) == pytest.approx(a2)
    compute = ((1.0 - 0) + (1.1 - a2)) / 2      # measured step times 32/32 and 17.6/16
    assert rep.projection.compute_s == pytest.approx(compute)
    base = 32 * compute                         # the model's epoch at 1 rank
    # 2 ranks per node (as measured in np2); 128 ranks cannot share 64 samples (below)
    for nodes, ranks, steps in ((2, 4, 8), (8, 16, 2)):
        row = one_row(proj, kind="projection", nodes=nodes)
        comm = 2 * (ranks - 1) / ranks * g / bw + lat * 2 * (ranks - 1)
        assert row["ranks"] == ranks and row["steps_per_epoch"] == steps
        assert row["allreduce_s"] == pytest.approx(comm)
        assert row["epoch_s"] == pytest.approx(steps * (compute + comm))
        assert row["efficiency"] == pytest.approx(base / (steps * (compute + comm) * ranks))
    assert "infeasible" in one_row(proj, kind="projection", nodes=64)["note"]
    # Both runs ran 2 per rank: the compute line stays at its one measured batch, and
    # every count runs that batch (no assumption enters).
    assert set(proj["per_rank_batch"]) == {2}
    assert "every projected count runs it" in rep.projection.assumptions[-2]
    # Per node count: the prediction beside the measurement (np2 is the 1-node count).
    per_node = rep.projection.nodes
    np2 = one_row(per_node, run="np2")
    assert (np2["kind"], np2["predicted_per_rank_batch"], np2["measured_per_rank_batch"]) == (
        "measured", 2, 2)
    assert np2["predicted_step_s"] == pytest.approx(compute + a2)
    assert np2["measured_step_s"] == pytest.approx(1.1)
    assert np2["predicted_throughput"] == pytest.approx(64 / (16 * (compute + a2)))
    assert np2["measured_throughput"] == pytest.approx(64 / 17.6)
    assert np2["predicted_lr"] == pytest.approx(0.005 * 2)  # linear lr scaling, 2 ranks
    assert list(per_node["run"]) == ["np1", "np2", "projected 2 nodes", "projected 8 nodes",
                                     "projected 64 nodes"]
    assert "infeasible" in one_row(per_node, nodes=64)["note"]
    measured = one_row(proj, kind="measured", run="np2")
    assert measured["epoch_s"] == pytest.approx(17.6)
    assert measured["residual_s"] == pytest.approx(17.6 - 16 * (compute + a2))
    assert rep.projection.assumptions[0].startswith("PROJECTION")

    log_term = build(runs, ReportOptions(project_nodes=(8,), bandwidth_gbps=10, latency_us=50,
                                         latency_term="log")).projection.table
    comm16 = 2 * 15 / 16 * g / (10e9 / 8) + 50e-6 * 2 * math.log2(16)
    assert one_row(log_term, kind="projection")["allreduce_s"] == pytest.approx(comm16)


def test_projection_without_gradient_size_explains_itself(tmp_path):
    run = write_run(str(tmp_path / "np1"), RunSpec(size=1, params=None))
    rep = build([run], ReportOptions(project_nodes=(4,)))
    assert rep.projection is None and "--grad-bytes" in rep.projection_error
    with_bytes = build([run], ReportOptions(project_nodes=(4,), grad_bytes=8e6))
    assert with_bytes.projection is not None


# ----------------------------------------------------------------------------- command line


def test_cli_writes_every_file_and_prints_markdown(study, tmp_path):
    out = tmp_path / "report"
    res = CliRunner().invoke(report_cmd, [*study, "--target-loss", "-0.15", "--target-loss",
                                          "-0.2", "--project-nodes", "4,8", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "## Time per epoch" in res.output and "PROJECTION" in res.output
    for name in [*CSV_FILES.values(), "projection.csv", "projection_to_target.csv",
                 "projection_nodes.csv", "loss_vs_time.png", "val_dice_spread.png",
                 "statistical_efficiency.png",
                 "report.md", "report.html", "report.json"]:
        assert (out / name).stat().st_size > 0, name
    hours = pd.read_csv(out / "hours_to_target.csv")
    assert len(hours) == 6 and sorted(set(hours["target"])) == [-0.2, -0.15]
    tpe = pd.read_csv(out / "time_per_epoch.csv")
    assert list(tpe["run"]) == ["np1", "np2", "np4"] and list(tpe["ranks"]) == [1, 2, 4]
    with open(out / "loss_vs_time.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    html = (out / "report.html").read_text()
    # loss, Dice, statistical efficiency; no predicted hours (no noise scale logged)
    assert html.count("src=\"data:image/png;base64,") == 3
    assert "Prediction per node count (model, not measured)" in html
    assert not (out / "projection_nodes.png").exists()
    md = (out / "report.md").read_text()
    assert "README" not in md and "see docs/report.md" in md  # where the detail lives now


def test_cli_json_format_parses(study, tmp_path):
    res = CliRunner().invoke(report_cmd, [*study, "--format", "json", "--target-dice", "0.6",
                                          "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["schema"] == "distseg-report/1"
    assert [r["run"] for r in doc["tables"]["time_per_epoch"]] == ["np1", "np2", "np4"]
    assert doc["options"]["target_dice"] == [0.6] and doc["projection"] is None
    with open(tmp_path / "r" / "report.json") as f:
        assert json.load(f)["tables"]["scaling"] == doc["tables"]["scaling"]


@pytest.mark.parametrize("make, message", [
    (lambda p: str(p / "nope"), "does not exist"),
    (lambda p: str(p), "has no logs"),
    (lambda p: str((p / "f.txt").write_text("x") and p / "f.txt"), "is not a directory"),
])
def test_cli_bad_run_dir_is_one_line_and_fails(tmp_path, make, message):
    res = CliRunner().invoke(report_cmd, [make(tmp_path), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2  # bad input, as in distseg-train
    assert res.output.count("\n") == 1 and message in res.output, res.output
    assert res.output.startswith("error: run directory ")
    assert not (tmp_path / "r").exists()


def test_installed_command_exits_2_with_one_line_on_a_bad_run_dir(tmp_path):
    proc = subprocess.run([os.path.join(BIN, "distseg-report"), str(tmp_path / "nope"),
                           "--out", str(tmp_path / "r")], capture_output=True, text=True,
                          timeout=120, env=command_env(), cwd=str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr == f"error: run directory {tmp_path / 'nope'} does not exist\n"
    assert proc.stdout == "" and not (tmp_path / "r").exists()


def test_cli_rejects_bad_options(study):
    res = CliRunner().invoke(report_cmd, [study[0], "--smooth", "-1"])
    assert res.exit_code == 2 and "--smooth" in res.output
    res = CliRunner().invoke(report_cmd, [study[0], "--project-nodes", "4,x"])
    assert res.exit_code == 2 and "node counts" in res.output
    # The one node-list parser (distseg.core.schema.parse_node_counts) refuses a repeat.
    res = CliRunner().invoke(report_cmd, [study[0], "--project-nodes", "2,2"])
    assert res.exit_code == 2 and "--project-nodes '2,2': a node count appears twice" in res.output


def test_fast_and_line_by_line_parsers_agree(tmp_path):
    run = write_run(str(tmp_path / "np2"), RunSpec(size=2, epochs=2))
    fast = logfile.read_rank_log(_log(run, 1), 1)
    # A blank line and a differently spaced step record send parts of the file to json.
    _rewrite(_log(run, 1), lambda lines: ["\n"] + lines[:2] + [
        json.dumps(json.loads(lines[2]), indent=None, separators=(", ", ": ")) + "\n"]
        + lines[3:])
    mixed = logfile.read_rank_log(_log(run, 1), 1)
    pd.testing.assert_frame_equal(fast.steps, mixed.steps)
    assert len(fast.epochs) == len(mixed.epochs) == 2 and not mixed.notes


def test_the_runs_table_says_what_each_run_trained_in_and_how_it_was_decided():
    from analysis.tables import precision_text
    trial = {"requested": "auto", "choice": "bfloat16", "speedup": 1.4761}
    assert precision_text({"model": {"precision": "bfloat16"}, "precision": trial}) == \
        "bfloat16 (auto, 1.48x)"
    no_flags = {"requested": "auto", "choice": "float32", "seconds": None}
    assert precision_text({"model": {"precision": "float32"}, "precision": no_flags}) == \
        "float32 (auto, no trial)"
    named = {"requested": "bfloat16", "choice": "bfloat16"}
    assert precision_text({"model": {"precision": "bfloat16"}, "precision": named}) == "bfloat16"
    assert precision_text({"model": {"precision": "float32"}}) == "float32"  # schema 2
    assert precision_text({"model": {}}) is None and precision_text({}) is None
