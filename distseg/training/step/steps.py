"""The pieces of one training step, each built at module level so tests can import them.

``make_train_step`` and ``make_eval_step`` compile the ``tf.function`` steps of a
model; ``weight_checksum``, ``check_weights`` and ``average_batchnorm`` keep the ranks'
copies of the model identical. TensorFlow is imported inside the functions. The
learning rate of every step is ``distseg.core.lr``'s.
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple, Sequence

import numpy as np

from distseg.core.errors import RunError
from distseg.parallel import agreement
from distseg.parallel import distributed as dist


def _input_spec(model, spatial_shape: Sequence[int], batch: int | None = None):
    """The (images, masks) signature of a step of ``model``: its input channels (the
    data file's) last."""
    import tensorflow as tf
    shape = [batch, *spatial_shape]
    channels = int(model.input_shape[-1])
    return [tf.TensorSpec(shape + [channels], tf.float32), tf.TensorSpec(shape, tf.uint8)]


def _identity(tensor):
    return tensor


def loss_and_grads(model, images, masks, num_classes: int, loss: str, ranks: int = 1):
    """Forward and backward on this rank's part of the global batch: (the loss of the
    whole global batch, this rank's own loss, gradients of the trainable variables).

    The loss is ``losses.global_loss``: its sums travel over the ranks in one small
    allreduce before the backward pass (none on one rank), and the gradients, averaged
    over ranks as ``make_train_step`` averages them, are those of the loss of the whole
    global batch. Traced inside the steps below; a benchmark or a test that needs the
    step without its gradient allreduce calls this, not a copy.
    """
    import tensorflow as tf

    from distseg import losses
    total = dist.sum_in_step if ranks > 1 else _identity
    with tf.GradientTape() as tape:
        probs = model(images, training=True)
        value, surrogate, mine = losses.global_loss(probs, masks, num_classes, loss, total, ranks)
    grads = tape.gradient(surrogate, model.trainable_variables)
    return value, losses.loss_from_sums(mine, num_classes, loss), grads


class Checked(NamedTuple):
    """``checked_loss_and_grads``: the forward and backward pass, and what the step needs
    to skip an update."""

    stats: list
    """BatchNorm's moving statistics (changed by the forward pass itself)."""
    before: list
    """Their values before the forward pass, to put back when the update is skipped."""
    loss: Any
    """The loss of the whole global batch."""
    loss_local: Any
    """This rank's own loss."""
    grads: list
    """Gradients of the trainable variables (of the global batch's loss)."""
    nonfinite: Any
    """1.0 if a loss or a gradient is not finite on this rank."""
    halves: Any = None
    """The gradients of each half of the batch (``halved_loss_and_grads``), or None."""


#: Positions in the step's flags vector: this rank could not read its batch, was asked
#: to stop, or met a non-finite loss or gradient (the third is the step's own).
FAILED, STOP, NONFINITE = 0, 1, 2


class StepResult(NamedTuple):
    """What ``train_step`` returns (tensors)."""

    loss_local: Any
    """This rank's loss."""
    loss: Any
    """The global batch's loss (the same on every rank)."""
    flags: Any
    """[failed, stop, nonfinite] (``FAILED``, ``STOP``, ``NONFINITE``), means over ranks:
    > 0 where some rank raised it."""
    grad_sq: Any
    """[mean over ranks of |g_rank|^2, |g|^2 of the averaged gradient], then the same two
    of the gradients preconditioned by Adam (``preconditioned_sq``): what
    ``training.progress.noise`` estimates from. On one rank the batch's two halves stand in for
    two ranks (``can_halve``), or else the previous step's gradient for a second rank
    (NaN at a launch's first step)."""


class Flags(NamedTuple):
    """A step's flags, read on the host: each True where some rank raised it."""

    failed: bool
    stop: bool
    nonfinite: bool

    @classmethod
    def of(cls, flags) -> "Flags":
        # One conversion of the whole tensor: iterating over an eager tensor slices it
        # with one op per element, on every step (docs/studies/loop-costs-2026-11-28.md).
        values = np.asarray(flags) > 0
        return cls(bool(values[FAILED]), bool(values[STOP]), bool(values[NONFINITE]))


def can_halve(model, batch: int | None) -> bool:
    """Whether a one-rank step of ``batch`` samples can take its gradient as two halves
    (``halved_loss_and_grads``) and still train exactly as one pass over the batch: a
    batch size known when traced and even, and every BatchNorm layer normalising runs
    of samples (``model.bn_ghost_batch``) that fit a half, so no layer's output in one
    half depends on the other. (A layer of a user's own that mixes samples some other
    way is not seen here: docs/training.md.)"""
    import keras
    if not batch or batch % 2:
        return False
    half = batch // 2
    for layer in model._flatten_layers(include_self=False):  # noqa: SLF001 - Keras' walk
        if isinstance(layer, keras.layers.BatchNormalization):
            ghost = getattr(layer, "ghost_batch", 0)
            if not ghost or half % ghost:
                return False
    return True


def halved_loss_and_grads(model, images, masks, num_classes: int, loss: str):
    """``loss_and_grads`` of one rank's batch taken as two ranks of half of it would
    take it: each half its own forward pass and the gradient of its surrogate
    (``losses.surrogate``), the global loss's sums added over the halves. Returns (the
    loss, the same, the mean of the halves' gradients, [each half's gradients]): the
    mean is the batch's gradient, and the halves are the two gradients the noise scale
    needs (``training.progress.noise``, method ``halves``) without a second pass. The moving
    statistics (float non-trainable variables) move as one pass over the batch moves
    them: each half's move from the same start, averaged (``can_halve``)."""
    import tensorflow as tf

    from distseg import losses
    h = images.shape[0] // 2
    stats = [v for v in model.non_trainable_variables if "float" in str(v.dtype)]
    start = [tf.identity(v) for v in stats]
    with tf.GradientTape(persistent=True) as tape:
        probs_a = model(images[:h], training=True)
        after_a = [tf.identity(v) for v in stats]
        for v, value in zip(stats, start):
            v.assign(value)
        probs_b = model(images[h:], training=True)
        local = [losses.loss_sums(probs_a, masks[:h], num_classes),
                 losses.loss_sums(probs_b, masks[h:], num_classes)]
        total = tf.stop_gradient(local[0] + local[1])
        parts = [losses.surrogate(x, total, num_classes, loss, 2) for x in local]
    for v, a in zip(stats, after_a):
        v.assign((tf.convert_to_tensor(v) + a) / 2.0)
    halves = [tape.gradient(p, model.trainable_variables) for p in parts]
    del tape
    grads = [(a + b) / 2.0 for a, b in zip(*halves)]
    value = losses.loss_from_sums(total, num_classes, loss)
    return value, value, grads, halves


def halves_where(measure, model, images, masks, num_classes: int, loss: str):
    """``halved_loss_and_grads`` where the bool tensor ``measure`` is true, else one
    pass over the batch (``loss_and_grads``; its gradient stands for both halves): the
    same update, and the halves' extra time only on the steps that measure the noise
    scale. Both are traced in the one step."""
    import tensorflow as tf

    def halved():
        return halved_loss_and_grads(model, images, masks, num_classes, loss)

    def whole():
        value, local_loss, grads = loss_and_grads(model, images, masks, num_classes, loss)
        return value, local_loss, grads, [grads, grads]

    return tf.cond(measure, halved, whole)


def checked_loss_and_grads(model, images, masks, num_classes: int, loss: str,
                           ranks: int = 1, halved: bool = False, measure=None) -> Checked:
    """``loss_and_grads`` (``halved_loss_and_grads`` if ``halved``; only where the bool
    tensor ``measure`` is true if given, ``halves_where``) with what the step needs to
    skip an update (``Checked``)."""
    import tensorflow as tf
    # BatchNorm's moving statistics change in the forward pass itself: keep a copy
    # to put back when the step is skipped, so a NaN batch cannot poison them.
    stats = list(model.non_trainable_weights)
    before = [tf.identity(v) for v in stats]
    halves = None
    if halved and measure is not None:
        value, local_loss, grads, halves = halves_where(measure, model, images, masks,
                                                        num_classes, loss)
    elif halved:
        value, local_loss, grads, halves = halved_loss_and_grads(model, images, masks,
                                                                 num_classes, loss)
    else:
        value, local_loss, grads = loss_and_grads(model, images, masks, num_classes, loss, ranks)
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads]
                           + [tf.math.is_finite(value), tf.math.is_finite(local_loss)])
    return Checked(stats, before, value, local_loss, grads, 1.0 - tf.cast(finite, tf.float32),
                   halves)


