"""``analysis.logfile``, ``summary``, ``launches`` and ``logs``: each step of the
``load_run`` pipeline alone, on hand-built logs.

The logs are a few records written with ``tests/analysis_fixtures/runs.py``'s record
builders, so every number below (launch durations, offsets, wall-clock times, which
rank's curve is kept) follows from the records by hand.
"""

import json
import os
import subprocess
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from analysis import launches, logfile, logs, summary
from distseg.core import rundir, schema
from distseg.core.errors import InputError
from tests.analysis_fixtures.runs import (
    Launch,
    RunSpec,
    end_record,
    epoch_record,
    run_record,
    step,
    write_log,
    write_run,
)

from support import BIN, command_env


@pytest.fixture
def resumed(tmp_path):
    """Two ranks, two launches (start times 100 and 200); rank 1 logs more steps.

    Launch 0 lasts 3.5 s (rank 1's epoch record), launch 1 lasts 4 s (rank 0's end).
    """
    run_dir = str(tmp_path / "resumed")
    write_log(run_dir, 0, [
        run_record(0, 2, start_time=100.0, run_id="a"), step(0, 0, 0, 1.0), step(0, 0, 1, 2.0),
        epoch_record(0, 0, 3.0), run_record(0, 2, start_time=200.0, run_id="b"),
        step(0, 1, 0, 1.5), epoch_record(0, 1, 2.5), end_record(0, 4.0)])
    write_log(run_dir, 1, [
        run_record(1, 2, start_time=100.0, run_id="a", host="node1"), step(1, 0, 0, 1.0),
        epoch_record(1, 0, 3.5), run_record(1, 2, start_time=200.0, run_id="b", host="node1"),
        step(1, 1, 0, 1.0), step(1, 1, 1, 2.0), step(1, 1, 2, 3.0), end_record(1, 3.2)])
    return run_dir


def _read(run_dir):
    return logs.read_logs(logs.check_run_dir(run_dir))


# ----------------------------------------------------------------------------- one file


def test_read_rank_log_files_records_by_type_and_places_steps_after_run_records(resumed):
    log = logfile.read_rank_log(rundir.log_path(resumed, 0), 0)
    assert [r["run_id"] for r in log.runs] == ["a", "b"]
    assert [r["_segment"] for r in log.epochs] == [0, 1]
    assert [r["_segment"] for r in log.ends] == [1]
    assert list(log.steps["segment"]) == [0, 0, 1]
    assert list(log.steps["t"]) == [1.0, 2.0, 1.5]
    assert not log.notes and not log.unknown_fields


def test_a_newer_schema_version_is_refused_naming_the_file(tmp_path):
    newer = schema.SCHEMA_VERSION + 1
    path = write_log(str(tmp_path / "new"), 0, [run_record(0, 1, schema_version=newer),
                                                step(0, 0, 0, 1.0)])
    with pytest.raises(InputError) as e:
        logfile.read_rank_log(path, 0)
    assert str(e.value) == (f"{path}: schema_version {newer} is newer than this distseg reads "
                            f"({schema.SCHEMA_VERSION}); upgrade distseg to read it")
    assert e.value.exit_code == 2
    # The current version and a record without one (only noted) are read.
    for rec in (run_record(0, 1), {k: v for k, v in run_record(0, 1).items()
                                   if k != "schema_version"}):
        write_log(str(tmp_path / "new"), 0, [rec, step(0, 0, 0, 1.0)])
        assert len(logfile.read_rank_log(path, 0).steps) == 1


