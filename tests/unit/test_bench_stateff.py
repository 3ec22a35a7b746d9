"""The arithmetic of benchmarks/bench_stateff.py (``benchlib.stateff``) on hand-built
per-rank logs: samples and time to a validation Dice target, the largest drop after
warm-up, the table's ratios and the goal rows. No TensorFlow: the logs are written as
JSON lines and read back with ``benchlib.runlogs``, as the benchmark reads real runs.
The emulation's exactness across rank counts is the last test; its agreement with
``distseg-train`` itself is tests/e2e/test_bench_stateff_parity.py."""

from __future__ import annotations

import json
import os
import sys

import pytest

from distseg.core import lr, rundir

from support import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))

from benchlib import runlogs  # noqa: E402
from benchlib.stateff import curves, largebatch, study, summary  # noqa: E402
from benchlib.stateff.goals import goal_rows, noise_predictions  # noqa: E402
from benchlib.stateff.runs import _read_cached, cache_key, run_spec  # noqa: E402

LIVER = [0.30, 0.90, 0.70, 0.95]
"""Rank 0's validation liver Dice per epoch in the hand-built 2-rank run."""


def write_logs(run_dir, ranks: int, epochs: int, per_rank: int, liver, *, skip_last_on=None):
    """Per-rank JSON-lines logs with ``epoch`` records: ``per_rank`` samples per rank and
    epoch, rank r's time 10*(epoch+1)+r, the same global val_dice on every rank."""
    os.makedirs(rundir.log_dir(run_dir))
    for rank in range(ranks):
        with open(rundir.log_path(run_dir, rank), "w") as f:
            f.write(json.dumps({"type": "run", "rank": rank, "size": ranks}) + "\n")
            for e in range(epochs):
                if rank == skip_last_on and e == epochs - 1:
                    continue
                f.write(json.dumps({
                    "type": "epoch", "rank": rank, "epoch": e, "t": 10.0 * (e + 1) + rank,
                    "samples": per_rank, "train_loss": -0.1 * (e + 1),
                    "val_dice": {"background": 0.99, "liver": liver[e], "lesion": None}}) + "\n")
            f.write("{\"type\": \"epoch\", \"ep")  # a truncated last line, as after a kill


def read(run_dir, ranks: int) -> list[list[dict]]:
    return runlogs.rank_records(run_dir, ranks)


def test_points_count_global_samples_and_the_slowest_rank(tmp_path):
    write_logs(tmp_path, 2, 4, 256, LIVER)
    points = curves.eval_points(read(tmp_path, 2))
    assert [p["samples"] for p in points] == [512, 1024, 1536, 2048]
    assert [p["t"] for p in points] == [11.0, 21.0, 31.0, 41.0]  # rank 1 is 1 s slower
    assert [p["dice"] for p in points] == LIVER
    assert points[2]["train_loss"] == pytest.approx(-0.3)


def test_an_epoch_that_not_every_rank_logged_is_left_out(tmp_path):
    write_logs(tmp_path, 2, 4, 256, LIVER, skip_last_on=1)
    assert [p["samples"] for p in curves.eval_points(read(tmp_path, 2))] == [512, 1024, 1536]


def test_samples_and_time_to_target_and_the_drop_after_warm_up(tmp_path):
    write_logs(tmp_path, 2, 4, 256, LIVER)
    points = curves.eval_points(read(tmp_path, 2))
    s = curves.summarise(points, target=0.85, warmup_samples=512, per_pass=2)
    assert (s["samples_to_target"], s["time_to_target"]) == (1024, 21.0)
    assert s["max_drop"] == pytest.approx(0.20)  # 0.90 -> 0.70; the rise from 0.30 is not a drop
    assert s["max_drop_per_pass"] == 0.0  # 0.90 -> 0.95 a pass (2 evaluations) later
    assert (s["final_dice"], s["best_dice"], s["evals"], s["samples"]) == (0.95, 0.95, 4, 2048)
    never = curves.summarise(points, target=0.96, warmup_samples=0, per_pass=1)
    assert never["samples_to_target"] is None and never["time_to_target"] is None
    # Counting from the very first evaluation, the fall 0.90 -> 0.70 is still the largest.
    assert never["max_drop"] == pytest.approx(0.20)
    assert curves.largest_drop(points, after_samples=2048) == 0.0  # one point left: no pair


