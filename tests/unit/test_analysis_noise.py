"""The gradient noise scale and the seed groups in the report (``analysis.noise``,
``analysis.seeds``), on synthetic runs (``tests/analysis_fixtures/runs.py``) whose
noise scale, losses and seeds are chosen so that every number follows by hand.

The fixture's training loss is -0.05 x global step; 16 samples, batch 2 per rank: a
1-rank run takes 8 steps an epoch (2 samples each), a 2-rank run 4 (4 samples), a
4-rank run 2 (8 samples). Target -0.3 is reached at global step 6: epoch 0 of the
1-rank run (14 samples), epoch 1 of the 2-rank run (28), epoch 3 of the 4-rank run (56).
"""

import glob
import json
import math
import os

import pytest

from analysis import noise, seeds
from analysis.report import ReportOptions, build, write
from tests.analysis_fixtures.runs import RunSpec, note_lines, one_row, write_run

COMMON = dict(epochs=4, loss=lambda k: -0.05 * k)
NOISE = dict(COMMON, noise_scale=lambda epoch: 4.0 + epoch)  # 4, 5, 6, 7 by epoch


def _runs(tmp_path, **noise_or_not):
    return [write_run(str(tmp_path / "np1"), RunSpec(size=1, **noise_or_not)),
            write_run(str(tmp_path / "np2"), RunSpec(size=2, step_time=1.1, **noise_or_not)),
            write_run(str(tmp_path / "np4"), RunSpec(size=4, step_time=1.25, **noise_or_not))]


# np2's history to the target -0.3 (28 samples, global batch 4): epoch 0 in full (16
# samples at B_noise 4), then 12 samples of epoch 1 (B_noise 5).
NP2_HISTORY = noise.History("np2", samples=(16.0, 12.0), batch=(4.0, 4.0), g2=(1.0, 1.0),
                            tr_sigma=(4.0, 5.0))


def test_the_prediction_sums_mccandlish_over_the_history_by_hand():
    pred = noise.NoisePrediction(NP2_HISTORY, base="np1", base_batch=2.0, base_samples=14.0)
    # Each epoch at its own noise scale: 16 x (4 + 8) / (4 + 4) + 12 x (5 + 8) / (5 + 4).
    assert pred.samples(8.0) == pytest.approx(24.0 + 52.0 / 3.0)  # 41.33
    assert pred.samples(4.0) == pytest.approx(28.0)  # the batch it ran: its samples
    assert pred.samples(2.0) == pytest.approx(28.0)  # below it: no gain counted
    assert pred.predicted_efficiency(8.0) == pytest.approx(14.0 / (124.0 / 3.0))
    assert noise.note(pred, 8.0) == ("predicted from np2's history of the noise scale: 2 "
                                     "epoch(s), 28 samples at global batch 4: 41 samples at "
                                     "global batch 8")
    # One stretch is McCandlish's ratio from one snapshot: 14 x (5 + 8) / (5 + 2) = 26.
    one = noise.History("np2", (14.0,), (2.0,), (1.0,), (5.0,))
    assert one.samples_at(8.0) == pytest.approx(26.0)
    assert noise.NoisePrior(b_noise=5.0, run="np2", epoch=1, base_batch=2.0,
                            base_samples=14.0).samples(8.0) == pytest.approx(26.0)


def test_noise_scale_is_read_near_each_target_and_at_the_end(tmp_path):
    report = build(_runs(tmp_path, **NOISE), ReportOptions(target_loss=(-0.3,)), processes=0)
    table = report.optional["noise_scale"]
    # np1 has the field but estimated nothing (1 rank): not in the table, noted.
    assert set(table["run"]) == {"np2", "np4"}
    end = one_row(table, run="np2", at=noise.END)
    assert (end["epoch"], end["samples"], end["b_simple"]) == (3, 64, 7.0)
    near = one_row(table, run="np2", at="target")
    assert (near["target_epoch"], near["epoch"], near["samples"], near["b_simple"]) == (1, 1, 32, 5.0)
    assert one_row(table, run="np4", at="target")["b_simple"] == 7.0
    assert any("np1: noise scale not estimated (method none" in n for n in note_lines(report))


def test_predicted_and_measured_side_by_side(tmp_path):
    report = build(_runs(tmp_path, **NOISE), ReportOptions(target_loss=(-0.3,)), processes=0)
    pred = report.optional["noise_prediction"]
    assert list(pred["run"]) == ["np2", "np4"]  # every run but the base np1
    row = one_row(pred, run="np4")
    # The base np1 (1 rank) has no noise scale: the history is np2's to its crossing
    # (NP2_HISTORY): B_noise 4 over epoch 0, 5 over the 12 samples of epoch 1.
    assert (row["noise_from"], row["noise_epochs"]) == ("np2", 2)
    assert (row["b_noise_first"], row["b_noise_last"]) == (4.0, 5.0)
    assert (row["base_global_batch"], row["global_batch_size"], row["base_samples"]) == (2, 8, 14)
    assert row["predicted_samples"] == pytest.approx(124 / 3)  # 16 x 12/8 + 12 x 13/9
    assert row["samples"] == 56 and row["measured_over_predicted"] == pytest.approx(56 / (124 / 3))
    assert one_row(pred, run="np2")["predicted_samples"] == pytest.approx(28.0)  # as it ran
    # The prediction per node count uses the same history: the same samples at np4.
    assert noise.history_for(report.runs, report.tables.statistical_efficiency)[0] == NP2_HISTORY


