"""``distseg-report --project-nodes``: the compute model per sample, samples to target from
the noise scale averaged over training, the batch, lr and goodput choice per node count,
beside the measured runs (``analysis.stepmodel``, ``analysis.pernode``, ``analysis.noise.History``).

Every run is a real log written by ``tests/analysis_fixtures/runs.py``. The fabric moves
1e9 bytes/s without latency and the model has 100,000 parameters (4e5 gradient bytes),
so R ranks allreduce for 2 (R - 1) / R x 4e-4 s; the fixture's noise scale has |G|^2 = 1
and tr(Sigma) = B_simple, so phi = B_simple; every number below follows by hand.
"""

import functools
import json
import math

import pytest

from analysis import logs, noise, tables
from analysis.report import NODES_FIGURE, ReportOptions, build, write
from distseg.core import goodput
from tests.analysis_fixtures.runs import (
    RunSpec,
    epoch_record,
    note_lines,
    one_row,
    run_record,
    step,
    write_log,
    write_run,
)

LINK = dict(bandwidth_gbps=8.0, latency_us=0.0)  # given: wins over any measured link
GLOBAL_8 = {"global_batch": 8, "global_batch_grows": True}  # grown past 8 ranks, lr x sqrt
LR = 0.005  # the fixture's train.lr


def _comm(ranks):
    return 2 * (ranks - 1) / ranks * 4e5 / 1e9


def _global_runs(tmp_path, t8, t4, noise_scale=(6.0, 14.0, 30.0), **train):
    """A fixed global batch of 8 on 32 samples: 1 rank x 8 (``t8`` s a step) and 2 ranks
    x 4 (``t4``), 4 steps an epoch, 3 epochs; B_simple ``noise_scale`` by epoch (the
    1-rank run estimates it from consecutive gradients)."""
    common = dict(train_samples=32, epochs=3, params=100_000, consecutive=True,
                  noise_scale=lambda e: noise_scale[e], train_fields={**GLOBAL_8, **train})
    return [write_run(str(tmp_path / "np1"), RunSpec(size=1, batch_size=8, step_time=t8, **common)),
            write_run(str(tmp_path / "np2"), RunSpec(size=2, batch_size=4, step_time=t4, **common))]


def _step_at_4_ranks(alpha, beta, per_rank):
    return alpha + beta * per_rank + _comm(4)


def _build(runs, nodes, **options):
    return build(runs, ReportOptions(project_nodes=nodes, **LINK, **options), processes=0)


# ----------------------------------------------------------------------- compute model


def test_a_fixed_global_batch_shrinks_each_ranks_share_and_its_step_time(tmp_path):
    rep = _build(_global_runs(tmp_path, t8=0.9, t4=0.5), (2, 8))
    # t(8) = 0.9 at 1 rank, t(4) = 0.5 - 4e-4 (allreduce) at 2: beta = 0.1001, alpha = 0.0992.
    beta = (0.9 - (0.5 - _comm(2))) / 4
    alpha = 0.9 - 8 * beta
    proj = rep.projection.table
    # 2 ranks per node: 2 nodes = 4 ranks, 8 / 4 = 2 per rank, 32 // 8 = 4 steps.
    at4 = one_row(proj, kind="projection", nodes=2)
    assert (at4["ranks"], at4["per_rank_batch"], at4["steps_per_epoch"]) == (4, 2, 4)
    assert at4["step_s"] == pytest.approx(alpha + 2 * beta + _comm(4))  # 0.3006, not 0.9
    assert at4["epoch_s"] == pytest.approx(4 * (alpha + 2 * beta + _comm(4)))
    # 8 nodes = 16 ranks: the batch of 8 grows to 1 per rank, 16 a step, 32 // 16 = 2 steps.
    at16 = one_row(proj, kind="projection", nodes=8)
    assert (at16["ranks"], at16["per_rank_batch"], at16["steps_per_epoch"]) == (16, 1, 2)
    assert at16["step_s"] == pytest.approx(alpha + beta + _comm(16))
    # The measured runs lie on the line: residuals 0.
    assert one_row(proj, run="np2")["residual_s"] == pytest.approx(0, abs=1e-12)
    nodes = rep.projection.nodes
    row4 = one_row(nodes, nodes=2)
    assert (row4["predicted_per_rank_batch"], row4["predicted_global_batch"]) == (2, 8)
    assert (row4["lr_rule"], row4["predicted_lr"]) == ("none", LR)
    assert row4["predicted_throughput"] == pytest.approx(32 / (4 * (alpha + 2 * beta + _comm(4))))
    row16 = one_row(nodes, nodes=8)
    assert (row16["predicted_per_rank_batch"], row16["predicted_global_batch"]) == (1, 16)
    assert (row16["lr_rule"], row16["predicted_lr"]) == ("sqrt", pytest.approx(LR * math.sqrt(2)))
    assert any(line.startswith(f"t_compute(b) = {alpha:.4g} + {beta:.4g} x b s per step")
               and "least squares over the per-rank batches measured (4, 8)" in line
               for line in rep.projection.assumptions)
    assert not any("ASSUMED" in n for n in note_lines(rep, "warning"))


