"""The best checkpoint by nnU-Net's EMA of the validation Dice (``distseg.training.epoch.bestcheckpoint``,
``checkpoint.write``'s ``best.json``), and ``distseg-predict`` and ``--export`` using it
(``predict.choose_checkpoint``), then ``--decide``'s decisions applied by predict.

The EMA and the file's rules are tested on records and tiny checkpoints; a real smoke
run of 2 epochs, resumed to 4, shows the EMA continued exactly from the checkpoint,
``best.json`` naming a checkpoint that rotation kept, and the resume still taken from
the newest.
"""

import json
import os
import shutil

import keras
import numpy as np
import pytest

from distseg.core import rundir
from distseg.data.convert import samples
from distseg.inference import export, predict
from distseg.training.checkpoints import checkpoint
from distseg.training.epoch import bestcheckpoint, modelparts

from proc_group import run_group
from support import BIN, command_env, log_records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(3 * TIMEOUT)


class Said:
    """A console that keeps what it is told."""

    def __init__(self):
        self.lines = []

    def say(self, line):
        self.lines.append(line)


def _records(dice):
    return [{"epoch": e, "val_dice": {"background": 0.99, "liver": d, "lesion": None}}
            for e, d in enumerate(dice)]


def _fed(part, records):
    marks = []
    for r in records:
        part.on_epoch_start(r["epoch"], 3)
        part.before_checkpoint(r)
        marks.append(part.mark)
    return marks


# --------------------------------------------------------------- the arithmetic


def test_the_ema_weighs_the_old_value_0_9_and_starts_at_the_first_dice():
    assert bestcheckpoint.ema_update(None, 0.5) == 0.5
    assert bestcheckpoint.ema_update(0.5, 1.0) == pytest.approx(0.55)
    assert bestcheckpoint.ema_update(0.5, 1.0, weight=0.5) == 0.75
    assert bestcheckpoint.mean_foreground({"background": 0.99, "liver": 0.2, "lesion": 0.6}) == pytest.approx(0.4)
    assert bestcheckpoint.mean_foreground({"background": 0.99, "liver": 0.8, "lesion": None}) == 0.8
    assert bestcheckpoint.mean_foreground({"background": 0.99, "liver": None}) is None
    assert bestcheckpoint.mean_foreground({}) is None


def test_a_new_best_is_a_higher_ema_at_an_epoch_whose_checkpoint_is_due():
    dice = [0.5, 0.9, 0.1, 0.1, 1.0]
    emas = [0.5, 0.54, 0.496, 0.4564, 0.51076]
    said = Said()
    every1 = bestcheckpoint.BestDice(epochs=5, every=1, console=said)
    # The raw Dice 1.0 of the last epoch does not win: its EMA stays below 0.54.
    assert _fed(every1, _records(dice)) == [True, True, False, False, False]
    assert every1.ema == pytest.approx(emas[-1])
    assert every1.best["epoch"] == 2 and every1.best["ema"] == pytest.approx(0.54)
    assert every1.best["dice"] == 0.9 and every1.best["val_dice"]["liver"] == 0.9
    assert len(said.lines) == 2 and "after 2 epoch(s)" in said.lines[1] and "0.5400" in said.lines[1]
    every2 = bestcheckpoint.BestDice(epochs=5, every=2)
    # Due after 2, 4 and 5 (the last) epochs only; the EMA still counts every epoch.
    assert _fed(every2, _records(dice)) == [False, True, False, False, False]
    assert every2.ema == pytest.approx(emas[-1]) and every2.best["epoch"] == 2
    no_val = bestcheckpoint.BestDice(epochs=2, every=1)
    assert _fed(no_val, [{"epoch": 0, "val_dice": {}}, {"epoch": 1, "val_dice": {}}]) == [False, False]
    assert no_val.state() == {"ema": None, "weight": 0.9, "best": None, "mark": False}


def test_the_state_continues_the_ema_exactly_and_a_new_launch_marks_nothing_it_kept():
    records = _records([0.31, 0.77, 0.52, 0.64, 0.6])
    whole = bestcheckpoint.BestDice(epochs=5, every=1)
    _fed(whole, records)
    first = bestcheckpoint.BestDice(epochs=5, every=1)
    _fed(first, records[:3])
    kept = json.loads(json.dumps(first.state()))  # as a manifest holds it
    second = bestcheckpoint.BestDice(epochs=5, every=1, kept=kept)
    assert second.mark is False
    _fed(second, records[3:])
    assert second.ema == whole.ema and second.best == whole.best


