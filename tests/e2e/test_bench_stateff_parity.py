"""The large-batch study's emulation held to the real thing: ``distseg-train`` at 1 and
2 ranks (``horovodrun -np 2``) and ``benchlib.stateff.emulation`` on the same config,
seed and data make the same per-step training losses, learning rates, gradient norms
and validation Dice.

Each case is one of ``bench_stateff``'s own variants (``study.run_config``), shrunk to
the ``tiny`` phantom (32x32, depth 2, 4 filters, 2 epochs x 3 steps), given the study's
precision (``study.resolved``: float32, not the demo preset's ``auto``, whose timed
trial only a real run has), launched with the benchmark's own command
(``real.hvd_command``) and read with its own log reader (``runlogs``). The emulation runs in a fresh process with one TensorFlow thread, as
each real rank does.

Tolerance: measured on one machine, the losses were bit for bit the same at 1 and 2
ranks in every case here (with Keras' ``apply_gradients`` in place of the loop's
``steps.apply_adam`` they differed by up to 4.5e-8, 2.6e-7 relative); 1e-6 relative
allows float32 rounding and nothing more. The noise scale's gradient norms, summed in
another graph, differed by up to 2.3e-7 relative.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from proc_group import run_group
from support import REPO, command_env

sys.path.insert(0, os.path.join(REPO, "benchmarks"))

from benchlib import runlogs  # noqa: E402
from benchlib.stateff import real, study  # noqa: E402

TIMEOUT = 300
pytestmark = pytest.mark.timeout(2 * TIMEOUT + 60)

#: Largest relative difference of a step's loss (float32 rounding).
LOSS_RTOL = 1e-6
#: Largest relative difference of a step's gradient norms.
NORM_RTOL = 1e-5

_EMULATE = """
import json, sys
sys.path[:0] = [{benchmarks!r}, {repo!r}]
from benchlib.stateff import emulation, study
emulation.set_threads(1)
cfg, _ = study.resolved(json.loads({cfg_over!r}), {data!r}, {run_dir!r})
print(json.dumps(emulation.simulate(cfg, {ranks})[0]))
"""


def shrunk_config(variant: str, ranks: int, data: str) -> dict:
    """The benchmark's ``--config`` of ``variant`` at ``ranks``, made small."""
    cfg_over = study.run_config("small", variant, ranks, 0, 2, study.train_samples(data))
    cfg_over["model"].update(image_size=32, depth=2, base_filters=4)
    cfg_over["train"]["max_steps_per_epoch"] = 3
    return cfg_over


def real_run(cfg_over: dict, ranks: int, data: str, run_dir: str) -> list[list[dict]]:
    """``distseg-train`` as the benchmark launches it; every rank's records."""
    _, cfg_path = study.resolved(cfg_over, data, run_dir)
    out = run_group(real.hvd_command(ranks, data, run_dir, cfg_path), timeout=TIMEOUT,
                    env=command_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return runlogs.rank_records(run_dir, ranks)


def emulated_run(cfg_over: dict, ranks: int, data: str, run_dir: str) -> list[dict]:
    """The emulation's records of the same run, in a fresh process."""
    script = _EMULATE.format(benchmarks=os.path.join(REPO, "benchmarks"), repo=REPO,
                             cfg_over=json.dumps(cfg_over), data=data, run_dir=run_dir, ranks=ranks)
    out = run_group([sys.executable, "-c", script], timeout=TIMEOUT, env=command_env())
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def of_type(records: list[dict], kind: str, field: str) -> list:
    return [r[field] for r in records if r.get("type") == kind]


@pytest.mark.parametrize("variant,ranks", [
    ("demo-now", 1),  # the demo preset: a fixed global batch of 8, BatchNorm ghost batches
    ("demo-now", 2),  # 4 slices per rank, each rank its own BatchNorm statistics
    ("base", 2),      # per-rank shards of 8, the lr scaled x2 after a warm-up step
])
def test_the_emulation_makes_distseg_trains_steps(tiny, tmp_path, variant, ranks):
    cfg_over = shrunk_config(variant, ranks, tiny)
    real_records = real_run(cfg_over, ranks, tiny, str(tmp_path / "real"))
    # The precision the study gives both, asked for and kept: no trial ran.
    assert runlogs.run_precision(str(tmp_path / "real")) == {"requested": "float32",
                                                             "choice": "float32"}
    sim = emulated_run(cfg_over, ranks, tiny, str(tmp_path / "sim"))
    sim_losses = of_type(sim, "step", "loss")
    assert len(sim_losses) == 6
    for records in real_records:  # every rank logs the global batch's loss
        assert of_type(records, "step", "lr") == of_type(sim, "step", "lr")
        np.testing.assert_allclose(of_type(records, "step", "loss"), sim_losses, rtol=LOSS_RTOL,
                                   atol=0)
        # The noise scale's norms (a one-rank launch has none at its first step: NaN,
        # or null in the log).
        np.testing.assert_allclose(np.array(of_type(records, "step", "grad_sq"), dtype=float),
                                   np.array(of_type(sim, "step", "grad_sq"), dtype=float), rtol=NORM_RTOL)
    real_dice, sim_dice = of_type(real_records[0], "epoch", "val_dice"), of_type(sim, "epoch", "val_dice")
    assert [list(d) for d in real_dice] == [list(d) for d in sim_dice]  # the file's classes
    # None (a class in neither prediction nor truth) as NaN, equal to NaN.
    np.testing.assert_allclose(np.array([list(d.values()) for d in real_dice], dtype=float),
                               np.array([list(d.values()) for d in sim_dice], dtype=float), atol=1e-3)
    if variant == "base":
        assert of_type(sim, "step", "lr")[:2] == [pytest.approx(1e-3), pytest.approx(2e-3)]