def squared_norm(tensors):
    """Sum of squares of every value of ``tensors`` (float32)."""
    import tensorflow as tf
    return tf.add_n([tf.reduce_sum(tf.square(tf.cast(t, tf.float32))) for t in tensors])


def flat(tensors):
    """Every value of ``tensors`` in one float32 vector."""
    import tensorflow as tf
    return tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors], 0)


def adam_scale(optimizer, variables):
    """(1 / (sqrt(v_hat) + epsilon) as one vector in ``flat`` order, whether to use it):
    AdaptDL's preconditioner, from Adam's bias-corrected second moments v_hat as they
    stand before this step's update, so the noise measured is that of the update Adam
    makes. Not used (the identity) while Adam has taken fewer than
    ``noise.PRECONDITION_AFTER`` steps, nor for any optimizer but plain Adam."""
    import tensorflow as tf

    from distseg.training.progress.noise import PRECONDITION_AFTER
    if not _plain_adam(optimizer):
        return tf.ones([sum(math.prod(v.shape) for v in variables)]), tf.constant(False)
    if not optimizer.built:  # as apply_adam does: the moments on first use
        optimizer.build(variables)
    t = tf.cast(optimizer.iterations, tf.float32)
    correction = tf.maximum(1.0 - tf.pow(tf.constant(optimizer.beta_2, tf.float32), t), 1e-30)
    v = flat([optimizer._velocities[optimizer._get_variable_index(var)]  # noqa: SLF001
              for var in variables])
    return 1.0 / (tf.sqrt(v / correction) + optimizer.epsilon), t >= PRECONDITION_AFTER