# ------------------------------------------------------------- best.json on disk


def _tiny_state():
    from distseg.networks import unet
    keras.utils.set_random_seed(0)
    model = unet.build_unet(16, depth=1, base_filters=2)
    opt = keras.optimizers.Adam(learning_rate=1e-3)
    opt.build(model.trainable_variables)
    return model, opt


def _write(run_dir, model, opt, epoch, part=None, keep=2, step=0):
    state = checkpoint.RankState(local=[v.numpy() for v in model.non_trainable_weights])
    position = checkpoint.Position(epoch=epoch, step=step, global_step=10 * epoch + step,
                                   parts=modelparts.saved([part]).states if part else None)
    return checkpoint.write(str(run_dir), position, model, opt, [state], keep)


def _run_of(tmp_path, dice, keep=2):
    """Checkpoints after each epoch of ``dice``, the part's state in each, as the loop
    writes them."""
    model, opt = _tiny_state()
    part = bestcheckpoint.BestDice(epochs=len(dice), every=1)
    for record in _records(dice):
        part.on_epoch_start(record["epoch"], 1)
        part.before_checkpoint(record)
        _write(tmp_path, model, opt, record["epoch"] + 1, part, keep)
    return part


def test_best_json_names_the_best_checkpoint_and_rotation_keeps_it(tmp_path):
    ckdir = rundir.checkpoint_dir(str(tmp_path))
    part = _run_of(tmp_path, [0.5, 0.52, 0.5, 0.5, 0.5], keep=2)
    assert checkpoint.stems(ckdir) == ["epoch-0002", "epoch-0004", "epoch-0005"]
    with open(rundir.best_path(str(tmp_path))) as f:
        saved = json.load(f)
    assert saved == {"stem": "epoch-0002", "manifest": "epoch-0002.json", "epoch": 2,
                     "ema_dice": pytest.approx(0.502), "dice": 0.52, "ema_weight": 0.9,
                     "val_dice": {"background": 0.99, "liver": 0.52, "lesion": None}}
    entry, info, problem = checkpoint.best(str(tmp_path))
    assert problem is None and entry["epoch"] == 2 and info["stem"] == "epoch-0002"
    # Every manifest holds the part's state: what --resume continues.
    newest = checkpoint.latest(str(tmp_path))["position"].parts["best"]
    assert newest["ema"] == part.ema and newest["best"]["epoch"] == 2 and not newest["mark"]
    # A stop inside an epoch marks nothing, whatever the state held at the epoch's end.
    part.mark = True
    part.on_epoch_start(5, 1)
    _write(tmp_path, *_tiny_state(), 5, part, keep=2, step=1)
    assert checkpoint.best_stem(ckdir) == "epoch-0002"
    # A better later epoch moves best.json; the old best then rotates away.
    part.before_checkpoint({"epoch": 5, "val_dice": {"background": 1.0, "liver": 1.0}})
    assert part.mark and part.ema == pytest.approx(0.9 * 0.501458 + 0.1)
    _write(tmp_path, *_tiny_state(), 6, part, keep=2)
    assert checkpoint.best_stem(ckdir) == "epoch-0006"
    assert checkpoint.stems(ckdir) == ["epoch-0005-step-000001", "epoch-0006"]


def test_a_manifest_from_before_the_parts_had_one_hook_continues_its_best(tmp_path):
    """Manifests written before the parts were saved through one hook hold the best
    checkpoint's state at their top level as ``best``: it is read as the part's, and
    a part restored from it continues the EMA as the uninterrupted one does."""
    records = _records([0.31, 0.77, 0.52, 0.64])
    whole = bestcheckpoint.BestDice(epochs=4, every=1)
    _fed(whole, records)
    part = _run_of(tmp_path, [0.31, 0.77], keep=3)
    stem = os.path.join(rundir.checkpoint_dir(str(tmp_path)), "epoch-0002")
    with open(f"{stem}.json") as f:
        manifest = json.load(f)
    assert manifest["parts"] == {"best": part.state()} and "best" not in manifest
    manifest["best"] = manifest.pop("parts")["best"]
    with open(f"{stem}.json", "w") as f:
        json.dump(manifest, f)
    entry, warnings = checkpoint.find(str(tmp_path))
    assert warnings == [] and entry["position"].parts == {"best": part.state()}
    again = modelparts.ordered(bestcheckpoint.BestDice(epochs=4, every=1))
    modelparts.restore(again, modelparts.Kept(entry["position"].parts, {}, entry["state"]))
    _fed(again[0], records[2:])
    assert (again[0].ema, again[0].best) == (whole.ema, whole.best)