def test_foreground_dice_counts_an_undefined_class_as_zero():
    # val_dice as logged: the data file's classes in order, background first.
    assert curves.dice_of({"background": 0.9, "liver": 0.8, "lesion": None}, "foreground") \
        == pytest.approx(0.4)
    assert curves.dice_of({"background": 0.9, "liver": 0.8, "lesion": 0.6}, "foreground") \
        == pytest.approx(0.7)
    assert curves.dice_of({"background": 0.9, "liver": 0.8, "lesion": 0.6}, "lesion") == 0.6
    # Another file's classes: the foreground is whatever follows its background.
    assert curves.dice_of({"bg": 1.0, "kidney": 0.5, "cyst": 0.3, "tumour": None},
                          "foreground") == pytest.approx(0.8 / 3)


def test_throughput_counts_the_epochs_after_the_first_at_the_slowest_rank(tmp_path):
    os.makedirs(rundir.log_dir(tmp_path))
    for rank in range(2):
        with open(rundir.log_path(tmp_path, rank), "w") as f:
            for epoch, seconds in enumerate((100.0, 2.0 + rank, 4.0 - rank)):
                f.write(json.dumps({"type": "epoch", "rank": rank, "epoch": epoch, "samples": 24,
                                    "train_time": seconds}) + "\n")
    # Epoch 0 (tracing) left out; epochs 1 and 2 last 3 s and 4 s (the slower rank's).
    assert runlogs.run_throughput(tmp_path, 2) == pytest.approx(4 * 24 / 7.0)
    assert runlogs.throughput([[{"type": "epoch", "epoch": 0, "samples": 8, "train_time": 1.0}]]) is None


def test_one_rank_runs_are_shared_by_variants_that_differ_only_in_scaling_or_warm_up():
    cfg = {v: study.run_config("small", v, 1, 0, 12, 2048) for v in ("base", "sqrt", "warm2")}
    keys = {cache_key("sim", "small", 1, c) for c in cfg.values()}
    assert len(keys) == 1
    at8 = {cache_key("sim", "small", 8, study.run_config("small", v, 8, 0, 12, 2048))
           for v in ("base", "sqrt", "warm2")}
    assert len(at8) == 3
    # 512 samples between validations at every rank count; 1 pass of 2048 = 4 of them.
    c8 = study.run_config("small", "warm2", 8, 0, 12, 2048)["train"]
    assert (c8["max_steps_per_epoch"], c8["warmup_epochs"]) == (8, 8.0)


def test_every_run_real_or_emulated_is_given_float32(tiny, tmp_path):
    """The demo preset asks for ``auto``, which a trial at a real run's start decides and
    the emulation cannot: both get float32 in the config the study gives them (so the
    parity test's losses stay bit for bit), unless a variant names a precision."""
    over = study.run_config("small", "gbatch-gn", 2, 0, 2, study.train_samples(tiny))
    assert "precision" not in over["model"]  # nor in the cache key: cached runs keep theirs
    cfg, path = study.resolved(over, tiny, str(tmp_path / "run"))
    with open(path) as f:
        written = json.load(f)  # what distseg-train --config reads
    assert cfg.model.precision == written["model"]["precision"] == study.PRECISION == "float32"
    assert {k: v for k, v in written["model"].items() if k != "precision"} == over["model"]
    named = {**over, "model": {**over["model"], "precision": "bfloat16"}}
    assert study.resolved(named, tiny, str(tmp_path / "named"))[0].model.precision == "bfloat16"


def run(variant, ranks, seed, samples, time, drop):
    return {"backend": "hvd", "scale": "small", "variant": variant, "ranks": ranks,
            "seed": seed, "samples_to_target": samples, "time_to_target": time,
            "max_drop": drop, "max_drop_per_pass": drop, "final_dice": 0.9, "throughput": None,
            "load": [3.0, 5.0]}


