"""Local copies of distseg's train step with one cost taken out, for A/B timing.

``distseg.training.step.steps.make_train_step`` does more than forward, backward and update: it
copies the BatchNorm statistics before the forward pass (to put them back when a step
is skipped), checks every gradient for finiteness (the ``--on-nonfinite`` feature)
and, on more than one rank, a grouped allreduce. Each builder here has the same
signature and return value (``local loss, mean loss, mean [failed, stop, nonfinite]
flags``), so ``benchlib.train_variant`` can put one in place of the original and run
the real ``distseg-train`` with it. The benchmark never changes distseg itself: a
variant that wins is reported with its code and its measured gain.

Variants (``VARIANTS``):
  ``distseg``      the original, untouched (every call measures the noise scale);
  ``skipping``     the original on calls that skip the noise scale's statistics;
  ``nocheck``      no BatchNorm copy, no per-gradient finiteness check (the loss is
                   still checked, so a NaN loss is still caught);
  ``sumcheck``     the BatchNorm copy kept, the finiteness check folded into one sum
                   per gradient (a NaN or Inf anywhere makes the total non-finite);
  ``nocond``       the original with the update always applied (no ``tf.cond``);
  ``bare``         forward, backward, update: what Keras ``fit`` runs;
  ``localloss``    each rank's own Dice loss, no forward allreduce, no gradient norms
                   (the step before the global loss);
  ``consecutive``  one rank's noise scale from consecutive gradients, not the halves
                   of the batch (what one rank did before 2026-11-26);
  ``overlap``      one allreduce per gradient as the backward pass makes it, so Horovod
                   can reduce while backprop goes on (several ranks only; measured at 2
                   ranks x 8 demo slices: 432.6 against 431.3 ms, no gain).

``compiled_weight_checksum`` is a local copy of ``distseg.training.step.steps.weight_checksum`` run
as one ``tf.function`` instead of numpy sums over the weights and optimizer state
(``check_weights`` calls it at every epoch's end, on every rank): 8-11 ms a call
against numpy's 26-28 ms on the demo U-Net, but 0.9 s to trace for each list of
variables.
"""

from __future__ import annotations

from typing import Sequence

from distseg.training.step import steps


def _loss_and_grads(model, images, masks, num_classes: int, loss: str, ranks: int):
    """distseg's forward and backward with the global loss: (global loss, this rank's
    loss, gradients)."""
    return steps.loss_and_grads(model, images, masks, num_classes, loss, ranks)


def _checked_loss_and_grads(model, images, masks, num_classes: int, loss: str, ranks: int):
    return steps.checked_loss_and_grads(model, images, masks, num_classes, loss, ranks)


def _signature(model, spatial_shape: Sequence[int], batch: int | None = None):
    import tensorflow as tf

    return steps._input_spec(model, spatial_shape, batch) + [tf.TensorSpec([2], tf.float32)]


def _apply_unless(flag, optimizer, grads, variables, stats=(), before=()):
    return steps.apply_unless(flag, optimizer, grads, variables, stats, before)


def _no_norms(raw=None):
    """The step's four noise-scale norms where a variant computes none (NaN: the loop's
    estimate skips the step), or only the raw two."""
    import tensorflow as tf
    missing = tf.fill([2], float("nan"))
    return tf.concat([raw if raw is not None else missing, missing], 0)


def make_nocheck_train_step(model, optimizer, spatial_shape, num_classes: int, loss: str, ranks: int = 1, batch: int | None = None):
    """distseg's step without the BatchNorm copy, the per-gradient check and the
    gradient norms of the noise scale."""
    import tensorflow as tf

    from distseg.parallel import distributed as dist

    @tf.function(input_signature=_signature(model, spatial_shape, batch))
    def train_step(images, masks, flags):
        value, local_loss, grads = _loss_and_grads(model, images, masks, num_classes, loss, ranks)
        nonfinite = 1.0 - tf.cast(tf.math.is_finite(value), tf.float32)
        grads, (mean_flags,) = dist.average_gradients(grads, [tf.concat([flags, [nonfinite]], 0)])
        _apply_unless(mean_flags[steps.NONFINITE], optimizer, grads, model.trainable_variables)
        return steps.StepResult(local_loss, value, mean_flags, _no_norms())

    return train_step