def test_predict_takes_the_best_says_so_and_latest_takes_the_newest(tmp_path):
    _run_of(tmp_path, [0.5, 0.9, 0.1, 0.1], keep=3)
    chosen = predict.choose_checkpoint(str(tmp_path))
    assert (chosen.stem, chosen.which, chosen.warnings) == ("epoch-0002", "best", ())
    assert chosen.words == ("epoch-0002 (best: EMA of the validation Dice 0.5400 after 2 "
                            "epoch(s); the newest is epoch-0004)")
    assert chosen.record() == {"stem": "epoch-0002", "epoch": 2, "which": "best",
                               "ema_dice": pytest.approx(0.54), "dice": 0.9}
    latest = predict.choose_checkpoint(str(tmp_path), "latest")
    assert (latest.stem, latest.which, latest.warnings) == ("epoch-0004", "newest", ())
    assert latest.words == "epoch-0004 (newest after 4 epoch(s); --which latest; the best is epoch-0002)"


@pytest.mark.parametrize("damage, words, kept", [
    ("not json", "best.json: not a best-checkpoint file", []),
    # A stem that can be read is kept by rotation all the same: deleting is for sure files.
    ('{"stem": "epoch-0002", "epoch": 2}', "expected stem, epoch and ema_dice", ["epoch-0002"]),
    ('{"stem": "epoch-0009", "epoch": 9, "ema_dice": 0.9}', "epoch-0009.json: not a checkpoint manifest", []),
])
def test_a_damaged_best_json_falls_back_to_the_newest_with_one_warning(tmp_path, damage, words, kept):
    _run_of(tmp_path, [0.5, 0.9, 0.1], keep=3)
    with open(rundir.best_path(str(tmp_path)), "w") as f:
        f.write(damage)
    chosen = predict.choose_checkpoint(str(tmp_path))
    assert (chosen.stem, chosen.which) == ("epoch-0003", "newest")
    [line] = chosen.warnings
    assert words in line and line.endswith("; using the newest checkpoint epoch-0003")
    assert "\n" not in line and "best.json unusable" in chosen.words
    # Rotation goes on without it.
    _write(tmp_path, *_tiny_state(), 4, keep=1)
    assert checkpoint.stems(rundir.checkpoint_dir(str(tmp_path))) == kept + ["epoch-0004"]


def test_a_run_from_before_best_json_takes_the_newest_silently(tmp_path):
    _run_of(tmp_path, [0.5, 0.9], keep=3)
    os.remove(rundir.best_path(str(tmp_path)))
    chosen = predict.choose_checkpoint(str(tmp_path))
    assert (chosen.stem, chosen.warnings) == ("epoch-0002", ())
    assert chosen.words == "epoch-0002 (newest after 2 epoch(s); the run has no best.json)"


# ------------------------------------------------------------------- a real run