def preconditioned_sq(optimizer, grads, variables):
    """|g|^2 of ``grads`` preconditioned by ``adam_scale`` (the plain |g|^2 where it is
    not used)."""
    import tensorflow as tf
    g = flat(grads)
    scale, use = adam_scale(optimizer, variables)
    return tf.where(use, tf.reduce_sum(tf.square(g * scale)), tf.reduce_sum(tf.square(g)))


def _pair_norms(a, b, scale, use):
    """[mean of |a|^2 and |b|^2, |(a + b) / 2|^2] raw, then preconditioned by ``scale``
    where ``use`` (flat vectors): from three dot products each."""
    import tensorflow as tf

    def two(x, y):
        xx, yy, xy = (tf.reduce_sum(x * x), tf.reduce_sum(y * y), tf.reduce_sum(x * y))
        return tf.stack([(xx + yy) / 2.0, (xx + yy + 2.0 * xy) / 4.0])
    raw = two(a, b)
    return tf.concat([raw, tf.where(use, two(a * scale, b * scale), raw)], 0)


class PreviousGradient:
    """The last step's gradient on a one-rank run, as one flat vector: the second
    gradient of the noise scale's difference estimator (``training.progress.noise``)."""

    def __init__(self, variables):
        import tensorflow as tf
        size = sum(math.prod(v.shape) for v in variables)
        self.grad = tf.Variable(tf.zeros([size]), trainable=False)
        self.valid = tf.Variable(0.0, trainable=False)

    def norms(self, optimizer, grads, variables, mode=None):
        """``StepResult.grad_sq`` of this and the last gradient (NaN without a last
        gradient); keeps ``grads`` as the last. Under a ``noise_mode`` tensor ``mode``
        (``noise.MEASURE``, ``KEEP`` or ``SKIP``): only ``MEASURE`` estimates, ``KEEP``
        only keeps ``grads``, ``SKIP`` forgets (NaN where nothing is estimated)."""
        import tensorflow as tf

        def measure():
            g = flat(grads)
            scale, use = adam_scale(optimizer, variables)
            out = _pair_norms(g, tf.convert_to_tensor(self.grad), scale, use)
            out = tf.where(self.valid > 0, out, _nan_norms())
            with tf.control_dependencies([out]):
                kept = [self.grad.assign(g), self.valid.assign(1.0)]
            with tf.control_dependencies(kept):
                return tf.identity(out)

        def keep():
            with tf.control_dependencies([self.grad.assign(flat(grads)), self.valid.assign(1.0)]):
                return _nan_norms()

        def skip():
            with tf.control_dependencies([self.valid.assign(0.0)]):
                return _nan_norms()

        if mode is None:
            return measure()
        return tf.switch_case(mode, [skip, keep, measure])

    def forget(self) -> None:
        """No last gradient: the next step estimates nothing (as a launch's first)."""
        self.valid.assign(0.0)