def make_sumcheck_train_step(model, optimizer, spatial_shape, num_classes: int, loss: str, ranks: int = 1, batch: int | None = None):
    """distseg's step with the finiteness check as one sum per gradient: any NaN or
    Inf entry makes the sum non-finite (so does a finite overflow: a safe skip); no
    gradient norms."""
    import tensorflow as tf

    from distseg.parallel import distributed as dist

    @tf.function(input_signature=_signature(model, spatial_shape, batch))
    def train_step(images, masks, flags):
        stats = list(model.non_trainable_weights)
        before = [tf.identity(v) for v in stats]
        value, local_loss, grads = _loss_and_grads(model, images, masks, num_classes, loss, ranks)
        total = tf.add_n([tf.reduce_sum(g) for g in grads]) + value
        nonfinite = 1.0 - tf.cast(tf.math.is_finite(total), tf.float32)
        grads, (mean_flags,) = dist.average_gradients(grads, [tf.concat([flags, [nonfinite]], 0)])
        _apply_unless(mean_flags[steps.NONFINITE], optimizer, grads, model.trainable_variables, stats, before)
        return steps.StepResult(local_loss, value, mean_flags, _no_norms())

    return train_step


def make_nocond_train_step(model, optimizer, spatial_shape, num_classes: int, loss: str, ranks: int = 1, batch: int | None = None):
    """distseg's step (BatchNorm copy, finiteness check, allreduce) that always applies
    the update: what the ``tf.cond`` around the update costs (not a valid change)."""
    import tensorflow as tf

    from distseg.parallel import distributed as dist

    @tf.function(input_signature=_signature(model, spatial_shape, batch))
    def train_step(images, masks, flags):
        c = _checked_loss_and_grads(model, images, masks, num_classes, loss, ranks)
        before, value, local_loss, grads, nonfinite = c.before, c.loss, c.loss_local, c.grads, c.nonfinite
        grads, (mean_flags, small_sq) = dist.average_gradients(
            grads, [tf.concat([flags, [nonfinite]], 0), steps.squared_norm(grads)])
        with tf.control_dependencies(before):
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return steps.StepResult(local_loss, value, mean_flags,
                                _no_norms(tf.stack([small_sq, steps.squared_norm(grads)])))

    return train_step


def make_bare_train_step(model, optimizer, spatial_shape, num_classes: int, loss: str, ranks: int = 1, batch: int | None = None):
    """Forward, backward, update and nothing else (one rank only): Keras ``fit``'s step."""
    import tensorflow as tf

    @tf.function(input_signature=_signature(model, spatial_shape, batch))
    def train_step(images, masks, flags):
        value, local_loss, grads = _loss_and_grads(model, images, masks, num_classes, loss, 1)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return steps.StepResult(local_loss, value, tf.concat([flags, [0.0]], 0), _no_norms())

    return train_step


def make_localloss_train_step(model, optimizer, spatial_shape, num_classes: int, loss: str,
                              ranks: int = 1, batch: int | None = None):
    """distseg's step before the global loss (the fixed-global-batch study): each rank's own Dice loss, no
    forward allreduce of the Dice sums and no gradient norms for the noise scale; the
    A/B of what those two cost (``make bench``'s ``global_loss_cost`` row)."""
    import tensorflow as tf

    from distseg import losses
    from distseg.parallel import distributed as dist

    @tf.function(input_signature=_signature(model, spatial_shape, batch))
    def train_step(images, masks, flags):
        stats = list(model.non_trainable_weights)
        before = [tf.identity(v) for v in stats]
        with tf.GradientTape() as tape:
            local_loss = losses.segmentation_loss(model(images, training=True), masks, num_classes, loss)
        grads = tape.gradient(local_loss, model.trainable_variables)
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads]
                               + [tf.math.is_finite(local_loss)])
        grads, (mean_loss, mean_flags) = dist.average_gradients(
            grads, [local_loss, tf.concat([flags, [1.0 - tf.cast(finite, tf.float32)]], 0)])
        steps.apply_unless(mean_flags[steps.NONFINITE], optimizer, grads, model.trainable_variables, stats, before)
        return steps.StepResult(local_loss, mean_loss, mean_flags, _no_norms())

    return train_step


