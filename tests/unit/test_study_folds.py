"""benchmarks/study_folds.py's arithmetic: the recipes it reads, the fall it measures and
the table of means and spreads over folds, on hand-built rows whose answers are known.
The runs themselves are distseg-train's (tested in tests/e2e)."""

from __future__ import annotations

import argparse
import os
import sys

import pytest

from support import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import study_folds  # noqa: E402


def test_a_recipe_is_a_name_and_the_flags_a_shell_would_give():
    assert study_folds.recipe("demo=") == ("demo", [])
    assert study_folds.recipe("in=--norm instance --loss dice_ce") == (
        "in", ["--norm", "instance", "--loss", "dice_ce"])
    for bad in ("no-equals", "=--norm group"):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME=FLAGS"):
            study_folds.recipe(bad)


def test_the_largest_fall_is_read_in_the_second_half_only():
    assert study_folds.largest_fall([0.1, 0.9, 0.2, 0.5, 0.6, 0.4, 0.45, 0.3]) == pytest.approx(0.2)
    assert study_folds.largest_fall([0.1, 0.2, 0.3, 0.4]) == 0.0
    assert study_folds.largest_fall([0.5, None, 0.7, None, 0.6]) == pytest.approx(0.1)


def test_the_table_gives_mean_sd_and_range_per_recipe_and_rank_count():
    rows = [{"recipe": "bn", "flags": [], "ranks": 1, "final": f, "best": f + 0.1, "fall": fall}
            for f, fall in ((0.7, 0.0), (0.8, 0.05), (0.9, 0.02))]
    rows.append({"recipe": "in", "flags": ["--norm", "instance"], "ranks": 2, "final": 0.5,
                 "best": 0.6, "fall": 0.3})
    lines = study_folds.table(rows).splitlines()
    assert lines[2] == ("| bn | `(the preset's)` | 1 | 3 | 0.800 ± 0.100 (0.700-0.900) | "
                        "0.900 ± 0.100 (0.800-1.000) | 0.050 |")
    assert lines[3] == ("| in | `--norm instance` | 2 | 1 | 0.500 ± 0.000 (0.500-0.500) | "
                        "0.600 ± 0.000 (0.600-0.600) | 0.300 |")
