"""``--lr auto`` through ``distseg-train``: the range test runs before training, and 1
rank x 8 and 2 ranks x 4 of one global batch take the same decision (rank 0 decides: a
found lr on a grid of sqrt(2) steps, or the configured lr kept when the sweep finds no
upper end) and then train the same losses. Which of the two a CPU's rounding gives the
smoke model is not asserted: the choice itself is tested on curves whose answer is
known (tests/unit/test_lrfind.py). config.json holds the lr taken,
a resume keeps it without testing again, ``--lr-from`` takes it for another run, and a
model whose loss falls at no lr ends every rank with one line, exit 2, nothing trained."""

from __future__ import annotations

import json
import math
import re

import pytest

from distseg.core import rundir

import proc_group
from proc_group import run_group
from support import BIN, command_env, log_records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(6 * TIMEOUT)
THREADS = ["--intra-op-threads", "1", "--inter-op-threads", "1"]
RUN = ["--preset", "smoke", *THREADS, "--global-batch", "8", "--norm", "group", "--no-validate",
       "--max-steps-per-epoch", "4", "--lr-schedule", "cosine"]
#: A model whose output ignores its weights: no lr makes its loss fall.
FLAT_MODEL = '''
import keras
from keras import layers

def build(input_shape, num_classes):
    x = keras.Input(input_shape)
    y = layers.Conv2D(num_classes, 1)(x)
    y = layers.Rescaling(0.0)(y)
    return keras.Model(x, layers.Activation("softmax")(y))
'''


def _train(*args, ranks: int = 1, ok: bool = True):
    cmd = ([f"{BIN}/distseg-train", *args] if ranks == 1
           else proc_group.horovodrun_cmd("distseg-train", *args, ranks=ranks))
    out = run_group(cmd, env=command_env(), timeout=TIMEOUT)
    if ok:
        assert out.returncode == 0, (out.stdout or "")[-3000:] + (out.stderr or "")[-3000:]
    return out


def _lr(run_dir: str) -> float:
    with open(rundir.config_path(run_dir)) as f:
        return json.load(f)["train"]["lr"]


def _losses(run_dir: str) -> list[float]:
    return [r["loss"] for r in log_records(run_dir, 0) if r["type"] == "step"]


@pytest.fixture(scope="module")
def found(tiny, tmp_path_factory):
    """(1-rank run, 2-rank run), each with --lr auto, 3 epochs of 4 steps."""
    base = tmp_path_factory.mktemp("lr-auto")
    one, two = str(base / "one"), str(base / "two")
    _train(*RUN, "--lr", "auto", "--data", tiny, "--run-dir", one, "--epochs", "3")
    _train(*RUN, "--lr", "auto", "--data", tiny, "--run-dir", two, "--epochs", "3", ranks=2)
    return one, two


def _decision(run_dir: str) -> dict:
    record = log_records(run_dir, 0)[0]
    assert record["type"] == "run"
    return record["lr_find"]


def test_1x8_and_2x4_take_the_same_decision_and_train_the_same_losses(found):
    one, two = found
    lr = _lr(one)
    assert lr == _lr(two)
    decided = [_decision(run_dir) for run_dir in found]
    assert decided[0].get("kept", False) == decided[1].get("kept", False)
    for d in decided:
        assert d["lr"] == lr
        assert 5 < d["steps"] <= 60 and d["seconds"] > 0
        if d.get("kept"):  # no upper end found: the configured lr (the preset's)
            assert d["raw"] is None and "kept the configured lr" in d["why"]
        else:
            assert round(2 * math.log2(lr), 9).is_integer()  # on the sqrt(2) grid
            assert "steepest" in d["why"]
    for run_dir in found:
        with open(rundir.config_path(run_dir)) as f:
            assert json.load(f)["train"]["lr_auto"] is True
    a, b = _losses(one), _losses(two)
    assert len(a) == len(b) == 12
    assert all(abs(x - y) <= 1e-4 * max(abs(x), abs(y)) for x, y in zip(a, b))
    # The sweep left no trace: the first step is the run's own, at the found lr.
    assert [r["lr"] for r in log_records(one, 0) if r["type"] == "step"][0] == lr


def test_a_resume_keeps_the_found_lr_and_lr_from_takes_it(found, tiny, tmp_path):
    one, _ = found
    lr = _lr(one)
    _train("--run-dir", one, "--resume", "--epochs", "4")
    assert _lr(one) == lr
    runs = [r for r in log_records(one, 0) if r["type"] == "run"]
    assert len(runs) == 2 and "lr_find" not in runs[1]  # no second range test
    other = str(tmp_path / "other")
    _train(*RUN, "--lr-from", one, "--data", tiny, "--run-dir", other, "--epochs", "1")
    with open(rundir.config_path(other)) as f:
        train = json.load(f)["train"]
    assert (train["lr"], train["lr_auto"], train["lr_from"]) == (lr, False, one)


def test_a_loss_that_falls_at_no_lr_stops_every_rank_with_one_line(tiny, tmp_path):
    model = tmp_path / "flat.py"
    model.write_text(FLAT_MODEL)
    run_dir = tmp_path / "run"
    out = _train(*RUN, "--lr", "auto", "--data", tiny, "--run-dir", str(run_dir), "--epochs", "1",
                 "--model-fn", f"{model}:build", ranks=2, ok=False)
    assert out.returncode != 0
    # Each rank's line, prefixed by horovodrun with its rank: one distinct message.
    errors = set(re.findall(r"error: [^\r\n\[]*", (out.stdout or "") + (out.stderr or "")))
    assert len(errors) == 1, errors
    [line] = errors
    assert "--lr auto: the training loss fell at no lr" in line and "set --lr by hand" in line
    assert not (run_dir / "config.json").exists()
    assert not any((run_dir / "logs").glob("*.jsonl")) if (run_dir / "logs").exists() else True