def test_one_measured_batch_takes_adaptdls_prior_and_warns(tmp_path):
    run = _global_runs(tmp_path, t8=0.9, t4=0.5)[:1]
    rep = _build(run, (1, 2), ranks_per_node=2)
    # Only b = 8 measured (0.9 s): alpha = 0.45, beta = 0.45 / 8.
    row = one_row(rep.projection.table, kind="projection", nodes=1)
    assert (row["ranks"], row["per_rank_batch"]) == (2, 4)
    assert row["step_s"] == pytest.approx(0.45 + 0.45 / 8 * 4 + _comm(2))
    warned = [n for n in note_lines(rep, "warning") if "ASSUMED (AdaptDL's prior" in n]
    assert len(warned) == 1 and "one per-rank batch measured (8)" in warned[0]


def test_per_rank_batches_at_one_batch_need_no_assumption(tmp_path):
    runs = [write_run(str(tmp_path / f"np{n}"), RunSpec(size=n, params=100_000)) for n in (1, 2)]
    rep = _build(runs, (2,))
    row = one_row(rep.projection.table, kind="projection")
    assert row["per_rank_batch"] == 2 and row["step_s"] == pytest.approx((1.0 + 1.0 - _comm(2)) / 2
                                                                        + _comm(4))
    assert "every projected count runs it" in rep.projection.assumptions[-2]
    assert not any("ASSUMED" in n for n in note_lines(rep, "warning"))


# --------------------------------------------------------------------- samples to target


def _per_rank_runs(tmp_path):
    """16 samples, 2 per rank at 1 and 2 ranks; 1 rank logs phi = 2, 6, 14 by epoch."""
    common = dict(epochs=3, params=100_000, noise_scale=lambda e: [2.0, 6.0, 14.0][e],
                  consecutive=True)
    return [write_run(str(tmp_path / "np1"), RunSpec(size=1, **common)),
            write_run(str(tmp_path / "np2"), RunSpec(size=2, **common))]


def test_samples_to_target_add_each_epochs_samples_at_its_noise_scale(tmp_path):
    # Dice 0.5 + 0.1 x epoch: 0.69 is first reached at epoch 2, after 3 x 16 samples.
    runs = _per_rank_runs(tmp_path)
    rep = _build(runs, (2,), target_dice=(0.69, 0.99))
    nodes = rep.projection.nodes
    base = one_row(nodes, run="np1", target=0.69)
    assert base["predicted_samples"] == 48 and base["measured_samples"] == 48
    # np2 runs a global batch of 4 where np1 ran 2, an epoch of 16 samples at phi each:
    # 16 x (2 + 4) / (2 + 2) + 16 x (6 + 4) / (6 + 2) + 16 x (14 + 4) / (14 + 2) = 62.
    np2 = one_row(nodes, run="np2", target=0.69)
    assert (np2["kind"], np2["predicted_global_batch"]) == ("measured", 4)
    assert np2["predicted_samples"] == pytest.approx(62.0)
    assert np2["measured_samples"] == 48  # beside it, as measured
    # 2 nodes x 2 ranks x 2 = 8: 16 x 10/4 + 16 x 14/8 + 16 x 22/16 = 90.
    projected = one_row(nodes, kind="projection", target=0.69)
    assert (projected["ranks"], projected["predicted_samples"]) == (4, pytest.approx(90.0))
    assert projected["predicted_hours"] == pytest.approx(
        90.0 / projected["predicted_throughput"] / 3600.0)
    assert math.isnan(projected["measured_samples"])
    # The base never reaches 0.99: no number made up, and the lines say why.
    missed = nodes[nodes["target"] == 0.99]
    assert missed["predicted_samples"].isna().all() and missed["predicted_hours"].isna().all()
    assert one_row(nodes, run="np1", target=0.99)["note"] == "np1: not reached (> 48 samples)"
    lines = rep.projection.node_assumptions
    assert lines[0].startswith("PREDICTION from models, not a measurement")
    assert any("0.99: no samples predicted: np1 (the base) did not reach the target" in line
               for line in lines)
    assert any("0.69: samples PREDICTED from np1's history of the noise scale: 3 epoch(s), 48 "
               "samples at global batch 2." in line for line in lines)


