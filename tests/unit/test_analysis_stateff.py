"""Statistical efficiency: steps and samples to target, the decomposition of the
time-to-target speedup, and its projection (``analysis.reduce.progress_at``,
``analysis.progress``, ``analysis.tables.hours_to_target``, ``analysis.stateff``).

Logs are hand-built (``tests/analysis_fixtures/runs.py``) with batch sizes, losses and
restarts chosen so that every sample count below follows by hand.
"""

import json
import math
import os

import numpy as np
import pandas as pd
import pytest

from analysis import outline, progress, reduce, stateff
from analysis.document import Role
from analysis.report import ReportOptions, build, write
from distseg.core import rundir
from tests.analysis_fixtures.runs import (
    Launch,
    RunSpec,
    end_record,
    epoch_record,
    note_lines,
    one_row,
    run_record,
    step,
    write_log,
    write_run,
)

H = 3600.0


# ----------------------------------------------------------------------------- the trajectory


def _killed_and_resumed():
    # 4 steps an epoch. Launch 0 logs epochs 0 and 1 and step 0 of epoch 2 (global steps
    # 0..8) and is killed; launch 1 resumes from the checkpoint at the end of epoch 1
    # and logs epochs 2 and 3 (8..15). Batches: 2 samples, 1 at the last step of each
    # epoch (a remainder batch), so a double count would show.
    seg = np.array([0] * 9 + [1] * 8)
    gs = np.array(list(range(9)) + list(range(8, 16)))
    return seg, gs // 4, gs % 4, np.where(gs % 4 == 3, 1.0, 2.0)


def test_sample_runs_encode_a_ranks_batches_in_a_few_rows():
    runs = reduce.sample_runs(*_killed_and_resumed())
    assert runs.values.tolist() == [[0, 0, 0, 2, 2.0], [0, 0, 3, 3, 1.0], [0, 1, 0, 2, 2.0],
                                    [0, 1, 3, 3, 1.0], [0, 2, 0, 0, 2.0], [1, 2, 0, 2, 2.0],
                                    [1, 2, 3, 3, 1.0], [1, 3, 0, 2, 2.0], [1, 3, 3, 3, 1.0]]
    # a step logged twice in a launch counts its later record; no step: left out
    again = reduce.sample_runs(np.zeros(4), np.zeros(4), np.array([0, 1, 1, -1]),
                               np.array([5.0, 4.0, 3.0, 9.0]))
    assert again.values.tolist() == [[0, 0, 0, 0, 5.0], [0, 0, 1, 1, 3.0]]


def _path(rank_runs, sizes, spe=4, keys=("a", "b")):
    total = progress.SampleSum()
    for runs in rank_runs:
        total.add(keys, [spe] * len(keys), runs)
    return total.trajectory(keys, sizes)


def test_the_trajectory_counts_each_step_once_in_its_latest_launch():
    # Two ranks with the same batches, added one by one: twice the samples per step.
    path = _path([reduce.sample_runs(*_killed_and_resumed())] * 2, [2, 2])
    # At step 0 of epoch 2 in launch 0 (before the kill): 9 steps, 2 x (7 x 2 + 2) = 32.
    assert path.at(0, 2, 0) == progress.Trained(9, 32.0)
    # At step 1 of epoch 2 in launch 1: epochs 0, 1 of launch 0 and steps 0, 1 of epoch
    # 2 of launch 1 (launch 0's step 0 undone): 10 steps, 2 x (8 x 2 + 2) = 36.
    assert path.at(1, 2, 1) == progress.Trained(10, 36.0)
    # At the end: 16 steps, 2 x (12 x 2 + 4) = 56, not 56 + 2 x 2 for the redone step.
    assert path.last() == progress.Trained(16, 56.0) and path.epoch_end(1, 2).steps == 12
    assert path.at(0, 9, 0) == progress.Trained(9, 32.0)  # beyond its last: up to it
    assert path.at(1, -1, 0) == progress.Trained() and not path.scaled
    # One rank's log only, of a 2-rank run: its samples stand for both (x 2).
    alone = _path([reduce.sample_runs(*_killed_and_resumed())], [2, 2])
    assert alone.last() == progress.Trained(16, 56.0) and alone.scaled == [0, 1]
    # A step no rank logged counts as the mean of the others (said by made_up).
    gap = _path([reduce.sample_runs(np.zeros(3), np.zeros(3), np.array([0, 1, 3]),
                                    np.array([2.0, 2.0, 5.0]))], [1], keys=("a",))
    assert gap.at(0, 0, 3) == progress.Trained(4, 12.0, made_up=1)