def _train(*args):
    out = run_group([f"{BIN}/distseg-train", "--intra-op-threads", "1", "--inter-op-threads", "1",
                     *args], timeout=TIMEOUT, env=command_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def resumed_run(tiny, tmp_path_factory):
    """A smoke run of 2 epochs with validation, resumed to 4."""
    run_dir = str(tmp_path_factory.mktemp("best") / "run")
    _train("--preset", "smoke", "--max-steps-per-epoch", "2", "--lr", "0.01", "--data", tiny,
           "--run-dir", run_dir, "--epochs", "2")
    _train("--run-dir", run_dir, "--resume", "--epochs", "4")
    return run_dir


def _expected(run_dir):
    """(EMA, best epoch, best EMA) recomputed from the log's epoch records."""
    ema, top = None, (None, None)
    for r in (r for r in log_records(run_dir, 0) if r["type"] == "epoch"):
        ema = bestcheckpoint.ema_update(ema, bestcheckpoint.mean_foreground(r["val_dice"]))
        if top[1] is None or ema > top[1]:
            top = (r["epoch"] + 1, ema)
    return ema, *top


def test_a_resumed_run_continues_the_ema_exactly_and_resumes_from_the_newest(resumed_run):
    ema, best_epoch, best_ema = _expected(resumed_run)
    newest = checkpoint.latest(resumed_run)
    assert newest["epoch"] == 4 and newest["position"].parts["best"]["ema"] == ema
    [resumed] = [r for r in log_records(resumed_run, 0) if r["type"] == "resume"]
    assert os.path.basename(resumed["checkpoint"]) == "epoch-0002.json"
    with open(rundir.best_path(resumed_run)) as f:
        saved = json.load(f)
    assert (saved["epoch"], saved["ema_dice"]) == (best_epoch, best_ema)
    assert saved["stem"] in checkpoint.stems(rundir.checkpoint_dir(resumed_run))
    assert checkpoint.best(resumed_run)[2] is None  # its files are whole


def test_export_writes_the_best_or_the_newest_and_says_which(resumed_run, tmp_path):
    run_dir = str(tmp_path / "run")
    shutil.copytree(resumed_run, run_dir)
    with open(rundir.best_path(run_dir)) as f:
        saved = json.load(f)
    saved.update(stem="epoch-0003", manifest="epoch-0003.json", epoch=3)  # not the newest
    with open(rundir.best_path(run_dir), "w") as f:
        json.dump(saved, f)
    for which, stem in (("best", "epoch-0003"), ("latest", "epoch-0004")):
        out = str(tmp_path / which)
        lines = export.run(predict.Options(run_dir=run_dir, inputs=(), out="", which=which), out)
        with open(os.path.join(out, export.CONVENTION_FILE)) as f:
            info = json.load(f)
        assert info["checkpoint"]["stem"] == stem and info["epoch"] == int(stem[-4:])
        assert lines[0].startswith(f"checkpoint: {stem} (")
        assert info["postprocessing"]["mirror"] is False  # no --decide yet


def test_decide_writes_its_numbers_and_predict_applies_what_the_file_says(resumed_run, tmp_path):
    run_dir = str(tmp_path / "run")
    shutil.copytree(resumed_run, run_dir)
    done = run_group([f"{BIN}/distseg-predict", "--checkpoint", run_dir, "--decide"],
                     timeout=TIMEOUT, env=command_env())
    assert done.returncode == 0, done.stderr[-2000:]
    path = rundir.postprocessing_path(run_dir)
    with open(path) as f:
        doc = json.load(f)
    stem = checkpoint.read_best(run_dir)["stem"]
    assert doc["checkpoint"]["stem"] == stem and doc["cases"]
    for name in ("liver", "lesion"):
        d = doc["largest_component"]["classes"][name]
        assert set(d) == {"apply", "dice_without", "dice_with"}
        assert d["apply"] == (None not in (d["dice_with"], d["dice_without"])
                              and d["dice_with"] > d["dice_without"])
    m = doc["mirror"]
    assert m["apply"] == (m["dice_mirror"] > m["dice_plain"])
    assert f"checkpoint: {stem} (best" in done.stdout and f"wrote {path}" in done.stdout
    # The file says: mirror, and the liver's largest component only.
    doc["mirror"]["apply"] = True
    doc["largest_component"]["classes"]["liver"]["apply"] = True
    doc["largest_component"]["classes"]["lesion"]["apply"] = False
    with open(path, "w") as f:
        json.dump(doc, f)
    hu, _ = samples.case_arrays(3, 32, 6, "RAS")
    scan = str(tmp_path / "scan.nii.gz")
    samples.save_volume(scan, hu, samples.affine_for("RAS"))
    out = run_group([f"{BIN}/distseg-predict", "--checkpoint", run_dir, scan, "--out",
                     str(tmp_path / "pred"), "--no-progress", "--no-overlays"],
                    timeout=TIMEOUT, env=command_env())
    assert out.returncode == 0, out.stderr[-2000:]
    [applied] = [line for line in out.stdout.splitlines() if line.startswith("applied: ")]
    assert applied.startswith("applied: mirroring on (validation Dice ")
    assert "; largest component: liver yes (" in applied and ", lesion no (" in applied
    assert f"checkpoint: {stem} (best" in out.stdout, out.stdout
    import nibabel as nib
    from scipy import ndimage
    seg = np.asarray(nib.load(str(tmp_path / "pred" / "scan_seg.nii.gz")).dataobj)
    assert ndimage.label(seg == 1, structure=np.ones((3, 3, 3)))[1] <= 1