def make_overlap_train_step(model, optimizer, spatial_shape, num_classes: int, loss: str,
                            ranks: int = 1, batch: int | None = None):
    """distseg's step with one allreduce per gradient, issued as the backward pass makes
    it (Horovod fuses those that are ready in each cycle), instead of one grouped
    allreduce once every gradient exists; the flags and norms follow in a small one."""
    import horovod.tensorflow as hvd
    import tensorflow as tf


    @tf.function(input_signature=_signature(model, spatial_shape, batch), autograph=False)
    def train_step(images, masks, flags):
        c = _checked_loss_and_grads(model, images, masks, num_classes, loss, ranks)
        stats, before, value, local_loss, grads, nonfinite = (
            c.stats, c.before, c.loss, c.loss_local, c.grads, c.nonfinite)
        reduced = [hvd.allreduce(g, op=hvd.Average, name=f"grad{i}") for i, g in enumerate(grads)]
        mean_flags, small_sq = hvd.grouped_allreduce(
            [tf.concat([flags, [nonfinite]], 0), steps.squared_norm(grads)], op=hvd.Average)
        big_sq = steps.squared_norm(reduced)
        _apply_unless(mean_flags[steps.NONFINITE], optimizer, reduced, model.trainable_variables, stats, before)
        return steps.StepResult(local_loss, value, mean_flags, _no_norms(tf.stack([small_sq, big_sq])))

    return train_step


def make_nonoise_train_step(model, optimizer, spatial_shape, num_classes: int, loss: str,
                            ranks: int = 1, batch: int | None = None):
    """distseg's step without the noise scale's norms (raw and preconditioned, and the
    one-rank copy of the last gradient): the A/B of what the estimate costs."""
    import tensorflow as tf

    from distseg.parallel import distributed as dist

    @tf.function(input_signature=_signature(model, spatial_shape, batch), autograph=False)
    def train_step(images, masks, flags):
        c = _checked_loss_and_grads(model, images, masks, num_classes, loss, ranks)
        all_flags = tf.concat([flags, [c.nonfinite]], 0)
        grads = c.grads
        if ranks > 1:
            grads, (all_flags,) = dist.average_gradients(grads, [all_flags])
        _apply_unless(all_flags[steps.NONFINITE], optimizer, grads, model.trainable_variables,
                      c.stats, c.before)
        return steps.StepResult(c.loss_local, c.loss, all_flags, _no_norms())

    return train_step


#: distseg's own builder, as imported (``benchlib.train_variant`` puts a variant in its
#: place in ``steps``).
_DISTSEG_STEP = steps.make_train_step


def original(model, optimizer, spatial_shape, num_classes: int, loss: str, ranks: int = 1,
             batch: int | None = None):
    """distseg's own step, untouched."""
    return steps.make_train_step(model, optimizer, spatial_shape, num_classes, loss, ranks, batch)


def consecutive(model, optimizer, spatial_shape, num_classes: int, loss: str, ranks: int = 1,
                batch: int | None = None):
    """distseg's step with one rank's noise scale from consecutive gradients (the last
    step's kept), not from the batch's two halves: the A/B of the halves' cost."""
    return _DISTSEG_STEP(model, optimizer, spatial_shape, num_classes, loss, ranks, batch,
                         halves=False)


def skipping(model, optimizer, spatial_shape, num_classes: int, loss: str, ranks: int = 1,
             batch: int | None = None):
    """distseg's own step on a call that takes no noise-scale statistics
    (``noise.SKIP``): what most of a run's steps are under ``--noise-every auto``."""
    from distseg.training.progress import noise
    step = original(model, optimizer, spatial_shape, num_classes, loss, ranks, batch)
    step.noise_mode.assign(noise.SKIP)
    return step


VARIANTS = {
    "distseg": original,
    "skipping": skipping,
    "nocheck": make_nocheck_train_step,
    "sumcheck": make_sumcheck_train_step,
    "nocond": make_nocond_train_step,
    "bare": make_bare_train_step,
    "localloss": make_localloss_train_step,
    "overlap": make_overlap_train_step,
    "nonoise": make_nonoise_train_step,
    "consecutive": consecutive,
}
#: Variants valid on one rank only (they skip the allreduce).
ONE_RANK_ONLY = ("bare", "consecutive")
#: Variants valid on several ranks only (their allreduce is their point).
MANY_RANKS_ONLY = ("overlap",)


def _checksum_graph(variables):
    """[sum, sum of squares] of every value in float64, as distseg computes it."""
    import tensorflow as tf
    sums = [tf.stack([tf.reduce_sum(x), tf.reduce_sum(x * x)])
            for x in (tf.cast(v, tf.float64) for v in variables)]
    return tf.add_n(sums)


_COMPILED: dict = {}


def compiled_weight_checksum(variables) -> list[float]:
    """``distseg.training.step.steps.weight_checksum`` as one compiled call. The variables go in as
    TensorFlow variables (by reference), so a later call reads their new values."""
    import tensorflow as tf
    if "checksum" not in _COMPILED:
        _COMPILED["checksum"] = tf.function(_checksum_graph)
    handles = [getattr(v, "value", v) for v in variables]
    return [float(x) for x in _COMPILED["checksum"](handles)]