def test_table_ratios_and_goal_rows():
    runs = [run("v", 1, 0, 2048, 100.0, 0.02), run("v", 1, 1, 2560, 120.0, 0.05),
            run("v", 2, 0, 2048, 60.0, 0.0), run("v", 2, 1, 3072, 70.0, 0.12),
            run("v", 8, 0, 3072, None, 0.0), run("v", 8, 1, None, None, 0.01)]
    rows = summary.table(runs)
    two = summary.find(rows, "v", 2)
    assert two["samples_to_target"]["mean"] == 2560 and two["samples_to_target"]["max"] == 3072
    assert two["samples_vs_1"] == pytest.approx(2560 / 2304)
    assert two["time_speedup"] == pytest.approx(110 / 65)
    eight = summary.find(rows, "v", 8)
    assert eight["samples_to_target"]["missing"] == 1  # one seed never reached the target
    goals = goal_rows(rows, runs, "v")
    # time: the median of the seeds' own ratios (100/60 and 120/70), not a ratio of means
    assert [g["measured"] for g in goals[:3]] == [
        pytest.approx((100 / 60 + 120 / 70) / 2, abs=0.01), 0.12, pytest.approx(3072 / 2304, abs=0.01)]
    assert [g["met"] for g in goals] == [True, False, False, None]  # no emulated 8-rank runs
    assert goals[0]["detail"].startswith("v (small), real runs, median of 2 seeds: 100.0 s vs 60.0 s, "
                                         "120.0 s vs 70.0 s")
    assert goals[2]["detail"] == "v, the largest of 2 ranks 1.11x, 8 ranks 1.33x (means of seeds)"


def sim_run(variant, seed, samples, b_simple):
    # The preconditioned noise scale (the goal's) 3x the raw one.
    return dict(run(variant, 8, seed, samples, None, 0.0), backend="sim", b_simple=b_simple,
                b_simple_adam=[None if b is None else 3 * b for b in b_simple])


def test_the_noise_scale_at_the_target_predicts_the_larger_batch():
    # B_noise from the validation that reached the target (the 3rd: 1,536 samples), not
    # a later one; E(64) = E(8) (B_noise + 64) / (B_noise + 8).
    runs = [sim_run("v", 0, 1536, [1.0, None, 4.0, 100.0]), sim_run("gn", 0, 8704, [None] * 4),
            sim_run("v", 1, 1024, [2.0, 6.0, 7.0, 9.0]), sim_run("gn", 1, None, [None] * 4)]
    preds = noise_predictions(runs, "v", "gn", "small")
    assert preds[0] == {"seed": 0, "b_noise": 4.0, "base_samples": 1536,
                        "predicted": pytest.approx(1536 * 68 / 12), "measured": 8704}
    assert preds[1]["b_noise"] == 6.0 and preds[1]["measured"] is None
    goal = goal_rows(summary.table(runs), runs, "v")[3]
    assert goal["measured"] == 1.0 and goal["met"] is True  # seed 1 never reached: left out
    assert "B_noise 4.0 at the target" in goal["detail"]
    # From the preconditioned B_noise 12: 1536 x 76/20 = 5837 against 8704 measured.
    assert "from the Adam-preconditioned B_noise (12.0): 0.67x the measured samples" in goal["detail"]


def test_past_g_ranks_the_samples_are_reported_beside_the_noise_scale_prediction():
    # 16 emulated ranks x 1 slice grow the global batch of 8 to 16: their samples are
    # a row of their own, not part of the "<= 1.05 at 2, 4, 8 ranks" goal.
    runs = [sim_run("v", 0, 1536, [1.0, None, 4.0, 100.0]),
            sim_run("v", 1, 1024, [2.0, 6.0, 7.0, 9.0]),
            dict(sim_run("v", 0, 1536, [None] * 4), ranks=1),
            dict(sim_run("v", 1, 1024, [None] * 4), ranks=1),
            dict(sim_run("v", 0, 2048, [None] * 4), ranks=16),
            dict(sim_run("v", 1, 1536, [None] * 4), ranks=16)]
    goals = goal_rows(summary.table(runs), runs, "v")
    assert goals[2]["measured"] == 1.0 and "16 ranks" not in goals[2]["detail"]
    past = goals[4]
    assert past["measure"] == "samples to target at 16 ranks x 1 slice (global batch grows from 8 to 16) vs 1 rank"
    assert past["measured"] == pytest.approx(3584 / 2560, abs=0.01)
    # B_noise at the target 4 and 6 (raw), 12 and 18 (preconditioned): (B + 16) / (B + 8).
    raw = ((4 + 16) / 12 + (6 + 16) / 14) / 2
    adam = ((12 + 16) / 20 + (18 + 16) / 26) / 2
    assert f"raw {raw:.2f}x (B_noise 2 seeds), Adam-preconditioned {adam:.2f}x" in past["detail"]


