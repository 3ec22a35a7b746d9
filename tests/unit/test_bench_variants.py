"""The step variants of ``make bench``'s A/B runs (benchmarks/benchlib/step_variants.py,
train_variant.py) as the real loop uses a step: every variant built the way
``train_variant`` swaps it in answers what the loop asks of ``steps.make_train_step``'s
step, and one (``localloss``, in every default ``make bench``) trains a real run."""

from __future__ import annotations

import os
import sys

import pytest

from support import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))

from benchlib import launch, runlogs, step_variants, train_variant  # noqa: E402


@pytest.mark.parametrize("name", sorted(set(step_variants.VARIANTS) - set(step_variants.MANY_RANKS_ONLY)))
def test_every_variant_takes_what_the_loop_tells_a_step(name, tiny):
    from distseg.training.progress import noise
    from distseg.training.step import factory, steps

    from benchlib import args
    cfg = args.preset_config("smoke", tiny)
    model, optimizer = factory.model_and_optimizer(cfg, (32, 32), cfg.train.seed)
    step = train_variant._uncompressed(step_variants.VARIANTS[name], model, optimizer, (32, 32), 3,
                                       "dice")
    steps.tell_noise_mode(step, noise.SKIP)
    assert int(step.noise_mode.numpy()) == noise.SKIP
    assert step.gradients_per_rank in (1, 2)
    step.forget()


def test_the_global_loss_ab_variant_trains_a_run(tiny, tmp_path):
    run_dir = str(tmp_path / "run")
    cmd = launch.train_command(["--preset", "smoke", "--data", tiny, "--epochs", "1",
                                "--max-steps-per-epoch", "2", "--no-validate"], run_dir,
                               threads=1, variant=["--step", "localloss"])
    launch.run_train(cmd, "localloss")
    (records,) = runlogs.rank_records(run_dir, 1)
    losses = [r["loss"] for r in records if r["type"] == "step"]
    assert len(losses) == 2 and all(isinstance(x, float) for x in losses)
    assert [r["type"] for r in records].count("epoch") == 1