def halves_norms(optimizer, halves, variables):
    """``StepResult.grad_sq`` of a one-rank step taken as two halves: the halves stand
    for two ranks' gradients."""
    scale, use = adam_scale(optimizer, variables)
    return _pair_norms(flat(halves[0]), flat(halves[1]), scale, use)


def _nothing() -> None:
    pass


def _nan_norms():
    """``StepResult.grad_sq`` of a step that estimates nothing."""
    import tensorflow as tf
    return tf.fill([4], float("nan"))


def _measured(measure, norms):
    """``norms()`` where the bool tensor ``measure`` is true, else ``_nan_norms``."""
    import tensorflow as tf
    return tf.cond(measure, norms, _nan_norms)


def rank_norms(optimizer, grads, variables):
    """This rank's [|g|^2, preconditioned |g|^2] (they ride in the gradient allreduce)
    and the flat scale for the averaged gradient's (``averaged_norms``)."""
    import tensorflow as tf
    g = flat(grads)
    scale, use = adam_scale(optimizer, variables)
    raw = tf.reduce_sum(g * g)
    return tf.stack([raw, tf.where(use, tf.reduce_sum(tf.square(g * scale)), raw)]), (scale, use)


def averaged_norms(small, grads, scaled):
    """``StepResult.grad_sq`` of a multi-rank step: the ranks' mean ``small`` (from
    ``rank_norms``) and the averaged ``grads``' own."""
    import tensorflow as tf
    scale, use = scaled
    g = flat(grads)
    raw = tf.reduce_sum(g * g)
    return tf.stack([small[0], raw, small[1],
                     tf.where(use, tf.reduce_sum(tf.square(g * scale)), raw)])


def _plain_adam(optimizer) -> bool:
    """Whether ``optimizer`` is Keras' Adam with nothing but its learning rate, betas and
    epsilon in play (what ``apply_adam`` computes)."""
    import keras
    return (type(optimizer) is keras.optimizers.Adam and not optimizer.amsgrad
            and not optimizer.weight_decay and not optimizer.use_ema
            and optimizer.clipnorm is None and optimizer.clipvalue is None
            and optimizer.global_clipnorm is None and not optimizer.gradient_accumulation_steps
            and optimizer.loss_scale_factor is None)


