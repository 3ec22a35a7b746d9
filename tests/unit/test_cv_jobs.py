"""``distseg-jobs cv`` (``distseg.cluster.cv``): the plan and the job scripts it writes,
each recipe checked as distseg-train would check it, and every refusal made before
anything is written; the local runner's reading of a run directory."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from distseg.cluster import cv as cv_lib
from distseg.core import cvplan, rundir
from distseg.data import folds, synth

from support import jobs_cli as cli


@pytest.fixture
def folded(tmp_path):
    path = str(tmp_path / "f.h5")
    synth.make_dataset(path, cases=9, size=32, seed=0, slices_per_case=8)
    cases = folds.file_cases(path)
    folds.write_table(path, folds.table_of(cases.case_ids, folds.draw(9, 3, 0), "t"))
    return path


def _cv(data, out, *extra):
    return cli("cv", "--partition", "generic", "--cores-per-node", "4", "--ranks-per-node", "2",
               "--data", data, "--out", str(out), "--epochs", "2", *extra)


def test_one_job_per_recipe_node_count_and_fold(folded, tmp_path):
    out = tmp_path / "cv"
    res = _cv(folded, out, "--nodes", "1,2", "--recipe", "a=--preset smoke",
              "--recipe", "b=--preset smoke --loss dice", "--target-dice", "0.8")
    assert res.exit_code == 0, res.output
    plan = cvplan.read(str(out))
    assert plan.k == 3 and plan.folds == (0, 1, 2) and plan.nodes == (1, 2)
    assert len(plan.runs) == 2 * 2 * 3 and len({r.run_dir for r in plan.runs}) == 12
    assert plan.target_dice == 0.8
    run = next(r for r in plan.runs if (r.recipe, r.nodes, r.fold) == ("b", 2, 1))
    assert run.ranks == 4
    script = (out / "jobs" / "b-fold1-n2.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --requeue" in script
    assert "--loss dice --fold 1)" in script
    assert f"RUN_DIR={out}/runs/b/n2-r4/fold-1" in script
    # The local runner starts the same distseg-train arguments.
    args = plan.train_args(str(out), run)
    assert args[-2:] == ["--fold", "1"] and args[args.index("--run-dir") + 1].endswith("fold-1")
    submit = (out / "submit.sh").read_text()
    assert "CHAIN=0" in submit  # folds side by side; the report waits for all
    assert str(out) in (out / "jobs" / "report.sbatch").read_text()
    assert "--target-dice 0.8" in (out / "jobs" / "report.sbatch").read_text()


@pytest.mark.parametrize("extra,words", [
    (("--recipe", "a=--loss nope"), "--recipe a: Invalid value for '--loss'"),
    (("--recipe", "a=--fold 1"), "--recipe a: --fold is set by the plan"),
    (("--recipe", "a b=--loss dice"), "the name 'a b'"),
    (("--recipe", "a", "--recipe", "a=--loss dice"), "--recipe a: named twice"),
    (("--recipe", "a", "--folds", "0,3"), "fold 3 is outside the data file's 3 folds"),
    (("--recipe", "a=--batch-size 64"), "--recipe a (fold 0, 1 node(s)): "),
])
def test_bad_recipes_and_folds_are_refused_before_anything_is_written(folded, tmp_path, extra, words):
    out = tmp_path / "cv"
    res = _cv(folded, out, "--preset", "smoke", *extra)
    assert res.exit_code == 2, res.output
    assert words in res.output
    assert not out.exists()


def test_a_file_without_folds_and_a_second_plan_are_refused(tmp_path, folded):
    plain = str(tmp_path / "plain.h5")
    synth.make_dataset(plain, cases=4, size=32, seed=0, slices_per_case=8)
    res = _cv(plain, tmp_path / "cv0", "--recipe", "a")
    assert res.exit_code == 2 and "holds no fold table; give it folds with distseg-data folds" in res.output
    assert _cv(folded, tmp_path / "cv", "--recipe", "a=--preset smoke").exit_code == 0
    before = (tmp_path / "cv" / "cv.json").read_text()
    res = _cv(folded, tmp_path / "cv", "--recipe", "a=--preset smoke")
    assert res.exit_code == 2 and "already holds a cross-validation" in res.output
    assert (tmp_path / "cv" / "cv.json").read_text() == before


def _log(run_dir, *records):
    os.makedirs(rundir.log_dir(str(run_dir)), exist_ok=True)
    with open(rundir.log_path(str(run_dir), 0), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def test_run_state_reads_the_last_launch(tmp_path):
    run = tmp_path / "run"
    assert cv_lib.run_state(str(run)) == cv_lib.FRESH
    _log(run, {"type": "run"}, {"type": "epoch"})  # killed before its first checkpoint
    assert cv_lib.run_state(str(run)) == cv_lib.RESTART
    os.makedirs(rundir.checkpoint_dir(str(run)))
    open(rundir.latest_path(str(run)), "w").write("{}")
    _log(run, {"type": "run"}, {"type": "end", "status": "interrupted"})
    assert cv_lib.run_state(str(run)) == cv_lib.RESUME
    _log(run, {"type": "run"}, {"type": "end", "status": "interrupted"}, {"type": "run"},
         {"type": "end", "status": "ok"})
    assert cv_lib.run_state(str(run)) == cv_lib.DONE
    # A later launch that began and was killed is not done.
    _log(run, {"type": "run"}, {"type": "end", "status": "ok"}, {"type": "run"})
    assert cv_lib.run_state(str(run)) == cv_lib.RESUME


def test_plan_file_errors_name_the_file_and_field(tmp_path):
    (tmp_path / "cv.json").write_text(json.dumps({"schema": 1, "data": "x", "k": 2}))
    with pytest.raises(cvplan.InputError, match=r"cv.json: field recipes is missing"):
        cvplan.read(str(tmp_path))
    (tmp_path / "cv.json").write_text(json.dumps({"schema": 99}))
    with pytest.raises(cvplan.InputError, match="schema: 99 is newer"):
        cvplan.read(str(tmp_path))
    with pytest.raises(cvplan.InputError, match="not a cross-validation directory"):
        cvplan.read(str(tmp_path / "none"))


@pytest.fixture
def folded3d(tmp_path, folded):
    """The cases of ``folded`` as volumes (synth --ndim 3 --jitter 0 of the same seed),
    with the same fold table."""
    path = str(tmp_path / "v.h5")
    synth.make_volumes(path, cases=9, size=32, seed=0, slices_per_case=8, jitter=0)
    folds.write_table(path, folds.read_table(folded))
    return path


def test_a_recipe_trains_its_own_data_file(folded, folded3d, tmp_path):
    out = tmp_path / "cv"
    res = _cv(folded, out, "--recipe", "s=--preset smoke",
              "--recipe", f"v=--preset smoke3d --slab 8,32,32 --data {os.path.relpath(folded3d)}")
    assert res.exit_code == 0, res.output
    plan = cvplan.read(str(out))
    assert plan.recipe("v").data == folded3d and plan.recipe("v").flags[-2:] == ("--slab", "8,32,32")
    assert plan.recipe("s").data == "" and plan.data_files() == (folded, folded3d)
    run = next(r for r in plan.runs if r.recipe == "v")
    args = plan.train_args(str(out), run)
    assert args[args.index("--data") + 1] == folded3d and args.count("--data") == 1
    assert f"DATA={folded3d}\n" in (out / "jobs" / "v-fold0-n1.sbatch").read_text()
    assert f"DATA={folded}\n" in (out / "jobs" / "s-fold0-n1.sbatch").read_text()
    # A plan written before recipes had their own data reads as the plan's file.
    raw = json.loads((out / "cv.json").read_text())
    for r in raw["recipes"]:
        del r["data"]
    (out / "cv.json").write_text(json.dumps(raw))
    old = cvplan.read(str(out))
    assert old.data_of("v") == folded and old.train_args(str(out), run)[1] == folded


def _other_table(path, fold_of):
    cases = folds.file_cases(path)
    folds.write_table(path, folds.table_of(cases.case_ids, np.array(fold_of), "t"))


@pytest.mark.parametrize("change, words", [
    ("cases", "its cases differ from"),
    ("table", "has fold roles"),
])
def test_data_files_of_other_cases_or_folds_are_refused(folded, tmp_path, change, words):
    other = str(tmp_path / "o.h5")
    if change == "cases":
        synth.make_volumes(other, cases=8, size=32, seed=0, slices_per_case=8, jitter=0)
        _other_table(other, [0, 1, 2] * 2 + [0, 1])
    else:
        synth.make_volumes(other, cases=9, size=32, seed=0, slices_per_case=8, jitter=0)
        _other_table(other, [0, 1, 2] * 3)
    out = tmp_path / "cv"
    res = _cv(folded, out, "--recipe", "s=--preset smoke",
              "--recipe", f"v=--preset smoke3d --slab 8,32,32 --data {other}")
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert "\n" not in line and words in line and other in line and folded in line
    assert not out.exists()


@pytest.mark.parametrize("flags, words", [
    ("--data", "--data needs a file"), ("--data a.h5 --data=b.h5", "--data given twice"),
    ("--data --loss dice", "--data needs a file"), ("--run-dir x", "--run-dir is set by the plan"),
])
def test_a_recipe_data_flag_is_one_file(flags, words):
    with pytest.raises(cv_lib.jobs_lib.JobError, match=words):
        cv_lib.parse_recipe(f"r={flags}")
    assert cv_lib.parse_recipe("r=--loss dice --data=x.h5").data == os.path.abspath("x.h5")
