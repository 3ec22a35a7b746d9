"""Voxels per second and throughput against input size (``analysis.tables``:
``voxel_rates``, ``throughput_vs_size``, ``run_settings``;
``analysis.mismatch.config_mismatches``; ``analysis.outline.size_sections``;
``analysis.plots.size_figure``).

Logs are hand-built (``tests/analysis_fixtures/runs.py``): 16 training samples, batch 2
per rank, so a 1-rank run takes 8 steps an epoch and a 2-rank run 4; with a step time
``s`` an epoch trains for 8 s (or 4 s) x ``s`` and every rate below follows by hand.
"""

import math
import os

import numpy as np
import pandas as pd
import pytest

from analysis import coverage, outline, plots, render, tables
from analysis.document import Role
from analysis.logs import load_run
from analysis.report import build, write
from tests.analysis_fixtures.runs import RunSpec, write_run

#: The columns of time_per_epoch.csv and scaling.csv before voxel rates were added:
#: they stay first, unchanged (time_per_epoch's columns of the time outside training
#: came after the voxel rates).
OLD_TPE = ["run", "ranks", "nodes", "epochs", "steady_epochs", "time", "warmup_train_s",
           "median_train_s", "mean_train_s", "min_train_s", "max_train_s", "warmup_epoch_s",
           "median_epoch_s", "samples_per_epoch", "throughput_samples_s", "throughput_per_rank",
           "steps_per_epoch", "global_batch_size", "basis", "status"]
OLD_SCALING = ["run", "ranks", "nodes", "base", "scale", "median_train_s", "normalised_time",
               "speedup", "efficiency", "throughput_samples_s", "throughput_speedup",
               "throughput_efficiency"]


def _sized(root, name, shape, size=1, step_time=1.0, **changes):
    """A run at input ``shape`` (2 dims: unet2d, 3: unet3d, a 3D slab in its dataset),
    oneDNN on, 2 intra-op and 1 inter-op threads per rank, pinned."""
    model = {"name": f"unet{len(shape)}d", "input_shape": list(shape)}
    # a 3D run logs slabs, not slices (no samples, train_samples)
    dataset = ({"slab": list(shape), "train_slabs": 16, "val_slabs": 4, "samples": None,
                "train_samples": None} if len(shape) == 3 else {})
    spec = RunSpec(size=size, step_time=step_time, image_size=shape[-1],
                   extra_model_fields=model, extra_dataset_fields=dataset,
                   extra_run_fields={"voxels_per_sample": int(np.prod(shape)), "onednn": True},
                   threads=lambda r: {"intra_op": 2, "inter_op": 1, "pinned": True,
                                      "cores": 2, "affinity": [2 * r, 2 * r + 1]})
    return write_run(str(root / name), spec, **changes)


@pytest.fixture(scope="module")
def slabs(tmp_path_factory):
    """Slabs of 8, 16 and 32 x 32 x 32 on 1 rank, 16 on 2 ranks, a 2D run of 32 x 32,
    and an older log without voxels_per_sample (in that order on the command line)."""
    root = tmp_path_factory.mktemp("slabs")
    return [
        _sized(root, "s32", (32, 32, 32), step_time=1.6),  # 12.8 s: 1.25 samples/s
        _sized(root, "s8", (8, 32, 32), step_time=0.5),  # 4 s an epoch: 4 samples/s
        _sized(root, "s16x2", (16, 32, 32), size=2, step_time=0.8),  # 3.2 s: 5 samples/s
        _sized(root, "s16", (16, 32, 32), step_time=0.8),  # 6.4 s: 2.5 samples/s
        _sized(root, "flat", (32, 32), step_time=0.25),  # 2 s: 8 samples/s
        write_run(str(root / "old"), RunSpec(size=1, step_time=1.0)),  # 8 s: 2 samples/s
    ]


@pytest.fixture(scope="module")
def report(slabs):
    return build(slabs)


def _by_run(frame):
    return frame.set_index("run")


def test_voxel_rates_are_samples_per_second_times_voxels_per_sample(report):
    tpe = _by_run(report.tables.time_per_epoch)
    expected = {  # samples/s, voxels per sample, ranks
        "s32": (1.25, 32768, 1), "s8": (4.0, 8192, 1), "s16x2": (5.0, 16384, 2),
        "s16": (2.5, 16384, 1), "flat": (8.0, 1024, 1)}
    for run, (samples_s, voxels, ranks) in expected.items():
        row = tpe.loc[run]
        assert row["throughput_samples_s"] == pytest.approx(samples_s), run
        assert row["voxels_per_sample"] == voxels
        assert row["throughput_voxels_s"] == pytest.approx(samples_s * voxels), run
        assert row["throughput_voxels_per_rank"] == pytest.approx(samples_s * voxels / ranks)
    assert tpe.loc["s16x2", "throughput_voxels_s"] == pytest.approx(81920.0)
    # an older log: samples/s as before, the voxel columns empty, no error
    assert tpe.loc["old", "throughput_samples_s"] == pytest.approx(2.0)
    assert pd.isna(tpe.loc["old", "voxels_per_sample"])
    assert math.isnan(tpe.loc["old", "throughput_voxels_s"])
    assert math.isnan(tpe.loc["old", "throughput_voxels_per_rank"])