def _groupnorm_problem(seed: int, steps: int, batch: int):
    """The emulation tests' model and data: the smoke U-Net at 16x16 with GroupNorm, 3
    classes and the Dice+CE loss, and ``steps`` random batches of ``batch`` slices with
    masks thresholded from them."""
    import dataclasses

    import numpy as np

    from distseg.core import config as config_lib
    cfg = config_lib.smoke()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, norm="group", num_classes=3,
                                                             image_size=16),
                              train=dataclasses.replace(cfg.train, loss="dice_ce", lr=1e-3))
    images = np.random.default_rng(seed).random((steps, batch, 16, 16, 1), dtype=np.float32)
    masks = (images[..., 0] > 0.5).astype(np.uint8) + (images[..., 0] > 0.8).astype(np.uint8)
    return cfg, images, masks


@pytest.mark.parametrize("ranks", [4, 8])
def test_the_emulation_of_n_ranks_makes_the_one_process_update(ranks):
    """Issue 21's exactness at 4 and 8 ranks, in the step-exact emulation: GroupNorm, no
    dropout, the global Dice+CE loss: N emulated ranks x 8/N slices make, for 30 steps
    of Adam, the step losses and weights of one process x 8 slices."""

    import numpy as np

    from distseg.training.progress.noise import PRECONDITION_AFTER
    from distseg.training.step import steps

    from benchlib.stateff import emulation
    cfg, images, masks = _groupnorm_problem(seed=0, steps=30, batch=8)
    out = {}
    for n in (1, ranks):
        sim = emulation.SimRanks(cfg, n)
        parts = np.array_split(np.arange(8), n)
        done = [sim.step([(images[k, p], masks[k, p]) for p in parts], 1e-3) for k in range(30)]
        out[n] = ([loss for loss, _ in done], np.array([norms for _, norms in done]),
                  steps.weight_checksum(sim.model.trainable_variables))
    np.testing.assert_allclose(out[ranks][0], out[1][0], rtol=1e-5)
    np.testing.assert_allclose(out[ranks][2], out[1][2], rtol=1e-5)
    assert out[1][0][-1] < out[1][0][0]
    # The noise scale's inputs, as the train step makes them ([small, big] raw, then
    # preconditioned). N ranks: a rank's gradient of 8/N slices is noisier than their
    # average, which is the one process's gradient: one process pairs each step's
    # gradient with the previous one (none at the first step), so its mean squared norm
    # is the mean of N ranks' big norms at this step and the last.
    many, one = out[ranks][1], out[1][1]
    assert (many[:, 0] > 1.2 * many[:, 1]).all()
    assert np.isnan(one[0]).all() and np.isfinite(one[1:]).all()
    np.testing.assert_allclose(one[1:, 0], (many[1:, 1] + many[:-1, 1]) / 2, rtol=1e-3)
    # Preconditioned by Adam's second moments once Adam has taken PRECONDITION_AFTER
    # steps (the plain norms before), with the same order between the batch sizes.
    after = PRECONDITION_AFTER
    np.testing.assert_allclose(many[:after, 2:], many[:after, :2], rtol=1e-6)
    assert (many[after:, 2] > many[after:, 3]).all() and (many[after:, 3] > 0).all()
    assert not np.allclose(many[after:, 2:], many[after:, :2])


# --- issue 28: global batches past 8 ----------------------------------------------------


def test_the_sweep_multiplies_the_base_lr_and_shares_the_sqrt_rules_runs():
    base = study.run_config("small", "gbatch-gn", 8, 0, 24, 2048)["train"]
    x28 = study.run_config("small", "gbatch-gn-x2.8", 8, 0, 24, 2048)["train"]
    assert list(study.MULTIPLIERS) == ["x1", "x1.4", "x2", "x2.8", "x4"]
    assert x28["lr"] == pytest.approx(2 * 2 ** 0.5 * 1e-3) and x28["grown_lr_scaling"] == "none"
    assert {k: v for k, v in x28.items() if k not in ("lr", "grown_lr_scaling")} == \
        {k: v for k, v in base.items() if k != "grown_lr_scaling"}
    assert x28["warmup_epochs"] == 0.0  # no warm-up, as gbatch-gn: so x sqrt(B/8) is sqrt's run
    same = {(v, b): study.same_run(f"gbatch-gn-{v}", b) for v in study.MULTIPLIERS for b in (16, 32, 64)}
    assert {k for k, v in same.items() if v == "gbatch-gn"} == {("x1.4", 16), ("x2", 32), ("x2.8", 64)}
    assert run_spec("sim", "small", "gbatch-gn-x2", 32, 0, 24, None)[2] == \
        run_spec("sim", "small", "gbatch-gn", 32, 0, 24, None)[2]
    assert run_spec("sim", "small", "gbatch-gn-x2", 16, 0, 24, None)[2] != \
        run_spec("sim", "small", "gbatch-gn", 16, 0, 24, None)[2]