def apply_adam(optimizer, grads, variables):
    """``optimizer.apply_gradients(zip(grads, variables))`` for a plain Keras Adam
    (``_plain_adam``), as one fused kernel per variable on Keras' own moment variables:
    the same update (m, v, then var -= lr_t m / (sqrt(v) + eps), lr_t = lr sqrt(1 -
    beta2^t) / (1 - beta1^t)) and the same optimizer state, so checkpoints do not change.
    Keras builds about a dozen ops per variable, a large share of the train step's
    tracing and time on a small U-Net
    (docs/studies/first-step-reader-optimizer-2026-11-25.md). Any other optimizer goes
    through ``apply_gradients``."""
    if not _plain_adam(optimizer):
        optimizer.apply_gradients(zip(grads, variables))
        return
    import tensorflow as tf
    if not optimizer.built:  # as apply_gradients does: the moments on first use
        optimizer.build(variables)
    # The step's scalars, once (float32 weights: the casts below are no-ops for them).
    step = tf.cast(optimizer.iterations + 1, tf.float32)
    scalars = {"beta1_power": tf.pow(optimizer.beta_1, step),
               "beta2_power": tf.pow(optimizer.beta_2, step),
               "lr": tf.cast(optimizer.learning_rate, tf.float32),
               "beta1": tf.constant(optimizer.beta_1, tf.float32),
               "beta2": tf.constant(optimizer.beta_2, tf.float32),
               "epsilon": tf.constant(optimizer.epsilon, tf.float32)}
    for grad, var in zip(grads, variables):
        index = optimizer._get_variable_index(var)  # noqa: SLF001 - Keras' slot lookup
        tf.raw_ops.ResourceApplyAdam(
            var=var.value.handle, m=optimizer._momentums[index].value.handle,  # noqa: SLF001
            v=optimizer._velocities[index].value.handle,  # noqa: SLF001
            grad=tf.cast(grad, var.dtype),
            **{k: tf.cast(x, var.dtype) for k, x in scalars.items()})
    optimizer.iterations.assign_add(1)


def apply_unless(skip_flag, optimizer, grads, variables, stats=(), before=()):
    """Applies ``grads`` unless ``skip_flag`` > 0; then puts ``stats`` back to ``before``."""
    import tensorflow as tf

    def apply():
        apply_adam(optimizer, grads, variables)
        return tf.constant(True)

    def skip():
        for v, old in zip(stats, before):
            v.assign(old)
        return tf.constant(False)

    return tf.cond(skip_flag > 0, skip, apply)


def _rank_norms_where(measure, optimizer, grads, variables):
    """``rank_norms`` where the bool tensor ``measure`` is true, else zeros and an empty
    scale: (this rank's two norms, Adam's flat scale, whether to use it). The scale
    leaves the branch so the averaged gradient's norms reuse it: Adam's moments do not
    change between the two (the update comes after both), and computing it is half of
    the norms' time
    (docs/studies/noise-every-2026-11-28.md#the-preconditioner-once-later-the-same-day)."""
    import tensorflow as tf

    def measured():
        small, (scale, use) = rank_norms(optimizer, grads, variables)
        return small, scale, use

    def skipped():
        return tf.zeros([2]), tf.zeros([0]), tf.constant(False)

    return tf.cond(measure, measured, skipped)


def _averaged_update(optimizer, variables, c: Checked, all_flags, measure, compression: str):
    """A multi-rank step's update of ``checked_loss_and_grads``' ``c``: the gradients,
    the flags and this rank's |g|^2 (raw and preconditioned; zeros on a step that does
    not ``measure``) averaged in one grouped allreduce, then applied unless some rank's
    were not finite."""
    import tensorflow as tf
    mine, scale, use = _rank_norms_where(measure, optimizer, c.grads, variables)
    grads, (mean_flags, small) = dist.average_gradients(c.grads, [all_flags, mine], compression)
    norms = _measured(measure, lambda: averaged_norms(small, grads, (scale, use)))
    with tf.control_dependencies([norms]):
        apply_unless(mean_flags[NONFINITE], optimizer, grads, variables, c.stats, c.before)
    return StepResult(c.loss_local, c.loss, mean_flags, norms)