def test_the_old_columns_stay_first_and_unchanged(report, tmp_path):
    write(report, str(tmp_path))
    tpe = pd.read_csv(tmp_path / "time_per_epoch.csv")
    assert list(tpe.columns) == OLD_TPE + list(tables.VOXEL_COLUMNS) + list(tables.OUTSIDE_COLUMNS)
    scaling = pd.read_csv(tmp_path / "scaling.csv")
    assert list(scaling.columns) == OLD_SCALING + ["throughput_voxels_s",
                                                   "throughput_voxels_per_rank"]
    s = scaling.set_index("run")
    assert s.loc["s16x2", "throughput_voxels_s"] == pytest.approx(81920.0)
    assert s.loc["s16x2", "throughput_voxels_per_rank"] == pytest.approx(40960.0)
    assert math.isnan(s.loc["old", "throughput_voxels_s"])
    # the integer size reads as one: 8192, not 8192.0
    assert ",8192," in (tmp_path / "time_per_epoch.csv").read_text()


def test_throughput_against_input_size_groups_by_model_and_ranks(report):
    size = report.tables.throughput_vs_size
    assert list(size.columns) == tables.SIZE_COLUMNS
    # sorted by model, ranks, voxels; the old log is left out
    assert list(size["run"]) == ["flat", "s8", "s16", "s32", "s16x2"]
    assert list(size["input_shape"]) == ["32x32", "8x32x32", "16x32x32", "32x32x32",
                                         "16x32x32"]
    assert list(size["model"]) == ["unet2d", "unet3d", "unet3d", "unet3d", "unet3d"]
    assert list(size["voxels_per_sample"]) == [1024, 8192, 16384, 32768, 16384]
    assert list(size["ranks"]) == [1, 1, 1, 1, 2]
    assert size["throughput_voxels_per_rank"].tolist() == pytest.approx(
        [8192.0, 32768.0, 40960.0, 40960.0, 40960.0])
    assert size["throughput_voxels_s"].tolist() == pytest.approx(
        [8192.0, 32768.0, 40960.0, 40960.0, 81920.0])
    assert list(size["onednn"]) == [True] * 5 and list(size["intra_op_threads"]) == [2] * 5
    assert list(size["batch_per_rank"]) == [2] * 5
    assert tables.compares_sizes(size)
    assert not tables.compares_sizes(size[size["input_shape"] == "16x32x32"])


def test_the_size_sections_show_the_table_and_figure_and_name_runs_left_out(report):
    parts = outline.sections(report.tables, report.notes)
    titles = [s.title for s in parts]
    i = titles.index("Throughput against input size")
    assert titles[i - 1] == "Scaling"
    table, figure = parts[i], parts[i + 1]
    assert table.role is Role.TABLE and figure.role is Role.FIGURE
    assert figure.figure == outline.SIZE_FIGURE == "throughput_vs_size.png"
    assert table.intro.endswith("Runs old logged no voxels_per_sample (older logs) and are "
                                "left out.")
    md = render.markdown(report.document())
    assert "| s16x2 | unet3d | 16x32x32 | 16384 | 2 | 1 | 2 | yes | 2 |" in md


def test_the_figure_draws_one_line_per_model_and_rank_count(report):
    fig = plots.size_figure(report.tables.throughput_vs_size)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert sorted(lines) == ["unet2d, 1 rank", "unet3d, 1 rank", "unet3d, 2 ranks"]
    one = lines["unet3d, 1 rank"]
    assert one.get_xdata().tolist() == [8192, 16384, 32768]
    assert one.get_ydata().tolist() == pytest.approx([32768.0, 40960.0, 40960.0])
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "32x32", "8x32x32", "16x32x32", "32x32x32"]
    assert ax.get_xscale() == "log" and ax.get_ylim()[0] == 0
    plots.plt.close(fig)