def test_launches_of_another_size_line_up_at_the_epoch_they_resume_from():
    # 2 ranks (4 steps an epoch of 4 samples) for epochs 0 and 1 and 2 steps of epoch 2,
    # then 1 rank (8 steps an epoch of 2 samples) from the start of epoch 2: epoch 2 is
    # 8 small steps, not 2 big ones and then 8.
    big = reduce.sample_runs(np.zeros(10), np.arange(10) // 4, np.arange(10) % 4,
                             np.full(10, 2.0))
    small = reduce.sample_runs(np.ones(16), 2 + np.arange(16) // 8, np.arange(16) % 8,
                               np.full(16, 2.0))
    total = progress.SampleSum()
    for rank_runs in ([big, None], [big, None], [None, small]):
        for segment, runs in enumerate(rank_runs):
            if runs is not None:
                total.add(["a", "b"], [4, 8], runs.assign(segment=segment))
    path = total.trajectory(["a", "b"], [2, 1])
    assert path.at(1, 2, 7) == progress.Trained(8 + 8, 32.0 + 16.0)  # end of epoch 2
    assert path.at(0, 2, 1) == progress.Trained(10, 40.0)  # before the size changed
    assert path.last() == progress.Trained(24, 32.0 + 32.0)


# ----------------------------------------------------------------------------- one run


def _resumed_spec(**changes):
    # 2 ranks, 14 samples, batch 2: 4 steps per epoch, each rank's shard of 7 in
    # batches 2, 2, 2, 1, so 4, 4, 4, 2 samples per step (14 per epoch). Killed 3 steps
    # into epoch 2, resumed from the start of epoch 2 (its steps 0..2 redone).
    spec = dict(size=2, epochs=4, train_samples=14, batch_size=2, loss=lambda k: -0.1 * k,
                launches=[Launch(0, 2, killed_after=3), Launch(2, 4)])
    spec.update(changes)
    return RunSpec(**spec)


def test_a_killed_and_resumed_run_counts_samples_along_its_trajectory(tmp_path):
    run = write_run(str(tmp_path / "resumed"), _resumed_spec())
    rep = build([run], ReportOptions(target_loss=(-0.95, -1.15, -5.0),
                                     target_dice=(0.7, 0.95)))
    hours = rep.tables.hours_to_target
    # -0.95 at global step 10 (epoch 2, step 2), crossed before the kill, once:
    # epochs 0 and 1 (2 x 14) + 4 + 4 + 4 = 40 samples in 11 steps.
    before = one_row(hours, target=-0.95)
    assert (before["global_step"], before["steps"], before["samples"]) == (10, 11, 40.0)
    assert before["hours"] == pytest.approx(11 / H)  # step 10 of launch 0 ends at 11 s
    # -1.15 at global step 12 (epoch 3, step 0) of the second launch: epoch 2, whose
    # first 3 steps ran twice, counts once: 3 x 14 + 4 = 46 (a double count reads 58).
    after = one_row(hours, target=-1.15)
    assert (after["global_step"], after["steps"], after["samples"]) == (12, 13, 46.0)
    # Not reached: no number, but what the run trained on in all: 4 x 14 samples.
    never = one_row(hours, target=-5.0)
    assert not never["reached"] and pd.isna(never["steps"]) and math.isnan(never["samples"])
    assert never["samples_lower_bound"] == 56.0
    # Dice (mean over ranks 0.505 + 0.1 epoch) >= 0.7 first at epoch 2: 3 epochs.
    dice = one_row(hours, target=0.7)
    assert (dice["epoch"], dice["steps"], dice["samples"]) == (2, 12, 42.0)
    dice_never = one_row(hours, target=0.95)
    assert not dice_never["reached"] and dice_never["samples_lower_bound"] == 56.0
    assert rep.runs[0].trained.steps == 16 and rep.runs[0].trained.samples == 56.0