def make_train_step(model, optimizer, spatial_shape: Sequence[int], num_classes: int, loss: str,
                    ranks: int = 1, batch: int | None = None, compression: str = "none",
                    halves: bool = True):
    """Compiles ``train_step(images, masks, flags) -> StepResult`` (this rank's loss, the
    global batch's loss, any rank's flags, the gradient norms); ``train_step.forget()``
    drops the one-rank step's memory of the last gradient.

    ``flags`` holds this rank's [failed, stop]: 1.0 on a rank that could not read its
    batch (it passes a blank one) or that was asked to stop. They ride in the step's
    one gradient allreduce with a third flag, a non-finite loss or gradient on this
    rank, so every rank learns of each at the same step instead of waiting for a rank
    that has stopped. The returned flags are means over ranks (> 0: some rank raised
    it). The update is applied only when every rank's loss and gradients were finite;
    otherwise the BatchNorm statistics are put back as they were before the step.

    The gradient norms (``StepResult.grad_sq``) are the two batch sizes of the gradient
    noise scale (``training.progress.noise``), raw and preconditioned by Adam; the small batch's
    ride in the same allreduce. On one rank the gradient is taken as two halves where
    ``can_halve`` allows (``train_step.gradients_per_rank`` is 2), else the last step's gradient is
    kept as the second. They (and the halves) are taken only on a call whose
    ``train_step.noise_mode`` (a variable; ``noise.MEASURE`` until assigned) is
    ``noise.MEASURE``; the other calls return NaN norms (``noise.Cadence``). ``ranks``: the ranks sharing the global
    batch (``losses.global_loss``); with one, the step has no collective at all (an
    average over one rank is its own value, and a Horovod op would still wait for
    a coordination cycle, a visible share of a small model's step,
    docs/studies/step-profile-2026-11-24.md). ``batch``:
    every batch's size, when fixed (a fixed global batch): the step is traced for it
    (BatchNorm's ghost batches split statically). ``compression``: how the gradients
    travel (``dist.average_gradients``; ``none``, exact, by default). ``halves=False``:
    never halve (a benchmark's A/B of the two one-rank estimators).
    """
    import tensorflow as tf

    from distseg.training.progress import noise

    halved = halves and ranks == 1 and can_halve(model, batch)
    previous = PreviousGradient(model.trainable_variables) if ranks == 1 and not halved else None
    # What the next call does for the noise scale (``noise.MEASURE``, ``KEEP`` or
    # ``SKIP``; ``noise.Cadence``): read inside the step, so no cadence traces it again.
    mode = tf.Variable(noise.MEASURE, dtype=tf.int32, trainable=False)

    # autograph=False: the step's Python branches are on Python values only (tf.cond
    # is explicit), and converting its source cost a good share of the trace
    # (docs/studies/first-step-reader-optimizer-2026-11-25.md).
    @tf.function(input_signature=_input_spec(model, spatial_shape, batch) + [tf.TensorSpec([2], tf.float32)],
                 autograph=False)
    def train_step(images, masks, flags):
        variables = model.trainable_variables
        if not optimizer.built:  # its moments before any branch reads them
            optimizer.build(variables)
        mode_now = mode.read_value()
        measure = tf.equal(mode_now, noise.MEASURE)
        c = checked_loss_and_grads(model, images, masks, num_classes, loss, ranks, halved,
                                   measure)
        all_flags = tf.concat([flags, [c.nonfinite]], 0)
        if ranks == 1:
            norms = (_measured(measure, lambda: halves_norms(optimizer, c.halves, variables))
                     if halved else previous.norms(optimizer, c.grads, variables, mode_now))
            with tf.control_dependencies([norms]):  # Adam's moments before the update
                apply_unless(all_flags[NONFINITE], optimizer, c.grads, variables, c.stats,
                             c.before)
            return StepResult(c.loss_local, c.loss, all_flags, norms)
        return _averaged_update(optimizer, variables, c, all_flags, measure, compression)

    # What steps taken outside training (a timed trial) leave behind, forgotten.
    train_step.forget = previous.forget if previous is not None else _nothing
    # ``noise.Cadence``: what the next call does for the noise scale (``noise.MEASURE``
    # unless told otherwise: every step measures).
    train_step.noise_mode = mode
    # Gradients per rank the norms come from (``noise.NoiseScale.gradients_per_rank``).
    train_step.gradients_per_rank = 2 if halved else 1
    return train_step


def tell_noise_mode(train_step, mode: int) -> None:
    """What ``train_step``'s next calls do for the noise scale (``noise.Cadence``):
    ``mode`` assigned to its ``noise_mode`` variable where it changes (the step keeps
    what it was last told), so most steps assign nothing."""
    if getattr(train_step, "told_mode", None) != mode:
        train_step.noise_mode.assign(mode)
        train_step.told_mode = mode


