"""The real ``distseg-train`` with local copies of some pieces swapped in, for A/B runs.

``--step`` puts a train-step builder of ``benchlib.step_variants`` in place of
``distseg.training.step.steps.make_train_step``; ``--model`` builds the U-Net as a model variant of
``benchlib.model_variants`` (``kerasbn``, ``kerasgn``: Keras' own normalisation layers);
``--checksum compiled`` computes the per-epoch weight checksum as one
``tf.function`` (``step_variants.compiled_weight_checksum``). Everything else (sharding, the
allreduce, logging, checkpoints) is distseg's own code, so the per-rank logs are timed
exactly like a plain run's. Arguments after ``--`` go to ``distseg-train``; runs alone
or under ``horovodrun``:

    python -m benchlib.train_variant --step nocheck -- --preset demo --data d.h5 --run-dir r
    horovodrun -np 2 -H localhost:2 python -m benchlib.train_variant --model kerasbn -- ...
"""

from __future__ import annotations

import argparse
import functools
import sys


def install(step: str = "distseg", model: str = "keras", checksum: str = "distseg") -> None:
    """Swaps the chosen pieces into distseg for the rest of this process."""
    from distseg.networks import unet as model_lib
    from distseg.training.step import steps

    from benchlib import model_variants, step_variants
    if step not in step_variants.VARIANTS:
        raise SystemExit(f"--step must be one of {', '.join(step_variants.VARIANTS)}")
    if model not in model_variants.VARIANTS:
        raise SystemExit(f"--model must be one of {', '.join(model_variants.VARIANTS)}")
    if checksum == "compiled":
        steps.weight_checksum = step_variants.compiled_weight_checksum
    if step != "distseg":
        steps.make_train_step = functools.partial(_uncompressed, step_variants.VARIANTS[step])
    if model != "keras":
        model_lib.from_config = functools.partial(model_variants.build, variant=model)


def _uncompressed(build, *args, compression: str = "none", **kwargs):
    """A step variant built as the loop builds its step (``compression`` is the loop's
    keyword; the variants allreduce exact float32 only), with what the loop and
    ``--precision auto``'s trial use of ``steps.make_train_step``'s: ``forget()``,
    ``gradients_per_rank`` and ``noise_mode``."""
    if compression != "none":
        raise SystemExit(f"step variants allreduce uncompressed, not --compression {compression}")
    step = build(*args, **kwargs)
    if not hasattr(step, "forget"):
        # Only distseg's own one-rank step keeps the last gradient (``original`` returns
        # it, ``forget`` and all); the variants keep nothing across steps.
        step.forget = _nothing
    if not hasattr(step, "gradients_per_rank"):
        step.gradients_per_rank = 1  # the variants take one gradient per rank
    if not hasattr(step, "noise_mode"):
        # The loop tells every step its noise mode (``steps.tell_noise_mode``); a variant
        # without the noise scale's norms keeps the variable and ignores it.
        import tensorflow as tf

        from distseg.training.progress import noise
        step.noise_mode = tf.Variable(noise.MEASURE, dtype=tf.int32, trainable=False)
    return step


def _nothing() -> None:
    pass


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ours, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--step", default="distseg")
    p.add_argument("--model", default="keras")
    p.add_argument("--checksum", default="distseg", choices=["distseg", "compiled"])
    args = p.parse_args(ours)
    install(args.step, args.model, args.checksum)
    from distseg.cli.train import train
    sys.argv = ["distseg-train", *rest]
    sys.exit(train())


if __name__ == "__main__":
    main()