def _hand_resumed(run_dir, drop_rank1_step=None):
    """2 ranks, batches of 2 (rank 0) and 1 (rank 1): 3 samples per global step.

    Launch a logs global steps 0..5 (epoch 0: 0..3, epoch 1: 4, 5) and is killed; its
    loss at step 5 is -0.5. Launch b writes a ``resume`` record (from epoch 1, step 0,
    global step 4) and logs 4..7 again, with loss -0.3 at step 5 (not bit-identical
    after a restart) and -0.6 at step 7.
    """
    loss = {0: 0.0, 1: -0.1, 2: -0.2, 3: -0.3, 4: -0.4, 5: -0.5}
    redo = {4: -0.2, 5: -0.3, 6: -0.4, 7: -0.6}
    for rank, batch in ((0, 2), (1, 1)):
        lines = [run_record(rank, 2, start_time=100.0, run_id="a")]
        lines += [step(rank, k // 4, k % 4, k + 1.0, loss=loss[k], samples=batch)
                  for k in range(6)]
        lines.insert(5, epoch_record(rank, 0, 4.5, samples=4 * batch))
        lines += [{"type": "resume", "rank": rank, "time": 300.0, "from_epoch": 1,
                   "from_step": 0, "global_step": 4, "checkpoint": "ckpt/manifest.json",
                   "size_before": 2, "size": 2},
                  run_record(rank, 2, start_time=300.0, run_id="b")]
        lines += [step(rank, 1, k - 4, k - 3.0, loss=redo[k], samples=batch)
                  for k in range(4, 8) if not (rank == 1 and k == drop_rank1_step)]
        lines += [epoch_record(rank, 1, 4.5, samples=4 * batch), end_record(rank, 5.0)]
        write_log(run_dir, rank, lines)
    return run_dir


def test_resume_records_and_a_target_crossed_before_the_kill(tmp_path):
    run = _hand_resumed(str(tmp_path / "hand"))
    rep = build([run], ReportOptions(target_loss=(-0.45, -0.55)))
    hours = rep.tables.hours_to_target
    # -0.45: first at step 5 of launch a (6 s), before the kill; the redone step 5
    # (-0.3) does not cross again and nothing counts twice: 6 steps x 3 samples.
    first = one_row(hours, target=-0.45)
    assert (first["global_step"], first["steps"], first["samples"]) == (5, 6, 18.0)
    assert first["hours"] == pytest.approx(6 / H)
    # -0.55: at step 7 of launch b: 8 steps (4 and 5 counted once) x 3 = 24, at
    # 6 s (launch a's duration) + 4 s.
    later = one_row(hours, target=-0.55)
    assert (later["global_step"], later["steps"], later["samples"]) == (7, 8, 24.0)
    assert later["hours"] == pytest.approx(10 / H)
    assert not any("resume" in n and "unknown type" in n for n in note_lines(rep))


def test_lost_records_and_missing_ranks_are_made_up_and_said(tmp_path):
    # Rank 1 lost its record of global step 6 (before the -0.55 crossing at 7): that
    # step counts rank 0's 2 samples x 2 ranks / 1 logged = 4 instead of 3: 25, not 24.
    run = _hand_resumed(str(tmp_path / "lost"), drop_rank1_step=6)
    rep = build([run], ReportOptions(target_loss=(-0.55,)))
    assert one_row(rep.tables.hours_to_target, target=-0.55)["samples"] == 25.0
    assert any("steps of launch(es) 1 logged by fewer ranks than ran them are scaled up"
               in n for n in note_lines(rep))
    # Without rank 1's log: rank 0's 8 x 2 samples stand for both ranks (x 2).
    os.remove(rundir.log_path(run, 1))
    rep = build([run], ReportOptions(target_loss=(-0.55,)))
    assert one_row(rep.tables.hours_to_target, target=-0.55)["samples"] == 32.0
    assert any("launch(es) 0, 1 logged by fewer ranks" in n for n in note_lines(rep))


def test_a_run_that_continues_on_fewer_ranks_counts_each_launchs_own_batches(tmp_path):
    # 2 ranks of batch 2 (4 steps an epoch) log epoch 0 and 2 steps of epoch 1; rank 1's
    # host leaves and rank 0 goes on alone from the end of epoch 0, as distseg-train
    # does: 8 steps an epoch of 2 samples, global steps renumbered (epoch x 8 + step).
    # -0.45 is first met at step 2 of epoch 2: 4 + 8 + 3 = 15 steps (global step 18
    # says 19) and 4 x 4 + 8 x 2 + 3 x 2 = 38 samples (scaling the survivor up to the
    # run's 2 ranks would say 52; adding the undone steps of epoch 1, 46).
    run_dir = str(tmp_path / "elastic")
    for rank in (0, 1):
        lines = [run_record(rank, 2, start_time=100.0, run_id="a")]
        lines += [step(rank, k // 4, k % 4, k + 1.0, loss=-0.01 * k) for k in range(6)]
        if rank == 0:
            lines += [{"type": "resume", "rank": 0, "time": 300.0, "from_epoch": 1,
                       "from_step": 0, "global_step": 8, "checkpoint": "ckpt/manifest.json",
                       "size_before": 2, "size": 1},
                      run_record(0, 1, start_time=300.0, run_id="b", steps_per_epoch=8,
                                 global_batch_size=2)]
            lines += [step(0, 1 + k // 8, k % 8, k + 1.0, global_step=8 + k,
                           loss=-0.5 if k >= 10 else -0.2) for k in range(16)]
            lines += [end_record(0, 17.0)]
        write_log(run_dir, rank, lines)
    rep = build([run_dir], ReportOptions(target_loss=(-0.45, -2.0)))
    hit = one_row(rep.tables.hours_to_target, target=-0.45)
    assert (hit["epoch"], hit["global_step"], hit["steps"], hit["samples"]) == (2, 18, 15, 38.0)
    never = one_row(rep.tables.hours_to_target, target=-2.0)
    assert never["samples_lower_bound"] == 16.0 + 16.0 + 16.0  # epochs 0, 1 and 2
    assert rep.runs[0].trained == progress.Trained(20, 48.0)
    assert not any("scaled up" in n for n in note_lines(rep))


# ----------------------------------------------------------------------------- across runs


@pytest.fixture
def study(tmp_path):
    # 16 samples, batch 2, steps of 1 s: 1 rank takes 8 steps per epoch of 2 samples,
    # 2 ranks 4 of 4, 4 ranks 2 of 8: throughput 2, 4 and 8 samples/s (speedups 2 and 4,
    # throughput efficiency 1). Loss -1 is reached at global step 15, 9 and 5: after
    # 32, 40 and 48 samples (statistical efficiency 0.8 and 2/3) at 16, 10 and 6 s.
    # Loss -1.5 at steps 23 and 14 (48 and 60 samples); 4 ranks stop at step 7.
    runs = []
    for size, reach in ((1, 15), (2, 9), (4, 5)):
        runs.append(write_run(str(tmp_path / f"np{size}"), RunSpec(
            size=size, epochs=4, train_samples=16, batch_size=2,
            loss=lambda k, reach=reach: -k / reach)))
    return runs


def test_statistical_efficiency_and_the_decomposition_by_hand(study):
    rep = build(study, ReportOptions(target_loss=(-1.0, -1.5)))
    eff = rep.tables.statistical_efficiency
    one = eff[eff["target"] == -1.0].set_index("run")
    assert list(one["samples"]) == [32.0, 40.0, 48.0] and list(one["steps"]) == [16, 10, 6]
    assert list(one["base"]) == ["np1"] * 3
    assert one["statistical_efficiency"].tolist() == pytest.approx([1.0, 0.8, 2 / 3])
    assert one["time_speedup"].tolist() == pytest.approx([1.0, 1.6, 16 / 6])
    assert one["throughput_speedup"].tolist() == pytest.approx([1.0, 2.0, 4.0])
    assert one["other_factor"].tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert list(one["limited_by"]) == ["", "statistical efficiency", "statistical efficiency"]
    assert one.loc["np2", "summary"] == (
        "np2 (2 ranks, 1 node) reaches train_loss <= -1 1.60x sooner than np1: throughput "
        "2.00x x statistical efficiency 0.8 (x 1.00 other); statistical efficiency limits "
        "(throughput efficiency 1.00).")
    assert one.loc["np1", "summary"] == ("np1 (1 rank, 1 node) is the base: reaches "
                                         "train_loss <= -1 in 16.0 s after 32 samples "
                                         "(16 steps).")
    # np4 never reaches -1.5: its 8 steps x 8 samples bound it; no made-up number.
    miss = one_row(eff, run="np4", target=-1.5)
    assert not miss["reached"] and math.isnan(miss["statistical_efficiency"])
    assert (miss["samples_text"], miss["statistical_efficiency_text"]) == ("> 64", "< 0.75")
    assert miss["summary"] == ("np4 (4 ranks, 1 node) does not reach train_loss <= -1.5 "
                               "(> 64 samples; np1: 48): statistical efficiency < 0.75.")
    assert one_row(eff, run="np2", target=-1.5)["statistical_efficiency"] == pytest.approx(0.8)


def test_bounds_and_the_limiting_factor():
    base = pd.Series({"run": "a", "reached": False, "samples": math.nan,
                      "samples_lower_bound": 100.0})
    row = pd.Series({"run": "b", "reached": True, "samples": 50.0,
                     "samples_lower_bound": math.nan})
    # The base did not reach it after 100 samples, b did after 50: more than 2.
    assert stateff.measured_efficiency(row, base).text() == "> 2"
    assert stateff.measured_efficiency(base, base).text() == "n/a"  # neither reached it
    assert stateff.limiting(0.9, 0.8) == "statistical efficiency"
    assert stateff.limiting(0.7, 0.8) == "throughput"
    assert stateff.limiting(1.2, 1.0) == "neither" and stateff.limiting(math.nan, 0.5) == ""


def test_projection_fits_a_trend_only_with_two_rank_counts_beyond_the_base(study):
    # 4 ranks on one host: 4 ranks per node, so 2 and 16 nodes are 8 and 64 ranks.
    rep = build(study, ReportOptions(target_loss=(-1.0, -1.5), project_nodes=(2, 16)))
    proj = rep.projection.targets
    # -1: measured at 2 and 4 ranks besides the base. Least squares of 1, 0.8, 2/3 on
    # log2 ranks 0, 1, 2: slope -1/6, intercept 89/90; at 8 ranks 89/90 - 3/6 = 44/90,
    # at 64 ranks 89/90 - 1 < 0: nothing projected.
    at8 = one_row(proj, target=-1.0, ranks=8)
    assert at8["statistical_efficiency"] == pytest.approx(44 / 90)
    assert at8["statistical_efficiency_basis"] == "trend"
    assert at8["time_speedup"] == pytest.approx(at8["throughput_speedup"] * 44 / 90)
    assert at8["hours"] == pytest.approx(16 / H / at8["time_speedup"])  # np1: 16 s
    at64 = one_row(proj, target=-1.0, ranks=64)
    assert at64["statistical_efficiency_basis"] == "trend <= 0"
    assert math.isnan(at64["hours"])
    # measured rows keep the measurement beside the model's product
    np4 = one_row(proj, target=-1.0, run="np4")
    assert np4["measured_hours"] == pytest.approx(6 / H)
    assert np4["statistical_efficiency"] == pytest.approx(2 / 3)
    # -1.5: only 2 ranks reached it besides the base: assumed 1, flagged as a warning.
    flat = one_row(proj, target=-1.5, ranks=8)
    assert (flat["statistical_efficiency"], flat["statistical_efficiency_basis"]) == (
        1.0, "assumed 1")
    assert flat["time_speedup"] == flat["throughput_speedup"]
    warnings = [n.message for n in rep.notes if n.level == "warning"]
    assert [w for w in warnings if "ASSUMED 1" in w] == [
        "train_loss <= -1.5: statistical efficiency ASSUMED 1 (measured at 1 rank count(s) "
        "besides the base's; a trend needs 2): projected times count throughput only and "
        "are optimistic wherever it falls."]
    assert any("statistical efficiency = 0.989 - 0.167 x log2(ranks)" in line
               for line in rep.projection.target_assumptions)


def test_every_output_holds_statistical_efficiency(study, tmp_path):
    rep = build(study, ReportOptions(target_loss=(-1.0,), project_nodes=(2,)))
    out = str(tmp_path / "out")
    files = write(rep, out)
    csv = pd.read_csv(files["statistical_efficiency"])
    assert list(csv.columns) == stateff.COLUMNS
    assert csv["statistical_efficiency"].tolist() == pytest.approx([1.0, 0.8, 2 / 3])
    hours = pd.read_csv(files["hours_to_target"])
    # the old columns first, unchanged; the new ones added
    assert list(hours.columns)[:10] == ["run", "ranks", "nodes", "metric", "target",
                                        "reached", "hours", "epoch", "global_step", "result"]
    assert list(hours["samples"]) == [32.0, 40.0, 48.0]
    assert len(pd.read_csv(files["projection_to_target"])) == 4  # 3 measured, 1 projected
    with open(files["statistical_efficiency_png"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(files["report_json"]) as f:
        doc = json.load(f)
    assert [r["statistical_efficiency_text"] for r in doc["tables"]["statistical_efficiency"]] \
        == ["1", "0.8", "0.667"]
    assert len(doc["projection"]["to_target"]["table"]) == 4
    md = open(files["report_md"]).read()
    assert "## Time to target, decomposed" in md and "![Statistical efficiency" in md
    assert "statistical efficiency 0.8 (x 1.00 other)" in md
    html = open(files["report_html"]).read()
    assert html.count('src="data:image/png;base64,') == 3
    assert "Projection to target (model, not measured)" in html
    titles = [(s.title, s.role) for s in rep.document().sections]
    first = titles.index(("Time to target", Role.TABLE))
    assert titles[first:first + 4] == [("Time to target", Role.TABLE),
                           ("Time to target, decomposed", Role.LIST),
                           ("Statistical efficiency", Role.TABLE),
                           ("Statistical efficiency and samples to target versus ranks",
                            Role.FIGURE)]
    # Without targets: no section, no figure (an old one is removed).
    rep = build(study)
    write(rep, out)
    assert not os.path.exists(os.path.join(out, outline.EFFICIENCY_FIGURE))
    assert not os.path.exists(os.path.join(out, "projection_to_target.csv"))
    assert "Statistical efficiency" not in [s.title for s in rep.document().sections]