def test_the_gain_rule_scales_the_lr_by_the_root_of_the_gain_at_the_target(tmp_path):
    common = dict(epochs=3, params=100_000, noise_scale=lambda e: [2.0, 6.0, 14.0][e],
                  consecutive=True, train_fields={"lr_scaling": "gain"})
    runs = [write_run(str(tmp_path / f"np{n}"), RunSpec(size=n, **common)) for n in (1, 2)]
    rep = _build(runs, (2,), target_dice=(0.69,))
    # 2 per rank, base batch 2; at the target phi = 14: gain(4) = (14/2 + 1) / (14/4 + 1).
    np2 = one_row(rep.projection.nodes, run="np2")
    assert np2["lr_rule"] == "gain"
    assert np2["predicted_lr"] == pytest.approx(LR * math.sqrt(8 / 4.5))  # x 4/3
    at4 = one_row(rep.projection.nodes, ranks=4)
    assert at4["predicted_lr"] == pytest.approx(LR * math.sqrt(8 / (14 / 8 + 1)))
    assert "with the gain rule x sqrt(gain(B))" in rep.projection.node_assumptions[1]


def test_a_history_stops_inside_an_epoch(tmp_path):
    run = logs.load_run(_per_rank_runs(tmp_path)[0])
    hist = noise.history(run, 24.0)  # a loss target met half way through epoch 1
    assert (hist.samples, hist.batch, hist.tr_sigma) == ((16.0, 8.0), (2.0, 2.0), (2.0, 6.0))
    assert hist.samples_at(4.0) == pytest.approx(16 * 6 / 4 + 8 * 10 / 8)
    # goodput.samples_at, stretch by stretch: the same sum.
    assert hist.samples_at(4.0) == pytest.approx(goodput.samples_at(4.0, 2.0, [(16.0, 1.0, 2.0),
                                                                              (8.0, 1.0, 6.0)]))
    # A batch below the one run counts its samples as run (no gain below the base).
    assert hist.samples_at(1.0) == pytest.approx(24.0)


def test_each_epoch_counts_at_the_batch_it_ran(tmp_path):
    # A goodput-policy run: epoch 0 at 2 samples a step (4 steps), epoch 1 at 4 (2 steps).
    noise_at = {0: 2.0, 1: 6.0}
    lines = [run_record(0, 1, steps_per_epoch=4, batch_size=2, global_batch_size=2)]
    for k in range(6):
        epoch, batch = (0, 2) if k < 4 else (1, 4)
        lines.append(step(0, epoch, k if k < 4 else k - 4, float(k + 1), global_step=k,
                          samples=batch))
        if k in (3, 5):
            lines.append(epoch_record(0, epoch, float(k + 1), samples=8, steps=4 if k == 3 else 2,
                                      noise_scale={"b_simple": noise_at[epoch], "g2": 1.0,
                                                   "tr_sigma": noise_at[epoch], "method": "consecutive"},
                                      goodput={"policy": "goodput", "per_rank": batch}))
    write_log(str(tmp_path / "gp"), 0, lines)
    run = logs.load_run(str(tmp_path / "gp"))
    rows = tables.epoch_batches(run)
    assert list(rows["steps"]) == [4, 2] and list(rows["global_batch"]) == [2, 4]
    hist = noise.history(run)
    assert hist.samples == (8.0, 8.0) and hist.batch == (2.0, 4.0)
    # At 8: 8 x (2 + 8) / (2 + 2) + 8 x (6 + 8) / (6 + 4) = 20 + 11.2.
    assert hist.samples_at(8.0) == pytest.approx(31.2)