def test_a_base_with_a_noise_scale_is_its_own_source(tmp_path):
    runs = [write_run(str(tmp_path / "np2"), RunSpec(size=2, **NOISE)),
            write_run(str(tmp_path / "np4"), RunSpec(size=4, **NOISE))]
    report = build(runs, ReportOptions(target_loss=(-0.3,)), processes=0)
    row = one_row(report.optional["noise_prediction"], run="np4")
    # np2 reaches -0.3 at global step 6, in epoch 1, after 28 samples: NP2_HISTORY.
    assert row["noise_from"] == "np2" and row["base"] == "np2"
    assert row["predicted_samples"] == pytest.approx(24 + 12 * 13 / 9)


def test_the_projection_says_it_is_predicted_from_the_noise_scale(tmp_path):
    report = build(_runs(tmp_path, **NOISE), ReportOptions(target_loss=(-0.3,),
                                                           project_nodes=(2,)), processes=0)
    rows = report.projection.targets
    projected = one_row(rows, kind="projection")
    # 2 nodes x 4 ranks per node x 2 per rank: global batch 16. From NP2_HISTORY:
    # 16 x (4 + 16) / (4 + 4) + 12 x (5 + 16) / (5 + 4) = 40 + 28 = 68 samples,
    # against np1's 14 measured: statistical efficiency 14 / 68.
    assert projected["statistical_efficiency"] == pytest.approx(14 / 68)
    assert projected["statistical_efficiency_basis"] == noise.NOISE_BASIS
    assert projected["note"] == ("predicted from np2's history of the noise scale: 2 epoch(s), "
                                 "28 samples at global batch 4: 68 samples at global batch 16")
    assert projected["hours"] == pytest.approx(
        one_row(rows, run="np1")["hours"] / (projected["throughput_speedup"] * 14 / 68))
    assert ("train_loss <= -0.3: statistical efficiency PREDICTED from the noise scale "
            "averaged over training: np1's 14 samples / the samples predicted at global batch "
            "B from np2's history of the noise scale: 2 epoch(s), 28 samples at global batch "
            "4." in report.projection.target_assumptions)
    assert not any("ASSUMED 1" in n for n in note_lines(report, "warning"))
    # The prediction per node count at the same count predicts the same samples.
    assert one_row(report.projection.nodes, kind="projection")["predicted_samples"] == (
        pytest.approx(68.0))


def test_without_noise_fields_no_new_section_file_or_json_key(tmp_path):
    report = build(_runs(tmp_path, **COMMON), ReportOptions(target_loss=(-0.3,),
                                                            project_nodes=(2,)), processes=0)
    assert report.optional == {} and report.noise is None
    files = write(report, str(tmp_path / "out"))
    assert not any(k.startswith(("noise", "seed")) for k in files)
    assert not (tmp_path / "out" / "noise_scale.png").exists()
    text = (tmp_path / "out" / "report.md").read_text()
    assert "noise scale" not in text.lower() and "seed group" not in text
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert not any(k.startswith(("noise", "seed")) for k in doc["tables"])
    assert noise.NOISE_BASIS not in set(report.projection.targets["statistical_efficiency_basis"])