def test_a_grown_batch_is_emulated_as_8_ranks_with_the_same_batches_and_lr():
    import dataclasses

    import numpy as np

    from distseg.core import config as config_lib
    from distseg.data import sharding
    from distseg.training.progress.plan import EpochPlan

    cfg_over, emulated, _ = run_spec("sim", "small", "gbatch-gn", 64, 0, 24, 0.85)
    assert (emulated.ranks, emulated.sim_ranks, emulated.fold, emulated.stop_at) == (64, 8, 8, 0.85)
    assert cfg_over == study.run_config("small", "gbatch-gn", 8, 0, 24, 2048)
    assert run_spec("sim", "small", "gbatch-gn", 8, 0, 24, None)[1] is None
    def train(over):
        return dataclasses.replace(config_lib.demo().train, **over["train"])

    t = train(cfg_over)
    real = {r: EpochPlan.of(train(study.run_config("small", "gbatch-gn", r, 0, 24, 2048)), 2048, r)
            for r in (16, 64)}
    for r, sched in real.items():
        folded = EpochPlan.of(t, 2048, 8, per_rank=r // 8)
        assert (folded.steps, folded.batch.global_batch, folded.batch.base, lr.at(folded, 0)) == \
            (sched.steps, sched.batch.global_batch, sched.batch.base, lr.at(sched, 0))
        assert folded.steps * r == 512 and lr.at(sched, 0) == pytest.approx(1e-3 * (r / 8) ** 0.5)
        # the same samples in every global batch at r ranks and at 8
        ids = np.arange(2048)
        whole = None
        for n in (r, 8):
            parts = [sharding.global_batches(ids, k, n, r, 3, 0) for k in range(n)]
            got = [np.sort(np.concatenate(step)) for step in zip(*parts)]
            whole = got if whole is None else whole
            np.testing.assert_array_equal(np.array(got), np.array(whole))


def lb_run(variant, ranks, seed, samples, cum=None, noise=None, per_rank=None):
    return {"backend": "sim", "variant": variant, "ranks": ranks, "seed": seed,
            "samples_to_target": samples, "cum_samples": cum or [], "noise": noise or [],
            "per_rank": per_rank or []}


def test_the_prediction_is_samples_at_over_the_base_runs_epochs_up_to_the_target():
    from distseg.core import goodput

    # The B = 8 run reached the target at its 2nd validation; the 3rd is not history.
    noise = [{"g2": 1.0, "tr_sigma": 8.0}, {"g2": 2.0, "tr_sigma": 48.0}, {"g2": 1.0, "tr_sigma": 1e3}]
    runs = [lb_run("gbatch-gn", 8, 0, 1024, [512, 1024, 1536], noise),
            lb_run("gbatch-gn", 16, 0, 1536), lb_run("gbatch-gn", 32, 0, 2048),
            lb_run("gbatch-gn", 64, 0, None, [512 * k for k in range(1, 25)])]
    preds = largebatch.predictions(runs, 0)
    # efficiency(B) = (phi + 8) / (phi + B): phi 8 then 24; at B = 16: 512 x 24/16 + 512 x 40/32.
    assert preds[0]["predicted"] == pytest.approx(512 * 24 / 16 + 512 * 40 / 32)
    assert [p["predicted"] for p in preds] == [
        pytest.approx(goodput.samples_at(b, 8, [(512, 1.0, 8.0), (512, 2.0, 48.0)])) for b in (16, 32, 64)]
    row = largebatch.prediction_row(preds)
    assert row["met"] is False  # B = 64 not reached: no ratio, so not within 25 %
    assert "seed 0 B=16: 1408 / 1536 = 0.92" in row["detail"]
    assert row["detail"].endswith(f"seed 0 B=64: {preds[2]['predicted']:.0f} / not reached in 12288")


def test_a_run_cached_from_older_logs_is_read_by_schema_3_names(tmp_path):
    path = tmp_path / "old.json"  # as cached before log schema 3
    path.write_text(json.dumps({"key": "k", "noise": [None, {"g2": 1.0, "trace": 8.0, "trace_raw": 2.0}],
                                "batch_policy": [None, {"next_per_rank": 2}]}))
    rec = _read_cached(str(path))
    assert rec["noise"] == [None, {"g2": 1.0, "tr_sigma": 8.0, "tr_sigma_raw": 2.0}]
    assert rec["goodput"] == [None, {"next_per_rank": 2}] and "batch_policy" not in rec
    assert largebatch.history({"cum_samples": [512], "samples_to_target": 512, "noise": rec["noise"][1:]}) \
        == [(512, 1.0, 8.0)]


def test_projected_time_adds_each_steps_seconds_at_its_per_rank_batch():
    seconds = {1: 0.1, 2: 0.15, 4: 0.3, 8: 0.6}
    # 32 ranks: 1,024 samples at 1 per rank = 32 steps; 512 at 2 per rank = 8 steps.
    assert largebatch.projected_seconds([(1024, 1), (512, 2)], 32, seconds) == pytest.approx(32 * 0.1 + 8 * 0.15)
    runs = [lb_run("gbatch-gn-goodput", 32, 0, 1536, [512, 1024, 1536, 2048], per_rank=[1, 1, 2, 2]),
            lb_run("gbatch-gn", 32, 0, 2048), lb_run("gbatch-gn", 64, 0, 2048),
            lb_run("gbatch-gn", 128, 0, None, [1024, 2048])]
    c = largebatch.goodput_vs_fixed(runs, 0, seconds)
    assert c["not_reached_after"] == {4: pytest.approx(16 * 0.3)}  # 2,048 samples at 4 per rank
    assert c["policy"] == pytest.approx(32 * 0.1 + 8 * 0.15)
    assert c["fixed"] == {1: pytest.approx(64 * 0.1), 2: pytest.approx(32 * 0.15), 4: None, 8: None}
    assert c["vs_best"] == pytest.approx(4.4 / 4.8)
    row = largebatch.goodput_row([c])
    assert row["measured"] == 0.92 and row["met"] is False
    assert "fixed 1: 6.4 s, 2: 4.8 s, 4: not reached (> 4.8 s), 8: not run" in row["detail"]


def test_the_gain_rule_against_the_best_fixed_multiplier_and_the_default_against_1_rank():
    runs = [lb_run("gbatch-gn-gain", 16, 0, 2560), lb_run("gbatch-gn-x1", 16, 0, 3072),
            lb_run("gbatch-gn", 16, 0, 2048), lb_run("gbatch-gn-x2", 16, 0, None),
            lb_run("gbatch-gn", 32, 0, 3584), lb_run("gbatch-gn-gain", 32, 0, None),
            lb_run("gbatch-gn-x1", 32, 0, 4096), lb_run("gbatch-gn", 1, 0, 2048)]
    table = largebatch.sweep(runs, 0)
    # x1.4 at B = 16 and x2 at 32 are the sqrt rule's runs
    assert table[16] == {"sqrt": 2048, "gain": 2560, "x1": 3072, "x2": None}
    row = largebatch.gain_row({0: table})
    assert row["detail"] == "seed 0 B=16: 1.25; seed 0 B=32: gain not reached"
    assert row["met"] is False
    default = largebatch.default_row(runs, [0])
    assert default["measured"] == "1.00; 1.75" and default["met"] is False


def test_the_emulated_goodput_policy_switches_as_the_loop_does():
    """``emulation.policy_step`` at 32 emulated ranks (8 sim ranks x 4 per-rank slices),
    through the loop's own ``TrainingState``: a noise scale far above the batch makes per-rank
    2 worth its lower step cost, and the plan and noise-scale sizes follow; a small one
    keeps per-rank 1."""
    import dataclasses

    from distseg.core import config as config_lib
    from distseg.training.progress.noise import Average
    from distseg.training.progress.state import TrainingState

    from benchlib.stateff import emulation
    cfg_over, emulated, _ = run_spec("sim", "small", "gbatch-gn-goodput", 32, 0, 24, None)
    cfg = dataclasses.replace(config_lib.demo(), train=dataclasses.replace(
        config_lib.demo().train, **cfg_over["train"]))
    seconds = {1: 0.1, 2: 0.15, 4: 0.3, 8: 0.6}  # per sample: 2 is 1.33x faster than 1
    for phi, expect in ((1e4, 2), (8.0, 1)):
        scaling = TrainingState.initial(cfg.train, 2048, 8, fold=emulated.fold)
        assert (scaling.plan.batch.per_rank, scaling.plan.batch.global_batch) == (4, 32)
        assert (scaling.noise.small, scaling.noise.big, scaling.noise.base) == (4, 32, 8)
        scaling.noise.averages["preconditioned"] = Average(1.0, phi, 1.0)
        choice = emulation.policy_step(scaling, seconds, cfg.train)
        plan = scaling.plan
        assert choice.per_rank == expect
        assert (plan.batch.per_rank, plan.batch.global_batch, plan.steps) == \
            (4 * expect, 32 * expect, 512 // (32 * expect))
        assert (scaling.noise.small, scaling.noise.big) == (4 * expect, 32 * expect)
        assert lr.at(plan, 0) == pytest.approx(1e-3 * (4 * expect) ** 0.5)


def test_a_global_batch_makes_the_same_steps_split_over_16_ranks_or_8():
    """The fold ``study.Emulated`` relies on: GroupNorm, the global loss, a grown global
    batch of 16 as 16 emulated ranks x 1 slice and as 8 x 2: the same step losses and
    weights for 5 Adam steps (float32 sums in another order)."""

    import numpy as np

    from distseg.training.step import steps

    from benchlib.stateff import emulation
    cfg, images, masks = _groupnorm_problem(seed=1, steps=5, batch=16)
    out = {}
    for n in (16, 8):
        sim = emulation.SimRanks(cfg, n)
        parts = np.array_split(np.arange(16), n)
        losses = [sim.step([(images[k, p], masks[k, p]) for p in parts], 1.4e-3)[0] for k in range(5)]
        out[n] = (losses, steps.weight_checksum(sim.model.trainable_variables))
    np.testing.assert_allclose(out[8][0], out[16][0], rtol=1e-5)
    np.testing.assert_allclose(out[8][1], out[16][1], rtol=1e-5)


def test_the_emulated_range_test_chooses_by_lrfind_and_leaves_no_trace():
    """``emulation.find_lr``: ``lrfind``'s lrs, stop and choice on the emulated ranks;
    the weights, Adam's state and the BatchNorm banks are as they were."""
    import dataclasses

    import numpy as np

    from distseg.training.progress.plan import EpochPlan
    from distseg.training.startup import lrfind
    from distseg.training.step import steps

    from benchlib.stateff import emulation
    cfg, images, masks = _groupnorm_problem(seed=2, steps=1, batch=64)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, batch_size=4, global_batch=8, global_batch_grows=True))
    images, masks, ids = images[0], masks[0], np.arange(64)
    sim = emulation.SimRanks(cfg, 2)
    before = steps.weight_checksum(steps.trial_variables(sim.model, sim.optimizer))
    found = emulation.find_lr(sim, EpochPlan.of(cfg.train, 64, 2), (images, masks, ids), 0, 1e-3)
    assert steps.weight_checksum(steps.trial_variables(sim.model, sim.optimizer)) == before
    assert 1 < found["steps"] == len(found["losses"]) <= lrfind.STEPS
    decided = lrfind.decide(lrfind.sweep_lrs(), found["losses"], 1e-3)
    assert decided == {k: found[k] for k in decided}


def test_a_target_counts_once_held_for_the_validations_asked():
    from benchlib.stateff import emulation
    records = [{"type": "epoch", "val_dice": {"background": 1.0, "liver": d}}
               for d in (0.5, 0.86, 0.84, 0.86, 0.9)]
    assert emulation.held(records[:2], 0.85, 1)
    assert not emulation.held(records[:3], 0.85, 2) and not emulation.held(records[:4], 0.85, 2)
    assert emulation.held(records, 0.85, 2)
    assert study.Emulated(8, 8, 0.85).key() == {"ranks": 8, "sim_ranks": 8, "stop_at": 0.85}
    assert study.Emulated(8, 8, 0.85, 2).key()["hold"] == 2