class EvalResult(NamedTuple):
    """What the eval step returns for one batch."""

    sums: Any
    """``losses.loss_sums`` of the batch: they add up over batches and ranks."""
    counts: Any
    """``metrics.sample_dice_counts``, (batch, 3, classes): each sample's hard-Dice
    counts, added up per case by 2D validation and over the batch for the whole set."""


def make_eval_step(model, spatial_shape: Sequence[int], num_classes: int):
    """Compiles ``eval_step(images, masks) -> EvalResult`` (no communication): the
    batch's loss sums and each sample's Dice counts, which add up over samples, batches
    and ranks into the loss and Dice of the whole validation set (and of each case)."""
    import tensorflow as tf

    from distseg import losses, metrics

    @tf.function(input_signature=_input_spec(model, spatial_shape), autograph=False)
    def eval_step(images, masks):
        probs = model(images, training=False)
        return EvalResult(losses.loss_sums(probs, masks, num_classes),
                          metrics.sample_dice_counts(probs, masks, num_classes))

    return eval_step


def make_predict_step(model, spatial_shape: Sequence[int]):
    """Compiles ``predict_step(images) -> probabilities`` (inference mode; sliding-window
    validation of whole volumes calls it window batch by window batch)."""
    import tensorflow as tf

    @tf.function(input_signature=_input_spec(model, spatial_shape)[:1], autograph=False)
    def predict_step(images):
        return model(images, training=False)

    return predict_step


def onednn_enabled() -> bool:
    """Whether TensorFlow uses its oneDNN (MKL) kernels: on by default on x86 since TF
    2.9, off with ``TF_ENABLE_ONEDNN_OPTS=0``. Recorded in the run record."""
    import tensorflow as tf
    try:
        return bool(tf.python.util._pywrap_util_port.IsMklEnabled())  # noqa: SLF001
    except AttributeError:
        return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1") != "0"


def weight_checksum(variables) -> list[float]:
    """[sum, sum of squares] of every value, in float64, one variable at a time (never
    a float64 copy of the whole model and optimizer state at once).

    In numpy: about half the time of the same sums as eager TensorFlow ops, at every
    epoch's end on every rank, and unlike a ``tf.function`` nothing to trace
    (docs/studies/first-step-reader-optimizer-2026-11-25.md). The squares are summed by
    ``einsum`` in float64, without a float64 copy of each variable
    (docs/studies/loop-costs-2026-11-28.md).
    """
    total = np.zeros(2)
    for v in variables:
        values = np.asarray(v).ravel()
        total += (values.sum(dtype=np.float64),
                  np.einsum("i,i->", values, values, dtype=np.float64))
    return [float(x) for x in total]


def check_weights(where: str, variables) -> list[float]:
    """Collective: raises the same ``RunError`` on every rank if any rank's weights
    differ from rank 0's; returns this rank's checksum."""
    mine = weight_checksum(variables)
    diverged = agreement.find_divergence(mine)
    if diverged:
        r, other, ref, rel = diverged
        raise RunError(f"ranks diverged {where}: rank {r}'s weight checksum {other} differs "
                       f"from rank 0's {ref} (relative {rel:.2e}); check that every rank "
                       "runs the same code, data file and config")
    return mine


def average_batchnorm(model, size: int) -> None:
    """Collective: replaces the BatchNorm moving statistics by their mean over ranks.

    They are updated from each rank's own batches; averaging them once per epoch, in
    one fused allreduce, makes every rank validate and checkpoint the same model.
    """
    stats = list(model.non_trainable_weights)
    if stats and size > 1:
        for v, mean in zip(stats, dist.allreduce_many([v.numpy() for v in stats])):
            v.assign(mean)


def trial_variables(model, optimizer) -> list:
    """What trial steps before a run (``precision``, ``lrfind``) change and must put
    back: the model's variables (weights, BatchNorm statistics, dropout seeds) and the
    optimizer's state."""
    return model.variables + optimizer.variables


def put_back(variables: list, values: list, step) -> None:
    """``variables`` as they were (``values``), and ``step`` without the memory of the
    trial's last gradient."""
    for v, value in zip(variables, values):
        v.assign(value)
    step.forget()
