"""benchmarks/bench_memory.py in pieces, on a tiny 3D U-Net: one measured run
(``memprobe``'s fresh process) beside its estimate, the round robin's ratios and the
table over it, the Dice check trained through the run's own factory in float32 and
bfloat16, and the results file. Each number is checked for being there and finite,
never for a speed or a memory size, which are this machine's."""

from __future__ import annotations

import json
import math
import sys

from support import BENCHMARKS

sys.path.insert(0, BENCHMARKS)

import bench_memory  # noqa: E402

TINY = {"depth": 1, "base_filters": 2}


def test_a_measured_run_the_ratios_the_dice_check_and_the_results_file(tmp_path):
    measured = bench_memory.run(8, 1, 2, **TINY)
    assert measured["measured_mib"] > 0 and measured["estimate_mib"] > 0
    assert math.isfinite(measured["error_pct"]) and measured["step_cpu_s"] >= 0
    runs = {mode: [dict(measured, **options)] for mode, options in bench_memory.MODES.items()}
    opts = bench_memory.ratios(runs)
    assert opts["plain"]["peak_cut_pct"] == 0.0 and opts["plain"]["step_time_ratio"] == 1.0
    data = (bench_memory.phantom(2, 8, seed=1), bench_memory.phantom(1, 8, seed=2))
    dice = bench_memory.dice_check(1, 1, seeds=(0,), data=data, **TINY)
    assert [r["precision"] for r in dice["runs"]] == ["float32", "bfloat16"]
    assert all(0.0 <= r[k] <= 1.0 for r in dice["runs"] for k in ("dice_organ", "dice_lesion"))
    rows = bench_memory.table([measured], opts, 8, dice)
    assert rows[0][0] == "estimate vs measured peak, 8^3 x 1" and len(rows) == 1 + 5 + 3 + 1
    path = bench_memory.write_results(str(tmp_path), 0.0, rows, accuracy=[measured], options=opts,
                                      runs=runs, dice=dice)
    with open(path) as f:
        written = json.load(f)
    assert [r["measure"] for r in written["rows"]] == [r[0] for r in rows]
    assert set(written) >= {"date", "machine", "accuracy", "options", "runs", "dice"}


def test_the_dice_check_trains_the_liver3d_presets_recipe():
    cfg = bench_memory.dice_config("bfloat16", **TINY)
    assert (cfg.model.spatial_dims, cfg.model.depth, cfg.model.base_filters) == (3, 1, 2)
    assert (cfg.model.precision, cfg.model.num_classes) == ("bfloat16", 3)
    assert (cfg.train.loss, cfg.train.optimizer, cfg.train.lr) == ("dice_ce", "adam", 1e-3)
