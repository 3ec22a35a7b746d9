"""benchmarks/study_lr_phantom.py (part of ``make bench-stateff``) in pieces: the
config of an arm (fixed lr or ``--lr auto``, the study's small GroupNorm U-Net at a
fixed global batch), one real emulated run of it on a tiny 64x64 phantom in its own
pinned process, read back into the study's row, and the goal rows and the results
file from hand-built rows whose ratios are known."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import pytest

from support import BENCHMARKS

sys.path.insert(0, BENCHMARKS)

import study_lr_phantom  # noqa: E402

from benchlib.stateff import study  # noqa: E402


def settings(**changes) -> argparse.Namespace:
    a = study_lr_phantom.parse_args(["--seeds", "0", "1", "2", "--choose-seeds", "3"])
    return argparse.Namespace(**{**vars(a), **changes})


def test_an_arms_config_is_the_studys_small_model_at_its_fixed_global_batch():
    a = settings(every=128, budget=1024, warmup=0.25)
    fixed = study_lr_phantom.arm_config(a, {"lr": 2.0, "schedule": "cosine"}, 4, 512)
    assert fixed["model"]["norm"] == "group" and fixed["model"]["image_size"] == 64
    t = fixed["train"]
    assert (t["epochs"], t["max_steps_per_epoch"], t["global_batch"], t["seed"]) == (8, 16, 8, 4)
    assert (t["lr"], t["lr_schedule"], t["warmup_epochs"]) == (2e-3, "cosine", 1.0)
    auto = study_lr_phantom.arm_config(a, {"lr": "auto", "schedule": "poly"}, 4, 512)["train"]
    assert auto["lr_auto"] is True and "lr" not in auto


def test_one_emulated_run_on_a_tiny_phantom_makes_the_studys_row(tmp_path):
    from distseg.data import synth
    data = str(tmp_path / "phantom64.h5")
    synth.make_dataset(data, cases=4, size=64, seed=0, slices_per_case=4)
    a = settings(every=8, budget=16, target=0.99)
    row = study_lr_phantom.run(a, {"lr": 1.0, "schedule": "constant"}, 0, 0, str(tmp_path), data,
                               study.train_samples(data))
    assert row["arm"] == "x1-constant" and row["lr"] == study_lr_phantom.BASE_LR
    assert len(row["dice"]) == 2 and all(0.0 <= d <= 1.0 for d in row["dice"])
    assert row["samples"] == math.inf or row["samples"] in (0, 8)
    assert row["range_steps"] is None


def hand_row(arm: str, seed: int, samples: float) -> dict:
    return {"arm": arm, "seed": seed, "lr": 1e-3, "samples": samples, "final": 0.9, "peak": 0.9}


def test_the_goal_rows_and_the_results_file_from_known_rows(tmp_path):
    a = settings(results_dir=str(tmp_path))
    samples = {"x1-constant": [1000, 1200, 800], "x2-constant": [600, 700, 900],
               "x4-constant": [900, 1000, 1100], "auto-constant": [640, 700, 990],
               "auto-cosine": [500, 600, math.inf]}
    rows = [hand_row(arm, s, n[s]) for arm, n in samples.items() for s in (0, 1, 2)]
    goals = study_lr_phantom.goal_rows(a, rows, "cosine")
    assert goals[0]["per_seed"] == [0.5, 0.5, math.inf]
    assert goals[0]["measured"] == 0.5 and goals[0]["met"] is False  # a seed above 1
    assert "x2-constant" in goals[1]["measure"] and "NOT bracketed" not in goals[1]["measure"]
    assert goals[1]["per_seed"] == pytest.approx([640 / 600, 1.0, 990 / 900])
    choosing = [hand_row(f"auto-{s}", 3, 100.0) for s in study_lr_phantom.SCHEDULES]
    path = study_lr_phantom.report(a, choosing, rows, "cosine")
    assert os.path.basename(path).startswith("lr-phantom-b8-")
    with open(path) as f:
        result = json.load(f)
    assert result["chosen_schedule"] == "cosine" and len(result["runs"]) == len(rows)
    assert [g["measure"] for g in result["goals"]] == [g["measure"] for g in goals]
