"""The pieces of ``make bench`` (benchmarks/bench_table.py) that must be right for its
table to mean anything: the FLOP counter against hand counts, the table printer
(goal beside measured), the reader of the statistical-efficiency results, and the
local copies whose speed the benchmark compares with distseg's own (Keras' own
normalisation layers, the compiled weight checksum)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from support import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))

from benchlib import table  # noqa: E402
from benchlib.table import Goal  # noqa: E402

# --- FLOPs ---------------------------------------------------------------------------


def test_flops_of_conv_transposed_conv_and_dense_match_a_hand_count():
    import keras

    from benchlib.flops import count_training_flops
    x = keras.Input((8, 8, 2))
    y = keras.layers.Conv2D(4, 3, padding="same", name="c")(x)
    y = keras.layers.Conv2DTranspose(3, 2, strides=2, name="t")(y)
    y = keras.layers.Dense(5, name="d")(y)  # on the last axis of (16, 16, 3)
    y = keras.layers.Flatten()(y)
    y = keras.layers.Dense(7, name="f")(y)
    counted = count_training_flops(keras.Model(x, y))
    conv = 2 * 3 * 3 * 2 * 4 * 8 * 8        # output pixels x kernel x C_in x C_out
    transposed = 2 * 2 * 2 * 4 * 3 * 8 * 8  # input pixels x kernel x C_in x C_out
    dense = 2 * 3 * 5 * 16 * 16
    flat = 2 * (16 * 16 * 5) * 7
    assert counted["layers"] == {"c": conv, "t": transposed, "d": dense, "f": flat}
    assert counted["forward"] == conv + transposed + dense + flat == 40_960
    # The input layer's gradient w.r.t. its input is never computed.
    assert counted["train"] == 3 * counted["forward"] - conv == 113_664


def test_flops_of_a_depth_1_unet_match_a_hand_count():
    from distseg.networks import unet as model_lib

    from benchlib.flops import count_training_flops
    counted = count_training_flops(model_lib.build_unet(16, depth=1, base_filters=2, num_classes=2))
    by_hand = {
        "down0_conv1": 2 * 9 * 1 * 2 * 16 * 16, "down0_conv2": 2 * 9 * 2 * 2 * 16 * 16,
        "bottleneck_conv1": 2 * 9 * 2 * 4 * 8 * 8, "bottleneck_conv2": 2 * 9 * 4 * 4 * 8 * 8,
        "up0": 2 * 4 * 4 * 2 * 8 * 8,
        "dec0_conv1": 2 * 9 * 4 * 2 * 16 * 16, "dec0_conv2": 2 * 9 * 2 * 2 * 16 * 16,
        "probs": 2 * 1 * 2 * 2 * 16 * 16,
    }
    assert counted["layers"] == by_hand
    assert counted["forward"] == 116_736
    assert counted["train"] == 3 * 116_736 - by_hand["down0_conv1"]


# --- the table ---------------------------------------------------------------------


def test_table_puts_goal_and_measured_side_by_side():
    rows = [table.measured_row("2 ranks / 1 rank", Goal(">=", 1.9), 1.84, "31 vs 16.9 samples/s"),
            table.measured_row("data wait share", Goal("<", 2.0, "%", "{:g}"), 0.004, fmt="{:.3f}"),
            table.measured_row("allreduce / memcpy", None, 0.031, fmt="{:.3f}"),
            table.measured_row("bf16 / fp32", Goal(">=", 1.3), None)]
    lines = table.format_table(rows).splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert cells[0] == ["measure", "goal", "measured", "met", "detail"]
    assert set(lines[1]) == {"|", "-"}
    assert cells[2] == ["2 ranks / 1 rank", ">= 1.90", "1.84", "NO", "31 vs 16.9 samples/s"]
    assert cells[3][:4] == ["data wait share", "< 2%", "0.004%", "yes"]
    assert cells[4][:4] == ["allreduce / memcpy", "-", "0.031", ""]
    assert cells[5][:4] == ["bf16 / fp32", ">= 1.30", "not measured", ""]
    assert len({len(line) for line in lines}) == 1  # columns aligned
    assert rows[0].met is False and rows[1].met is True and rows[2].met is None


def test_goal_operators():
    assert Goal(">=", 1.0).met(1.0) and not Goal(">=", 1.0).met(0.99)
    assert Goal("<", 2.0).met(1.99) and not Goal("<", 2.0).met(2.0)
    assert Goal("<=", 2.0).met(2.0) and Goal(">", 0.5).met(0.51)


def test_strong_scaling_rows_and_their_runs():
    """Issue 21's rows: per-rank batches against 8 on one rank, and the global loss's cost
    as 1 - distseg-2 / distseg-2+localloss; their runs join every make bench and are
    not repeated as A/B rows."""
    import bench_table
    s = bench_table.parse_args(["--data", "x.h5"])
    assert s.ab == [*(f"distseg-1+b{b}" for b in (1, 2, 4)), "distseg-2+localloss"]
    assert bench_table.parse_args(["--data", "x.h5", "--skip", "strong_scaling"]).ab == []
    cmd = bench_table.distseg_command("distseg-1+b2", s, "/tmp/r")[0]
    # distseg-train takes the last --batch-size given: the change's, after the base one.
    assert cmd[len(cmd) - cmd[::-1].index("--batch-size")] == "2" and cmd.count("--batch-size") == 2
    runs = {"distseg-1": [{"samples_per_s": 20.0}], "distseg-1+b1": [{"samples_per_s": 10.0}],
            "distseg-1+b2": [{"samples_per_s": 15.0}], "distseg-1+b4": [{"samples_per_s": 18.0}],
            "distseg-2": [{"samples_per_s": 33.0}], "distseg-2+localloss": [{"samples_per_s": 34.0}]}
    rows = bench_table.strong_scaling_rows({"training": {"runs": runs}})
    assert [r.value for r in rows[:3]] == [0.5, 0.75, 0.9]
    assert rows[3].value == pytest.approx(100 * (1 - 33 / 34)) and rows[3].met is True
    assert bench_table.ab_rows({"training": {"runs": runs}}) == []


# --- the statistical-efficiency rows ------------------------------------------------


def test_stateff_rows_without_a_file_say_how_to_measure_them(tmp_path):
    rows = table.stateff_rows(str(tmp_path), ("a", "b"))
    assert [(r.measure, r.measured) for r in rows] == [
        ("a", "not measured (run make bench-stateff)"), ("b", "not measured (run make bench-stateff)")]


def test_stateff_rows_come_from_the_newest_file_with_its_date(tmp_path):
    old = tmp_path / "stateff-2026-01-01.json"
    old.write_text(json.dumps({"rows": [{"measure": "old", "goal": ">= 1", "measured": 0.5}]}))
    os.utime(old, (1e9, 1e9))
    new = tmp_path / "stateff-2026-02-03.json"
    new.write_text(json.dumps({"date": "2026-02-03 10:00", "extra": {"ignored": True}, "rows": [
        {"measure": "time to target 2 vs 1", "goal": ">= 1.8", "measured": 1.75, "met": False},
        {"measure": "Dice drops", "goal": "<= 0.1", "measured": {"value": 0.04, "unit": ""}}]}))
    rows = table.stateff_rows(str(tmp_path))
    assert [(r.measure, r.goal, r.measured, r.met) for r in rows] == [
        ("time to target 2 vs 1", ">= 1.8", "1.75", False), ("Dice drops", "<= 0.1", "0.04", None)]
    assert all("stateff-2026-02-03.json, measured 2026-02-03 10:00" in r.detail for r in rows)
    assert rows[0].value == 1.75


def test_an_unreadable_stateff_file_is_named(tmp_path):
    (tmp_path / "stateff-x.json").write_text('{"rows": 3}')
    rows = table.stateff_rows(str(tmp_path))
    assert len(rows) == 1 and rows[0].measured.startswith("unreadable: stateff-x.json (expected")
    (tmp_path / "stateff-x.json").write_text("{not json")
    assert table.stateff_rows(str(tmp_path))[0].measured.startswith("unreadable: stateff-x.json")


# --- the local copies the benchmark times against distseg's own --------------------


@pytest.mark.parametrize("norm,variant,suffix", [("batch", "kerasbn", "_bn"), ("group", "kerasgn", "_gn")])
def test_model_variant_is_distsegs_model_with_one_layer_type_swapped(norm, variant, suffix):
    import dataclasses

    import keras

    from distseg.core import config as config_lib
    from distseg.networks import unet as model_lib

    from benchlib import model_variants
    cfg = dataclasses.replace(config_lib.PRESETS["smoke"]().model, norm=norm, num_classes=3)
    plain = model_variants.build(cfg)
    swapped = model_variants.build(cfg, variant=variant)
    ours, theirs = model_lib.NORM_LAYERS[norm], model_variants.KERAS_NORMS[variant][norm]
    assert theirs in (keras.layers.BatchNormalization, keras.layers.GroupNormalization)
    assert {type(layer) for layer in swapped.layers if suffix in layer.name} == {theirs}
    assert {type(layer) for layer in plain.layers if suffix in layer.name} == {ours}
    assert [w.path for w in plain.weights] == [w.path for w in swapped.weights]
    assert model_lib.NORM_LAYERS[norm] is ours  # the swap is undone


def test_compiled_weight_checksum_matches_distseg_and_follows_updates():
    import keras

    from distseg.networks import unet as model_lib
    from distseg.training.step import steps

    from benchlib.step_variants import compiled_weight_checksum
    model = model_lib.build_unet(16, depth=1, base_filters=2, num_classes=2)
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    synced = model.weights + optimizer.variables
    for _ in range(2):
        np.testing.assert_allclose(compiled_weight_checksum(synced), steps.weight_checksum(synced),
                                   rtol=1e-12)
        synced[0].assign(synced[0] + 1.0)  # a compiled call must read the new values


_STEP_VARIANTS_SCRIPT = """
import json, sys
import keras, numpy as np
from benchlib import step_variants
from distseg.parallel import distributed as dist
from distseg.networks import unet as model_lib
from distseg.training.step import steps
dist.init()
rng = np.random.default_rng(0)
images = rng.random((2, 16, 16, 1)).astype(np.float32)
masks = rng.integers(0, 3, (2, 16, 16)).astype(np.uint8)
flags = np.zeros(2, np.float32)
out = {}
for name in ["distseg", *step_variants.VARIANTS]:
    keras.utils.set_random_seed(1)
    model = model_lib.build_unet(16, depth=1, base_filters=2, num_classes=3)
    optimizer = keras.optimizers.Adam(1e-2)
    build = steps.make_train_step if name == "distseg" else step_variants.VARIANTS[name]
    step = build(model, optimizer, (16, 16), 3, "dice", ranks=1, batch=2)  # as the loop calls it
    loss = float(step(images, masks, flags).loss)
    out[name] = [loss, *[float(np.abs(np.asarray(w)).sum()) for w in model.weights]]
print(json.dumps(out))
"""


def test_every_step_variant_makes_distsegs_update_on_one_rank(tmp_path):
    # The variants take a cost out of distseg's step (a check, a copy, the allreduce of
    # one rank); on finite data and one rank each must make the very same update, or
    # the A/B would time a different computation.
    import subprocess
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "benchmarks"), REPO]),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", _STEP_VARIANTS_SCRIPT], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    want = got.pop("distseg")
    assert len(got) >= 5
    for name, values in got.items():
        np.testing.assert_allclose(values, want, rtol=1e-5, err_msg=name)