# ------------------------------------------------------------------------ goodput policy


def test_the_goodput_policy_chooses_with_the_compute_model(tmp_path):
    # t(8) = 1.0, t(4) = 0.9 - 4e-4: alpha 0.799, beta 0.0251; phi 6, 14, 30 by epoch.
    runs = _global_runs(tmp_path, t8=1.0, t4=0.9, batch_policy="goodput", max_batch_per_rank=8)
    rep = _build(runs, (2,), target_dice=(0.69,))
    beta = (1.0 - (0.9 - _comm(2))) / 4
    seconds = functools.partial(_step_at_4_ranks, 1.0 - 8 * beta, beta)

    # At 4 ranks the base is G = 8: per-rank 2, 4 or 8. After epoch 0 (phi 6) goodput
    # b x 4 / t(b) x (6 + 8) / (6 + 4b) is 9.41, 11.3, 11.8 for 2, 4, 8: 8 is 1.25x the
    # current 2, past the 5 % a switch needs; after epoch 1 (phi 14) 8 stays best.
    choice = goodput.choose(2, goodput.candidates(4, 8, 8), 4, 8, seconds, 1.0, 6.0)
    assert choice.per_rank == 8 and choice.goodput[8] == pytest.approx(32 / seconds(8) * 14 / 38)
    row = one_row(rep.projection.nodes, kind="projection")
    assert row["batch_policy"] == "goodput"
    assert row["note"] == "goodput: per-rank batch by epoch 2, 8, 8"
    assert (row["predicted_per_rank_batch"], row["predicted_global_batch"]) == (8, 32)
    # Past G the lr follows train.grown_lr_scaling, sqrt of 32 / 8.
    assert (row["lr_rule"], row["predicted_lr"]) == ("sqrt", pytest.approx(LR * 2))
    # np1's epochs of 32 samples at 8: 32 at 8, then 32 x (14 + 32) / (14 + 8) and
    # 32 x (30 + 32) / (30 + 8) at 32; each at the throughput of its batch.
    later = [32 * 46 / 22, 32 * 62 / 38]
    assert row["predicted_samples"] == pytest.approx(32 + sum(later))
    hours = (32 / (8 / seconds(2)) + sum(later) / (32 / seconds(8))) / 3600
    assert row["predicted_hours"] == pytest.approx(hours)
    assert any("train.batch_policy goodput" in a for a in rep.projection.node_assumptions)


# ----------------------------------------------------------------------------- outputs


def test_the_figure_and_every_output_hold_the_prediction(tmp_path):
    rep = _build(_per_rank_runs(tmp_path), (2, 4), target_dice=(0.69,))
    out = tmp_path / "out"
    files = write(rep, str(out))
    assert files["projection_nodes_png"] == str(out / NODES_FIGURE)
    assert (out / NODES_FIGURE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len((out / "projection_nodes.csv").read_text().splitlines()) == 1 + 4
    md = (out / "report.md").read_text()
    assert "## Prediction per node count (model, not measured)" in md
    assert f"![Predicted time to target against node count]({NODES_FIGURE})" in md
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == 5  # loss, Dice, stat. eff., noise, this
    doc = json.loads((out / "report.json").read_text())
    per_node = doc["projection"]["per_node"]
    assert per_node["assumptions"][0].startswith("PREDICTION")
    assert [r["run"] for r in per_node["table"]] == ["np1", "np2", "projected 2 nodes",
                                                     "projected 4 nodes"]
    # Without a target: batch, lr and throughput per count, no figure (an old one removed).
    write(_build(_per_rank_runs(tmp_path), (2,)), str(out))
    assert not (out / NODES_FIGURE).exists()
    assert (out / "projection_nodes.csv").exists()