def test_the_report_writes_the_figure_only_for_several_sizes(slabs, tmp_path):
    out = str(tmp_path / "out")
    files = write(build(slabs), out)
    assert files["throughput_vs_size_png"] == os.path.join(out, "throughput_vs_size.png")
    with open(files["throughput_vs_size_png"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert len(pd.read_csv(files["throughput_vs_size"])) == 5
    # One size (and an old log): a table of one row, no section, no figure; the figure
    # of the earlier report in the same directory is removed.
    one = build([slabs[3], slabs[5]])
    files = write(one, out)
    assert "throughput_vs_size_png" not in files
    assert not os.path.exists(os.path.join(out, "throughput_vs_size.png"))
    assert list(pd.read_csv(files["throughput_vs_size"])["run"]) == ["s16"]
    assert "Throughput against input size" not in [s.title for s in one.document().sections]


def test_the_runs_table_says_model_input_shape_onednn_and_threads(report):
    runs = _by_run(report.tables.runs)
    s16 = runs.loc["s16"]
    assert (s16["model"], s16["input_shape"], s16["onednn"]) == ("unet3d", "16x32x32", True)
    assert (s16["intra_op_threads"], s16["inter_op_threads"], s16["pinned"]) == (2, 1, True)
    assert s16["train_samples"] == 16
    old = runs.loc["old"]
    assert old["model"] == "unet2d" and old["intra_op_threads"] == 1
    assert pd.isna(old["input_shape"]) and pd.isna(old["onednn"]) and pd.isna(old["pinned"])
    section = outline.runs_section(report.tables, report.unit)
    assert section.columns[-4:] == ("model", "input_shape", "onednn", "intra_op_threads")


def test_older_logs_show_no_empty_voxel_or_setting_columns(slabs):
    rep = build([slabs[5]])
    tpe = outline.time_per_epoch_section(rep.tables)
    assert not [c for c in tpe.columns if "voxels" in c]
    assert "throughput_voxels_s" not in tpe.intro
    runs = outline.runs_section(rep.tables, rep.unit)
    assert "input_shape" not in runs.columns and "onednn" not in runs.columns
    assert "model" in runs.columns  # the fixture's older log names its model
    assert len(rep.tables.throughput_vs_size) == 0


def test_garbled_size_fields_are_left_empty(tmp_path):
    run_dir = write_run(str(tmp_path / "bad"), RunSpec(
        size=1, extra_model_fields={"input_shape": [16, "a", 32], "name": 3},
        extra_run_fields={"voxels_per_sample": True, "onednn": "yes"},
        threads=lambda r: {"intra_op": -1, "pinned": 1}))
    run = load_run(run_dir)
    assert run.input_shape is None and math.isnan(run.voxels_per_sample)
    assert tables.run_settings(run) == {"model": None, "precision": None, "input_shape": None,
                                        "onednn": None, "intra_op_threads": None,
                                        "inter_op_threads": 1, "pinned": None, "lr": "0.005"}
    rep = build([run_dir])
    assert math.isnan(rep.tables.time_per_epoch["throughput_voxels_s"].iloc[0])
    assert len(rep.tables.throughput_vs_size) == 0


def test_runs_at_other_slabs_get_one_warning_naming_the_input_shapes(slabs):
    rep = build([slabs[1], slabs[3]])  # s8, s16: the same model and data otherwise
    runs_notes = [n for n in rep.notes if n.where == "runs"]
    assert [(n.level, n.message) for n in runs_notes] == [(
        "warning", "s8 and s16 differ in input shape: 8x32x32 vs 16x32x32; their samples/s, "
        "times per epoch and scaling numbers are not comparable; compare their voxels/s per "
        "rank (Throughput against input size)")]


def test_another_model_at_the_same_slab_is_still_a_model_warning(tmp_path, slabs):
    deeper = _sized(tmp_path, "deep", (16, 32, 32), step_time=0.8)
    rep = build([slabs[3], deeper])
    assert [n.message for n in rep.notes if n.where == "runs"] == []
    other = _sized(tmp_path, "deeper", (16, 32, 32), step_time=0.8, extra_model_fields={
        "name": "unet3d", "input_shape": [16, 32, 32], "depth": 3})
    messages = [n.message for n in build([slabs[3], other]).notes if n.where == "runs"]
    assert messages == ["s16 and deeper differ in model: depth 2 vs 3; their scaling numbers "
                        "are not comparable"]


def test_a_3d_run_counts_its_slabs_and_each_slab_shape_votes_alone(slabs):
    s8, s16 = load_run(slabs[1]), load_run(slabs[3])
    assert s8.train_samples == 16  # dataset.train_slabs
    assert _by_run(build([slabs[1]]).tables.coverage)["covered"].all()
    assert coverage.dataset_key(s8) != coverage.dataset_key(s16)
    flat = load_run(slabs[4])
    assert coverage.dataset_key(flat) == coverage.dataset_key(load_run(slabs[5]))
