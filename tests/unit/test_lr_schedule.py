"""``--lr-schedule``: the factor ``lr.decay`` puts on the lr after the warm-up, and
how ``TrainingState`` counts it in samples, keeps its horizon through a checkpoint, and
stretches it when a resume asks for more epochs."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from distseg.core import config as config_lib
from distseg.core import lr
from distseg.training.progress.noise import Average
from distseg.training.progress.state import TrainingState

SAMPLES = 64  # the run's training samples: 8 steps of a global batch of 8 an epoch


def _train(schedule: str, epochs: int = 4, warmup: float = 1.0) -> config_lib.TrainConfig:
    return dataclasses.replace(config_lib.smoke().train, lr=1e-3, global_batch=8, epochs=epochs,
                               warmup_epochs=warmup, lr_schedule=schedule, max_steps_per_epoch=0)


def _scaling(schedule: str, ranks: int = 1, epochs: int = 4, warmup: float = 1.0) -> TrainingState:
    return TrainingState.initial(_train(schedule, epochs, warmup), SAMPLES, ranks)


@pytest.mark.parametrize("schedule, mid, end", [("constant", 1.0, 1.0), ("cosine", 0.5, 0.0),
                                                ("poly", 0.5 ** 0.9, 0.0)])
def test_each_schedule_is_1_through_the_warm_up_then_falls_to_its_end(schedule, mid, end):
    assert lr.decay(schedule, 0, 100, 1100) == 1.0
    assert lr.decay(schedule, 100, 100, 1100) == 1.0
    assert lr.decay(schedule, 600, 100, 1100) == pytest.approx(mid)
    assert lr.decay(schedule, 1100, 100, 1100) == pytest.approx(end)
    assert lr.decay(schedule, 5000, 100, 1100) == pytest.approx(end)


def test_cosine_and_poly_fall_monotonically():
    for schedule in ("cosine", "poly"):
        values = [lr.decay(schedule, x, 0, 1000) for x in range(0, 1001, 50)]
        assert all(a >= b for a, b in zip(values, values[1:])), schedule


def test_the_schedule_follows_samples_so_any_rank_count_has_the_same_lrs():
    one, two = _scaling("cosine", ranks=1), _scaling("cosine", ranks=2)
    assert one.horizon == two.horizon == 4 * SAMPLES
    for step in range(32):
        assert one.lr(step) == two.lr(step)
        one.observe([1.0, 1.0, 1.0, 1.0], applied=True)
        two.observe([1.0, 1.0, 1.0, 1.0], applied=True)
    assert one.lr_now == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 23 / 24)))


def test_a_skipped_update_still_moves_the_schedule():
    s = _scaling("poly")
    s.observe([math.nan] * 4, applied=False)
    assert s.trained == 8


def test_a_checkpoint_keeps_the_clock_and_the_horizon(tmp_path):
    s = _scaling("cosine")
    for step in range(12):
        s.lr(step)
        s.observe([1.0, 1.0, 1.0, 1.0], applied=True)
    kept = json.loads(json.dumps(s.state()))
    again = TrainingState.initial(_train("cosine"), SAMPLES, 2, kept)
    again.restore(kept, global_step=12)
    assert (again.trained, again.horizon, again.note) == (96, s.horizon, None)
    assert again.lr(12) == s.lr(12)


def test_more_epochs_on_resume_stretch_the_horizon_and_say_so():
    s = _scaling("cosine", epochs=4)
    for step in range(16):
        s.observe([1.0, 1.0, 1.0, 1.0], applied=True)
    kept = json.loads(json.dumps(s.state()))
    longer = _train("cosine", epochs=8)
    again = TrainingState.initial(longer, SAMPLES, 1, kept)
    again.restore(kept, global_step=16)
    assert again.horizon == 2 * s.horizon and again.warm == s.warm
    assert "--epochs 4 -> 8" in again.note and "from 256 to 512 samples" in again.note
    constant = TrainingState.initial(dataclasses.replace(longer, lr_schedule="constant"), SAMPLES, 1, kept)
    constant.restore(kept, global_step=16)
    assert constant.note is None


def test_a_bad_schedule_is_refused_naming_the_field():
    cfg = config_lib.smoke()
    bad = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lr_schedule="step"))
    with pytest.raises(ValueError, match="train.lr_schedule"):
        bad.validate()


def test_adascale_takes_the_whole_gain_where_gain_takes_its_square_root():
    assert lr.gain_factor(4.0, "gain") == 2.0
    assert lr.gain_factor(4.0, "adascale") == 4.0
    assert lr.gain_factor(0.5, "adascale") == 1.0  # never below the base lr
    assert lr.batch_factor("adascale", 4) == 4.0 and lr.batch_factor("gain", 4) == 2.0
    base = dataclasses.replace(config_lib.smoke().train, lr=1e-3, batch_size=2, global_batch=0,
                               warmup_epochs=0.0)
    lrs = {}
    for rule in lr.GAIN_RULES:  # 4 ranks of 2 over a base of 2: gain 1.6 at this noise
        s = TrainingState.initial(dataclasses.replace(base, lr_scaling=rule), SAMPLES, 4)
        s.noise.averages["preconditioned"] = Average(1.0, 2.0, 1.0)
        lrs[rule] = s.lr(0)
    assert lrs["gain"] == pytest.approx(1e-3 * 1.6 ** 0.5)
    assert lrs["adascale"] == pytest.approx(1e-3 * 1.6)
