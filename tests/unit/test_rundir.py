"""``distseg.core.rundir``: the one spelling of a run directory's layout, which the
trainer writes, the report and ``distseg-jobs`` read, and the Slurm scripts repeat."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from analysis import logs
from distseg.core import rundir

from support import REPO


def test_the_layout_is_what_the_docs_and_old_runs_say():
    """These names are a file format: runs written before must still be found."""
    run = os.path.join("runs", "np2")
    assert rundir.config_path(run) == os.path.join(run, "config.json")
    assert rundir.log_path(run, 3) == os.path.join(run, "logs", "rank-00003.jsonl")
    assert rundir.log_paths(run, 2) == {0: os.path.join(run, "logs", "rank-00000.jsonl"),
                                        1: os.path.join(run, "logs", "rank-00001.jsonl")}
    assert rundir.latest_path(run) == os.path.join(run, "checkpoints", "latest.json")
    assert rundir.checkpoint_stem(3) == "epoch-0003"
    assert rundir.checkpoint_stem(3, 12) == "epoch-0003-step-000012"
    assert [rundir.checkpoint_file("epoch-0003", k) for k in rundir.CHECKPOINT_FILES] == [
        "epoch-0003.weights.h5", "epoch-0003.state.npz"]
    assert rundir.manifest_name("epoch-0003") == "epoch-0003.json"
    assert rundir.temporary_file("epoch-0003", "state") == "epoch-0003.tmp.state.npz"
    assert rundir.tensorboard_dir(run) == os.path.join(run, "tensorboard")
    assert rundir.timeline_path(run, 1) == os.path.join(run, "comm-timeline-e1.json")


@pytest.mark.parametrize("rank", [0, 7, 12345, 123456])
def test_a_log_name_says_its_rank(rank):
    assert rundir.rank_of(rundir.log_name(rank)) == rank


@pytest.mark.parametrize("name", ["rank-1.json", "rank-.jsonl", "x-00001.jsonl", ".probe-0-1",
                                  "rank-00001.jsonl.tmp"])
def test_other_files_of_the_log_folder_say_no_rank(name):
    assert rundir.rank_of(name) is None


def test_checkpoint_names_sort_in_training_order_and_group_by_stem():
    stems = [rundir.checkpoint_stem(e, s) for e, s in [(3, 12), (1, 0), (3, 0), (2, 999999), (10, 0)]]
    assert sorted(stems) == [rundir.checkpoint_stem(e, s)
                             for e, s in [(1, 0), (2, 999999), (3, 0), (3, 12), (10, 0)]]
    assert [rundir.is_inside_epoch(s) for s in sorted(stems)] == [False, True, False, True, False]
    stem = rundir.checkpoint_stem(4, 2)
    for name in (rundir.manifest_name(stem), rundir.checkpoint_file(stem, "weights"),
                 rundir.temporary_file(stem, "state")):
        assert rundir.stem_of(name) == stem
    assert rundir.is_temporary(rundir.temporary_file(stem, "weights"))
    assert not rundir.is_temporary(rundir.checkpoint_file(stem, "weights"))
    assert rundir.stem_of(rundir.LATEST_CHECKPOINT) is None


def test_existing_run_is_the_config_or_the_logs(tmp_path):
    run = str(tmp_path)
    assert rundir.existing_run(run) is None
    os.makedirs(rundir.checkpoint_dir(run))
    assert rundir.existing_run(run) is None  # checkpoints alone: not a run to refuse
    os.makedirs(rundir.log_dir(run))
    assert rundir.existing_run(run) == rundir.LOG_DIR
    open(rundir.config_path(run), "w").close()
    assert rundir.existing_run(run) == rundir.CONFIG_FILE


def test_the_report_finds_exactly_the_logs_the_trainer_names(tmp_path):
    run = str(tmp_path)
    os.makedirs(rundir.log_dir(run))
    for rank in (2, 0, 11):
        open(rundir.log_path(run, rank), "w").close()
    for stray in ("notes.jsonl", ".probe-0-1", "rank-1.json"):
        open(os.path.join(rundir.log_dir(run), stray), "w").close()
    assert logs.log_files(run) == {r: rundir.log_path(run, r) for r in (0, 2, 11)}


def test_rundir_is_plain_python():
    code = ("import sys, distseg.core.rundir; "
            "print(sorted(m for m in ('numpy', 'tensorflow', 'horovod', 'h5py') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=60, check=True).stdout
    assert out.strip() == "[]"