def test_the_figure_is_written_only_for_runs_with_a_noise_scale(tmp_path):
    runs = _runs(tmp_path, **NOISE) + [write_run(str(tmp_path / "old"), RunSpec(size=2, **COMMON))]
    report = build(runs, ReportOptions(target_loss=(-0.3,)), processes=0)
    out = tmp_path / "out"
    files = write(report, str(out))
    assert files["noise_scale_png"] == str(out / "noise_scale.png")
    assert (out / "noise_scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    assert "![Gradient noise scale over training](noise_scale.png)" in md
    assert "Not drawn (no noise scale logged or estimated): np1, old." in md
    assert "old: logs no noise_scale (older logs)" in "\n".join(note_lines(report))
    # A later report of runs without it removes the stale figure.
    write(build(runs[-1:], ReportOptions(), processes=0), str(out))
    assert not (out / "noise_scale.png").exists() and not (out / "noise_scale.csv").exists()


def test_json_and_html_carry_the_values(tmp_path):
    report = build(_runs(tmp_path, **NOISE), ReportOptions(target_loss=(-0.3,)), processes=0)
    out = tmp_path / "out"
    write(report, str(out))
    doc = json.loads((out / "report.json").read_text())
    near = [r for r in doc["tables"]["noise_scale"] if r["run"] == "np2" and r["at"] == "target"]
    assert near[0]["b_simple"] == 5.0 and near[0]["epoch"] == 1
    pred = {r["run"]: r for r in doc["tables"]["noise_prediction"]}
    assert pred["np4"]["predicted_samples"] == pytest.approx(124 / 3)
    series = [r for r in doc["tables"]["noise_scale_series"] if r["run"] == "np4"]
    assert [r["b_simple"] for r in series] == [4.0, 5.0, 6.0, 7.0]
    assert [r["samples"] for r in series] == [16, 32, 48, 64]
    html = (out / "report.html").read_text()
    assert "Samples to target predicted from the noise scale" in html
    assert "data:image/png;base64," in html


def _without_interval(run_dir):
    """``run_dir``'s logs as written before 2026-11-28: no interval, no effective steps."""
    for path in glob.glob(os.path.join(run_dir, "logs", "*.jsonl")):
        with open(path) as f:
            records = [json.loads(line) for line in f]
        for r in records:
            for key in ("b_simple_low", "b_simple_high", "effective_steps"):
                r.get("noise_scale", {}).pop(key, None)
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    return run_dir


def test_the_interval_is_read_with_b_simple_and_left_empty_in_older_logs(tmp_path):
    runs = _runs(tmp_path, **NOISE)[1:]
    runs.append(_without_interval(write_run(str(tmp_path / "old"), RunSpec(size=2, **NOISE))))
    report = build(runs, ReportOptions(target_loss=(-0.3,)), processes=0)
    table = report.optional["noise_scale"]
    end = one_row(table, run="np2", at=noise.END)
    assert (end["b_simple"], end["b_simple_low"], end["b_simple_high"],
            end["effective_steps"]) == (7.0, 3.5, 14.0, 16.0)
    series = report.optional["noise_scale_series"]
    first = one_row(series, run="np4", epoch=0)
    assert first["b_simple_low"] == 2.0 and math.isnan(first["b_simple_high"])  # unbounded
    old = one_row(table, run="old", at=noise.END)
    assert old["b_simple"] == 7.0 and math.isnan(old["b_simple_low"])
    out = tmp_path / "out"
    write(report, str(out))
    assert "b_simple_high empty beside a b_simple_low: no upper bound" in (
        out / "report.md").read_text()


def _seed_runs(tmp_path):
    # Same config at 2 ranks, seeds 0, 1, 2; the losses differ so the groups' spread shows:
    # -0.3 is reached at global step 6 (seed 0), 3 (seed 1: -0.1 per step) and never (seed 2).
    losses = {0: lambda k: -0.05 * k, 1: lambda k: -0.1 * k, 2: lambda k: -0.01 * k}
    runs = [write_run(str(tmp_path / f"s{s}"), RunSpec(size=2, seed=s, epochs=4, loss=losses[s]))
            for s in (0, 1, 2)]
    runs.append(write_run(str(tmp_path / "np1"), RunSpec(size=1, **COMMON)))  # other ranks
    return runs


def test_runs_that_differ_only_in_seed_are_grouped(tmp_path):
    report = build(_seed_runs(tmp_path), ReportOptions(target_loss=(-0.3,)), processes=0)
    table = report.optional["seed_groups"]
    assert len(table) == 1  # np1 (other ranks) forms no group of its own
    row = table.iloc[0]
    assert (row["group"], row["runs"], row["seeds"], row["n_runs"]) == ("s0", "s0, s1, s2", "0, 1, 2", 3)
    assert row["reached"] == "2 of 3"
    # Steps of 1 s: the crossings at t = 7 s (step 6) and 4 s (step 3); 4 samples a step.
    assert row["mean_h"] * 3600 == pytest.approx(5.5) and row["min_h"] * 3600 == pytest.approx(4.0)
    assert row["max_h"] * 3600 == pytest.approx(7.0)
    assert (row["mean_samples"], row["min_samples"], row["max_samples"]) == (22.0, 16.0, 28.0)
    md = report.document().sections
    assert any(s.title == "Time to target by seed group" for s in md)


def test_the_seed_key_ignores_seed_and_run_dir_only(tmp_path):
    runs = _seed_runs(tmp_path)
    report = build(runs, ReportOptions(), processes=0)
    keys = [seeds.group_key(r) for r in report.runs]
    assert keys[0] == keys[1] == keys[2] != keys[3]
    other = write_run(str(tmp_path / "lr"), RunSpec(size=2, seed=1, epochs=5, loss=COMMON["loss"]))
    assert seeds.group_key(build([other], ReportOptions(), processes=0).runs[0]) != keys[0]


def test_a_run_without_config_is_not_grouped_and_noted(tmp_path):
    runs = _seed_runs(tmp_path)
    (tmp_path / "s2" / "config.json").unlink()
    report = build(runs, ReportOptions(target_loss=(-0.3,)), processes=0)
    assert one_row(report.optional["seed_groups"], group="s0")["runs"] == "s0, s1"
    assert "[info] s2: not grouped by seed: no readable config.json" in note_lines(report)
    assert math.isfinite(one_row(report.optional["seed_groups"], group="s0")["mean_samples"])