def test_the_command_refuses_a_newer_log_with_one_line_and_exit_2(tmp_path):
    run_dir = str(tmp_path / "np1")
    path = write_log(run_dir, 0, [run_record(0, 1, schema_version=7), step(0, 0, 0, 1.0)])
    proc = subprocess.run([os.path.join(BIN, "distseg-report"), run_dir, "--no-progress",
                           "--out", str(tmp_path / "r")], capture_output=True, text=True,
                          timeout=120, env=command_env(), cwd=str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr == (f"error: {path}: schema_version 7 is newer than this distseg "
                           f"reads ({schema.SCHEMA_VERSION}); upgrade distseg to read it\n")
    assert not (tmp_path / "r").exists()


def test_segment_steps_numbers_steps_by_the_run_record_before_them():
    steps = pd.DataFrame({"_line": [0, 2, 5, 9], **{f: [1.0] * 4 for f in logfile.STEP_FIELDS}})
    steps["lr"] = np.nan
    notes = []
    out = logfile.segment_steps(steps, [1, 6], "f", notes)
    assert list(out["segment"]) == [-1, 0, 0, 1] and "_line" not in out
    assert [n.line() for n in notes] == ["[warning] f: step records lack field 'lr'"]


# ----------------------------------------------------------------------------- reducing a file


def test_placed_steps_drops_steps_before_a_run_record_or_without_t():
    steps = pd.DataFrame({"segment": [-1, 0, 0, 1, -1], "t": [1.0, np.nan, 2.0, 3.0, np.nan]})
    kept, notes = summary.placed_steps(steps, "f")
    assert list(kept["t"]) == [2.0, 3.0]
    assert [n.message for n in notes] == [
        "2 step record(s) before any run record (cannot be placed in time)",
        "1 step record(s) without a time t"]


def test_compact_steps_marks_the_first_epoch_of_each_segment_as_warmup():
    steps = pd.DataFrame({"segment": [0, 0, 0, 1, 1], "epoch": [0, 0, 1, 2, np.nan],
                          "step_time": [3.0, 3.0, 1.0, 2.0, 1.0], "data_wait": 0.5,
                          "samples": 2.0})
    c = summary.compact_steps(7, steps)
    assert list(c["rank"]) == [7] * 5 and c["rank"].dtype == np.int32
    assert list(c["warmup"]) == [True, True, False, True, False]
    assert list(c["epoch"]) == [0, 0, 1, 2, -1]  # a missing epoch becomes -1
    assert list(c["step_time"]) == [3.0, 3.0, 1.0, 2.0, 1.0]


def test_curve_steps_keeps_loss_and_lr_and_integer_counters():
    steps = pd.DataFrame({"segment": [0, 0], "epoch": [0.0, 0.0], "step": [0.0, np.nan],
                          "global_step": [4.0, 5.0], "t": [1.0, 2.0], "loss": [-0.1, -0.2],
                          "lr": [0.1, 0.1]})
    c = summary.curve_steps(steps)
    assert list(c.columns) == ["segment", "epoch", "step", "global_step", "t", "loss", "lr"]
    assert list(c["step"]) == [0, -1] and list(c["global_step"]) == [4, 5]
    assert list(c["loss"]) == [-0.1, -0.2]


def test_read_logs_keeps_the_curve_of_the_rank_with_most_steps(resumed):
    sizes = []
    read = logs.read_logs(logs.check_run_dir(resumed), progress=sizes.append)
    assert read.curve_rank == 1 and read.curve.records == 4 and len(read.curve.thin) == 4
    assert sizes == [os.path.getsize(rundir.log_path(resumed, r))
                     for r in (0, 1)]
    # the largest t of each launch in each file: steps, epoch and end records
    assert [log.tmax for log in read.logs] == [{0: 3.0, 1: 4.0}, {0: 3.5, 1: 3.2}]
    r0 = read.logs[0].stats.set_index("basis")
    assert list(r0.loc["all", ["steps", "mean_step_s"]]) == [3, 1.0]
    assert "steady" not in r0.index  # each step is in its launch's first (warm-up) epoch
    assert all(log.curve is None for log in read.logs)  # only the kept curve is alive


def test_read_logs_breaks_a_tie_towards_the_lowest_rank(tmp_path):
    run_dir = str(tmp_path / "tie")
    for rank in (0, 1):
        write_log(run_dir, rank, [run_record(rank, 2), step(rank, 0, 0, 1.0 + rank)])
    read = _read(run_dir)
    assert read.curve_rank == 0 and list(read.curve.thin["t"]) == [1.0]


def test_unknown_fields_notes_name_eight_and_count_the_rest():
    counts = Counter({f"step.f{i}": 1 for i in range(10)})
    (note,) = logs.unknown_fields_notes(counts, 3, "run")
    assert note.message.endswith("step.f7 (1 of 3 logs) and 2 more")
    assert note.message.count("(1 of 3 logs)") == 8
    assert logs.unknown_fields_notes(Counter(), 3, "run") == []


# ----------------------------------------------------------------------------- launches


def test_launches_are_matched_across_ranks_and_timed(resumed):
    read = _read(resumed)
    mapped = launches.map_launches(read.logs)
    assert mapped.keys == [(100.0, "a"), (200.0, "b")] and mapped.last == 1
    assert mapped.maps == {0: {0: 0, 1: 1}, 1: {0: 0, 1: 1}}
    durations = launches.launch_durations(read.logs, mapped)
    assert list(durations) == [3.5, 4.0]
    assert list(launches.offsets_of(durations)) == [0.0, 3.5]
    table = launches.launch_table(read.logs, mapped)
    assert list(table["run_id"]) == ["a", "b"] and list(table["ranks_logged"]) == [2, 2]
    assert list(table["start_time"]) == [100.0, 200.0] and list(table["size"]) == [2, 2]
    assert list(table["nodes"]) == [2, 2]
    assert [n.message for n in launches.launch_notes(table, "r")] == [
        "resumed run: 2 launches; wall-clock time is the sum of their durations"]


def test_launch_notes_warn_when_config_or_size_change_and_when_there_is_none():
    table = pd.DataFrame({"config_hash": ["x", "y"], "size": [2, 4]})
    assert [n.message for n in launches.launch_notes(table, "r")][1:] == [
        "the config changed between launches (config hashes x, y)",
        "the number of ranks changed between launches (2, 4)"]
    (none,) = launches.launch_notes(table.iloc[:0], "r")
    assert none.level == "warning" and none.message.startswith("no run record in any log")


def test_identify_takes_the_last_launch_of_the_lowest_rank(resumed):
    read = _read(resumed)
    who = launches.identify(read.logs, launches.map_launches(read.logs))
    assert who.size == 2 and who.run_record["run_id"] == "b" and who.run_record["rank"] == 0
    assert who.rank_hosts == {0: "node0", 1: "node1"} and who.hosts == ["node0", "node1"]


def test_steps_and_curve_on_the_runs_wall_clock(resumed):
    read = _read(resumed)
    mapped = launches.map_launches(read.logs)
    offsets = np.array([0.0, 3.5])
    curve = logs.global_curve(read.curve, read.curve_rank, mapped, offsets, "r")
    assert list(curve.frame["wall_s"]) == [1.0, 4.5, 5.5, 6.5] and not curve.notes
    assert list(curve.frame["segment"]) == [0, 1, 1, 1]
    stats = logs.combine_stats(read.logs)
    # each launch's steps are all in its first epoch: warm-up, so no steady basis
    assert list(zip(stats["rank"], stats["basis"], stats["steps"])) == [(0, "all", 3),
                                                                        (1, "all", 4)]
    assert all(log.stats is None for log in read.logs)  # freed: the frame is all that is kept
    empty = logs.global_curve(None, None, mapped, offsets, "r")
    assert len(empty.frame) == 0 and len(empty.crossings) == 0
    assert [n.message for n in empty.notes] == ["no step records; no loss curve"]


# ----------------------------------------------------------------------------- epochs, status


def test_epoch_table_places_epochs_on_the_wall_clock(resumed):
    read = _read(resumed)
    mapped = launches.map_launches(read.logs)
    epochs, classes, notes = logs.epoch_table(read.logs, mapped, np.array([0.0, 3.5]), "r")
    assert list(zip(epochs["rank"], epochs["epoch"], epochs["wall_s"])) == [
        (0, 0, 3.0), (0, 1, 6.0), (1, 0, 3.5)]
    assert classes == ["liver"] and list(epochs["dice_liver"]) == [0.5] * 3 and not notes


def test_epoch_table_keeps_the_later_of_a_repeated_epoch_and_notes_the_unplaceable(tmp_path):
    run_dir = str(tmp_path / "rep")
    write_log(run_dir, 0, [
        epoch_record(0, 9, 1.0),  # before any run record
        run_record(0, 1, start_time=100.0), epoch_record(0, 0, 4.0), epoch_record(0, 1, 8.0),
        run_record(0, 1, start_time=200.0), epoch_record(0, 1, 5.0, train_loss=-0.7),
        {**epoch_record(0, 2, 9.0), "epoch": None}])
    read = _read(run_dir)
    mapped = launches.map_launches(read.logs)
    offsets = launches.offsets_of(launches.launch_durations(read.logs, mapped))
    epochs, _, notes = logs.epoch_table(read.logs, mapped, offsets, "r")
    assert list(offsets) == [0.0, 8.0]
    assert list(epochs["epoch"]) == [0, 1] and list(epochs["wall_s"]) == [4.0, 13.0]
    assert epochs["train_loss"].iloc[1] == -0.7  # the resumed launch's record
    assert [n.message for n in notes] == [
        "1 epoch record(s) without an epoch number",
        "1 epoch record(s) repeated by a resumed launch; the later ones are used",
        "1 epoch record(s) before any run record"]


def test_run_status_reads_the_last_launchs_end_records(resumed):
    read = _read(resumed)
    mapped = launches.map_launches(read.logs)
    who = launches.identify(read.logs, mapped)
    assert logs.run_status(read.logs, mapped, who) == ("ok", True)
    assert logs._status([{"status": "ok"}], 4) == (
        "ok on 1 of 4 ranks (others still running or killed)", False)
    assert logs._status([{"status": "ok"}, {"status": "error", "reason": " boom "}], 2) == (
        "error: boom", False)


def test_rank_notes_name_missing_and_extra_ranks():
    missing, extra = logs.rank_notes([0, 2, 5], 4, "r")
    assert missing.message == ("log of rank(s) 1, 3 missing (2 of 4); sums over ranks are "
                               "extrapolated")
    assert extra.level == "warning" and extra.message.startswith("logs of rank(s) [5]")
    assert logs.rank_notes([0], None, "r") == []


def test_read_config_notes_a_missing_or_broken_config(tmp_path):
    assert logs.read_config(str(tmp_path), "r")[1][0].level == "info"
    (tmp_path / rundir.CONFIG_FILE).write_text("{not json")
    config, (note,) = logs.read_config(str(tmp_path), "r")
    assert config is None and note.level == "warning" and "cannot be read as JSON" in note.message
    (tmp_path / rundir.CONFIG_FILE).write_text(json.dumps({"train": {"seed": 3}}))
    assert logs.read_config(str(tmp_path), "r") == ({"train": {"seed": 3}}, [])


def test_load_run_combines_the_steps(resumed):
    run = logs.load_run(resumed)
    assert (run.label, run.size, run.nodes, run.finished) == ("resumed", 2, 2, True)
    assert list(run.segments["duration_s"]) == [3.5, 4.0]
    assert list(run.segments["offset_s"]) == [0.0, 3.5]
    assert run.curve_rank == 1 and int(run.step_stats.query("basis == 'all'")["steps"].sum()) == 7
    assert run.dataset == {"train_samples": 16}
    assert [n.message for n in run.notes] == [
        f"{rundir.config_path(resumed)} is missing; config comparisons use the "
        "run records only",
        "resumed run: 2 launches; wall-clock time is the sum of their durations"]


def test_dict_field_trusts_only_objects():
    rec = {"dataset": {"samples": 3}, "model": "unet"}
    assert logfile.dict_field(rec, "dataset") == {"samples": 3}
    assert logfile.dict_field(rec, "model") is None and logfile.dict_field(rec, "nope") is None


# ----------------------------------------------------------------------------- nodes


def test_nodes_of_a_resumed_run_are_the_most_any_launch_ran_on(tmp_path):
    # 2 ranks on hosts a and b, resumed on one fresh host c: the run never used 3 nodes
    # at once (distinct hosts over all records) nor only 1 (the last launch's).
    shrunk = logs.load_run(write_run(str(tmp_path / "shrunk"), RunSpec(
        size=2, epochs=4, hosts=["a", "b"],
        launches=[Launch(0, 2), Launch(2, 4, hosts=["c", "c"])])))
    assert (shrunk.nodes, shrunk.hosts) == (2, ["a", "b"])
    assert list(shrunk.segments["nodes"]) == [2, 1]
    assert shrunk.rank_hosts == {0: "c", 1: "c"}  # rank balance: the last launch's hosts
    assert ("the number of nodes changed between launches (2, 1); nodes is the most any "
            "launch ran on") in [n.message for n in shrunk.notes]
    # resumed on a fresh allocation of as many nodes: still 2, and no warning
    moved = logs.load_run(write_run(str(tmp_path / "moved"), RunSpec(
        size=2, epochs=4, hosts=["a", "b"],
        launches=[Launch(0, 2), Launch(2, 4, hosts=["c", "d"])])))
    assert (moved.nodes, moved.hosts) == (2, ["c", "d"])
    assert not [n for n in moved.notes if n.level == "warning"]


def test_placement_records_each_ranks_host_and_cpus(tmp_path):
    run = logs.load_run(write_run(str(tmp_path / "np2"), RunSpec(
        size=2, threads=lambda r: {"cores": 1, "affinity": [r, r + 2]})))
    p = run.placement
    assert list(p["host"]) == ["node0", "node0"] and list(p["local_size"]) == [2, 2]
    assert list(p["affinity"]) == [(0, 2), (1, 3)] and list(p["cpus"]) == [2, 2]
    assert list(p["cores"]) == [1, 1]


def test_optional_step_fields_of_the_schema_are_not_called_unknown(tmp_path):
    # Fields the trainer may add (schema.OPTIONAL, e.g. ``skipped``) are known; others not.
    extra = {name: True for name in schema.OPTIONAL["step"]}
    path = write_log(str(tmp_path / "r"), 0, [run_record(0, 1), step(0, 0, 0, 1.0, **extra,
                                                                     gpu_mem=3)])
    log = logfile.read_rank_log(path, 0)
    assert log.unknown_fields == {"step.gpu_mem"} and len(log.steps) == 1
