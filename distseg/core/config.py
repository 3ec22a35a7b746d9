"""The resolved configuration of a training run: one frozen tree of dataclasses.

Layering: preset defaults -> optional JSON file (``--config``) -> command-line flags.
``Config.validate()`` raises ``ValueError`` naming the offending field; the resolved
config is written to ``RUN/config.json`` by rank 0 and hashed into every rank's
``run`` log record, so runs of different configs can be told apart.
"""

from __future__ import annotations

import dataclasses
import json
import os
import reprlib
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

from distseg.core import rundir
from distseg.core.errors import InputError

LR_SCALINGS = ("linear", "sqrt", "none", "gain", "adascale")
#: How the lr decays after the warm-up, over the samples the run plans (``lr.decay``).
LR_SCHEDULES = ("constant", "cosine", "poly")
BATCH_POLICIES = ("fixed", "goodput")
#: How a step's gradients travel (``train.compression`` once a run has decided).
COMPRESSIONS = ("none", "fp16")
LOSSES = ("dice", "dice_ce")
#: ``train.optimizer``: Adam, or SGD with Nesterov momentum (nnU-Net's).
OPTIMIZERS = ("adam", "sgd")
NORMS = ("batch", "group", "instance", "none")
#: ``--model`` name -> ``model.spatial_dims``.
MODELS = {"unet2d": 2, "unet3d": 3}
#: What a network computes in (``model.precision`` once a run has decided).
PRECISIONS = ("float32", "bfloat16")
#: ``model.precision``: decided at a training run's start by a timed trial where the CPU
#: reports bfloat16 (``distseg.training.startup.precision``); float32 elsewhere.
AUTO = "auto"
PRECISION_CHOICES = (AUTO,) + PRECISIONS
#: ``train.compression``: decided at a multi-node run's start from the link its ranks
#: measured (``distseg.training.startup.compression``); exact float32 on one host.
COMPRESSION_CHOICES = (AUTO,) + COMPRESSIONS
NONFINITE = ("stop", "skip")
#: ``data.augment``: on-the-fly augmentation of training samples (``distseg.data.augment``).
AUGMENTS = ("none", "light", "default")
#: The liver labels 0, 1, 2 (LiTS' convention): what the phantom, the LiTS sample and
#: LiTS-style pairs hold, and what a 3-class data file without ``class_names`` means.
#: Any other file's classes are read from the file (``with_data_classes``).
LIVER_CLASSES = ("background", "liver", "lesion")



def default_inter_op_threads(cores_per_rank: int) -> int:
    """TensorFlow inter-op threads when none are asked for: 1 with at most 2 cores per
    rank, else 2 (a U-Net's graph has little op-level parallelism; more inter-op
    threads only compete for the same cores)."""
    return 1 if cores_per_rank <= 2 else 2

@dataclass(frozen=True)
class ModelConfig:
    """U-Net hyper-parameters (see ``distseg.networks.unet.build_unet``)."""

    image_size: int = 240
    """2D: input height and width; must be divisible by 2**depth."""
    depth: int = 4
    """Number of poolings (the classic U-Net has 4); ``--slab auto`` plans it."""
    base_filters: int = 64
    """Filters of the first level; doubled at each pooling."""
    dropout: float = 0.0
    """Dropout rate applied in the bottleneck (0 disables it)."""
    norm: str = "batch"
    """Normalisation after each convolution: ``batch``, ``group``, ``instance`` (each
    sample's channels normalised alone, eps 1e-5, with scale and offset: nnU-Net's
    choice; like ``group``, independent of the batch, so exact at any rank count) or
    ``none``. Every preset uses ``batch``: on folds of real CT (LiTS 117) BatchNorm
    beat GroupNorm and InstanceNorm by 0.2-0.4 of validation liver Dice in 2D and 3D
    (docs/studies/folds-2026-11-27.md, docs/studies/recipe-real-ct-2026-11-27.md),
    although on the phantom GroupNorm had swung less between validations
    (docs/studies/normalisation-and-lr-scaling-2026-11-23.md); ``train.precise_bn``
    answers the swings."""
    bn_ghost_batch: int = 0
    """BatchNorm statistics over runs of this many samples (ghost batches; 0: each
    rank's whole batch). With a fixed global batch G, g = G / N makes one process
    normalise exactly as N ranks of g samples do, so BatchNorm runs stay exact across
    rank counts up to N (the demo preset: 2, exact at 1, 2 and 4 ranks)."""
    bn_momentum: float = 0.9
    """Momentum of BatchNorm's moving statistics (``norm: batch`` only; used in
    validation and inference).
    0.9, not Keras' 0.99: a short run's moving statistics must forget their initial
    values within its few steps, or validation normalises with them. With 0.99 the
    demo's validation Dice stayed near 0
    (docs/studies/normalisation-and-lr-scaling-2026-11-23.md, "BatchNorm momentum")."""
    num_classes: int = 0
    """Output classes, background included. 0 (every preset): the data file's
    ``num_classes``, filled in at start-up; any other value must equal it
    (``with_data_classes``). The run's ``config.json`` holds the resolved count."""
    class_names: tuple[str, ...] = ()
    """One name per class (the per-class Dice in the logs, the columns of
    ``distseg-predict``). Empty (every preset): the data file's ``class_names``; names
    that differ from the file's are refused."""
    spatial_dims: int = 2
    """2: a network on slices (``--model unet2d``); 3: on slabs of volumes (``unet3d``),
    whose input shape is ``data.slab`` (``image_size`` is then unused). With ``fn``,
    the data file's layout decides (``distseg-train`` sets it)."""
    in_channels: int = 0
    """Input channels (CT: 1; BraTS: 4). 0 (every preset): the data file's channel
    count, filled in at start-up like ``num_classes``; any other value must equal it."""
    fn: str = ""
    """The researcher's own Keras model instead of distseg's U-Net: ``FILE.py:FUNCTION``
    or ``package.module:FUNCTION`` (``--model-fn``; ``distseg.networks.userfn``). Empty:
    distseg's U-Net of the fields above. ``depth``, ``base_filters``, ``norm``,
    ``dropout``, ``bn_*`` and ``recompute`` are the U-Net's and unused with ``fn``."""
    fn_sha256: str = ""
    """The SHA-256 of ``fn``'s source file, recorded when the run starts (its copy is
    ``RUN/model_fn.py``): resume, predict and export load only that source."""
    args: dict = field(default_factory=dict)
    """Keyword arguments for ``fn`` (a JSON object in ``--config``, or ``--model-arg
    KEY=VALUE``); part of the config, so of its hash."""
    recompute: bool = False
    """Gradient checkpointing of every convolution unit of every U-Net level: less
    memory, more time (docs/memory.md)."""
    precision: str = AUTO
    """``float32``, ``bfloat16`` (Keras mixed precision; float32 softmax output) or
    ``auto``: at the start of a training run, bfloat16 where the CPU reports it
    (``avx512_bf16``, ``amx_bf16``) and a timed trial of the run's own step finds it at
    least 10 % faster on every rank, else float32 (``distseg.training.startup.precision``). A
    run's config.json holds the precision decided."""

    @property
    def channels(self) -> int:
        """The input channels the network takes: ``in_channels``, or 1 before start-up
        has filled it in from the data file (CT's one channel)."""
        return self.in_channels or 1


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and distribution settings."""

    epochs: int = 10
    batch_size: int = 8
    """Samples per rank per step when ``global_batch`` is 0 (the global batch is then
    ``batch_size * size``, and the lr is scaled by ``lr_scaling``)."""
    global_batch: int = 0
    """A fixed global batch G (0: off): each of N ranks takes G/N samples per step, step
    k trains on the same G samples at any N, and the lr is not scaled: N ranks make the
    update one process makes with G (``batch_plan``)."""
    global_batch_grows: bool = False
    """With ``global_batch``: when there are more ranks than G (or G is not a multiple
    of them), run ``per_rank = ceil(G / N)`` samples per rank, a global batch of
    ``per_rank * N``, and the lr scaled by ``grown_lr_scaling`` of global / G with the
    warm-up, instead of refusing the run. The presets set it; ``--global-batch`` clears
    it."""
    lr: float = 1e-4
    """Learning rate of a single process; scaled by ``lr_scaling`` for ``size`` ranks."""
    lr_auto: bool = False
    """``--lr auto``: the first launch ran the lr range test (``distseg.training.startup.lrfind``)
    and ``lr`` holds the lr it found."""
    lr_from: str = ""
    """``--lr-from RUN``: the run whose ``lr`` this run took (one lr for every node count
    of a scaling sweep)."""
    lr_scaling: str = "linear"
    """How the lr follows the global batch of per-rank batches on N ranks (N x the
    one-process batch): ``linear`` (x N), ``sqrt`` (x sqrt(N)), ``none``, ``gain``:
    x sqrt(r), r the gain AdaScale measures from the gradient noise scale (between 1
    and N; AdaptDL's rule for Adam), updated every step, or ``adascale``: x r (AdaScale's
    own rule, McCandlish et al.'s optimal step for SGD)."""
    grown_lr_scaling: str = "sqrt"
    """The same choice for a fixed ``global_batch`` G grown past it (more ranks than G):
    the lr follows global / G. ``sqrt`` by default: in the step-exact emulation past G
    it reached the target in fewer samples than ``gain``, whose measured gain stays
    below the batch ratio (docs/studies/grown-batch-2026-11-25.md,
    docs/studies/past-global-batch-8-2026-11-26.md)."""
    batch_policy: str = "fixed"
    """``fixed``: the batch of ``batch_plan`` all run long. ``goodput``: at each epoch's
    end rank 0 chooses the per-rank batch of the next epoch (powers of two up to
    ``max_batch_per_rank``, never a global batch below the base) that maximises the
    predicted goodput, throughput from the run's own step times x efficiency from its
    noise scale (``distseg.core.goodput``; Pollux), switching only for a predicted gain
    of 5 % or more; a batch above the base takes the lr of ``grown_lr_scaling`` (fixed
    global batch) or ``lr_scaling`` (per-rank batches)."""
    max_batch_per_rank: int = 8
    """The largest per-rank batch the ``goodput`` policy may choose (8: the batch one
    process trains with under the default global batch, so it fits where that ran)."""
    compression: str = AUTO
    """How gradients travel between ranks: ``none`` (exact float32), ``fp16`` (Horovod's
    float16 compression: half the bytes, a rounded update) or ``auto`` (every preset):
    at a run's start, on ranks of more than one host, fp16 where the link the ranks
    measure, the gradient bytes and the step's compute time predict at least 10 % more
    samples/s with it, else exact float32; on one host exact float32 without a
    measurement (``distseg.training.startup.compression``; what it gained, and what fp16 cost
    the demo's Dice: docs/performance.md#gradient-compression). A run's config.json
    holds what was decided."""
    warmup_epochs: float = 1.0
    """Epochs over which the lr ramps linearly from ``lr`` to the scaled lr."""
    lr_schedule: str = "constant"
    """After the warm-up: ``constant``, ``cosine`` (half a cosine down to 0) or ``poly``
    (nnU-Net's (1 - f)^0.9), f the share of the run's planned samples trained since the
    warm-up (``lr.decay``)."""
    loss: str = "dice"
    """``dice`` (negative mean soft Dice over classes) or ``dice_ce`` (plus cross-entropy)."""
    optimizer: str = "adam"
    """``adam`` (Keras' Adam, betas 0.9 and 0.999) or ``sgd``: SGD with Nesterov momentum
    ``momentum`` (nnU-Net's optimizer: momentum 0.99, lr 1e-2, poly schedule, weight
    decay 3e-5, gradient norm clipped at 12)."""
    momentum: float = 0.99
    """SGD's Nesterov momentum (``optimizer: sgd`` only)."""
    weight_decay: float = 0.0
    """Keras' decoupled weight decay (each step, weights -= lr x weight_decay x
    weights); 0: none. For SGD the same as an L2 penalty of weight_decay / 2 on the
    loss, up to how momentum carries it."""
    clip_norm: float = 0.0
    """The averaged gradient's global L2 norm is clipped to this before the update (0:
    no clipping). After the allreduce, so every rank clips the same gradient and any
    rank count makes the same update."""
    seed: int = 0
    """Global seed: model init (rank 0's, broadcast) and the per-epoch shard permutation."""
    intra_op_threads: int = 0
    """TensorFlow intra-op threads per rank; 0 means OMP_NUM_THREADS or cores / ranks per node."""
    inter_op_threads: int = 0
    """TensorFlow inter-op threads per rank; 0 means 1 with <= 2 cores per rank, else 2."""
    checkpoint_every: int = 1
    """Save a checkpoint (rank 0 only) every this many epochs; 0 saves only the last."""
    keep_checkpoints: int = 3
    """How many epoch checkpoints to keep."""
    max_steps_per_epoch: int = 0
    """Cap on steps per epoch (0: a full pass); for smoke tests and benchmarks."""
    validate: bool = True
    """Run the sharded validation after each epoch."""
    tensorboard: bool = True
    """Rank 0 writes TensorBoard scalars to ``RUN/tensorboard/`` as it trains
    (``distseg.training.epoch.board``)."""
    hang_timeout: float = 120.0
    """Seconds a rank may wait in a collective before it ends the run, naming the
    ranks that stopped answering (0: wait forever)."""
    precise_bn: int = 0
    """Precise BatchNorm (0: off): after each epoch's steps, before validation and the
    checkpoint, every BatchNorm layer's moving statistics are replaced by the mean batch
    statistics of ``precise_bn`` steps (the epoch's first, then the epochs' before it
    where it has fewer), the weights frozen, averaged
    over the ranks (``distseg.training.epoch.precisebn``): validation and the saved model
    then normalise with statistics of the weights they hold, not an average that lags
    them. Costs a forward pass per step; nothing without BatchNorm."""
    weight_ema: float = 0.0
    """Validate and save an exponential moving average of the weights, decay
    ``weight_ema`` a step (0: off; ``distseg.training.epoch.weightema``): when an epoch's steps
    are done the model takes the average for precise BatchNorm, validation and the
    epoch's checkpoint, then training goes on from the live weights. Steadies the
    validated model where small batches make each step move it far (3D)."""
    noise_every: int = 0
    """Which steps measure the gradient noise scale (its norms and, on one rank, the
    batch's two halves): every ``noise_every``-th, or 0 (``auto``, the default): every
    step where the estimate steers the lr or the batch (``gain``, ``adascale``,
    ``goodput``); elsewhere the first epoch measures every 4th step and times both
    kinds, then the smallest cadence
    whose measured steps take at most 1 % of training (``distseg.training.progress.noise``'s
    ``Cadence``; a checkpoint keeps the decision). The update is the same math on
    every step; on one rank the steps that halve the batch round differently, so give
    a number for runs that must repeat bit for bit."""
    on_nonfinite: str = "stop"
    """A non-finite loss or gradient on any rank: ``stop`` the run (every rank, with one
    message) or ``skip`` that step's update on every rank and count it in the log."""


@dataclass(frozen=True)
class DataConfig:
    """Where the data comes from and how it is fed."""

    path: str = ""
    """HDF5 file in the distseg format (see docs/data.md)."""
    resize: bool = False
    """Resize slices whose size differs from ``model.image_size`` instead of refusing them."""
    prefetch: int = 2
    """Batches read ahead by a background thread."""
    slab: str = ""
    """3D only: the training input ``D,H,W`` (each divisible by 2**depth) cut from each
    volume, ``full`` for whole volumes of one shape, or ``auto``: the slab, ``model.depth``
    and the batch planned from the data file (``distseg.data.slabplan``)."""
    foreground_fraction: float = 0.0
    """Foreground oversampling (nnU-Net's ``oversample_foreground_percent``, 0.33): the
    share of training samples made to hold foreground, decided per sample from (seed,
    epoch, id), so any rank count draws alike. 3D: slabs re-centred on a random
    foreground voxel of their case; 2D: slices replaced by a random training slice that
    holds foreground (``feeds.ForegroundSlices``)."""
    val_overlap: float = 0.5
    """3D only: overlap of the sliding windows that validate whole volumes."""
    fold: int = -1
    """The cross-validation fold this run validates (``distseg-train --fold I``): the
    data file's fold table (``distseg.data.folds``) decides, case by case, what trains
    and what validates; the file's test cases stay out of every fold. -1: the split the
    file was written with. A config.json written before this field existed means -1."""
    augment: str = "none"
    """On-the-fly augmentation of the training samples (never of validation):
    ``none``, ``light`` or ``default`` (``distseg.data.augment``). Each sample's draw
    depends on the run's seed, the epoch and the sample's id only, so any rank count
    makes the same update. The liver2d preset uses ``default``, the others ``none``; a
    config.json written before this field existed means ``none``."""


@dataclass(frozen=True)
class Config:
    """Everything a run needs; written to ``RUN/config.json``."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run_dir: str = ""

    def validate(self) -> "Config":
        """Raises ``ValueError`` naming the first bad field; returns self."""
        checks = _model_checks(self) + _train_checks(self) + _data_checks(self)
        for ok, name, why in checks:
            if not ok:
                raise InputError(f"config field {name} {why}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _model_checks(cfg: "Config") -> list:
    """(ok, field, why) of the ``model`` fields (``Config.validate``)."""
    m = cfg.model
    # 2**depth of an absurd depth would take forever; and no image_size below 2**63
    # is divisible by 2**63 or more.
    pool = 2 ** m.depth if 0 <= m.depth < 63 else None
    return [
        (m.image_size >= 8, "model.image_size", f"must be >= 8, got {m.image_size}"),
        (m.depth >= 1, "model.depth", f"must be >= 1, got {m.depth}"),
        # A 3D U-Net takes the slab (whose depth --slab auto may plan), not image_size.
        (bool(m.fn) or m.spatial_dims == 3 or (pool is not None and m.image_size % pool == 0),
         "model.image_size",
         f"{m.image_size} is not divisible by 2**depth = {pool or f'2**{m.depth}'}"),
        (m.base_filters >= 1, "model.base_filters", f"must be >= 1, got {m.base_filters}"),
        (0.0 <= m.dropout < 1.0, "model.dropout", f"must be in [0, 1), got {m.dropout}"),
        (m.norm in NORMS, "model.norm", f"must be one of {NORMS}, got {m.norm!r}"),
        (m.bn_ghost_batch >= 0, "model.bn_ghost_batch", f"must be >= 0, got {m.bn_ghost_batch}"),
        (0.0 <= m.bn_momentum < 1.0, "model.bn_momentum",
         f"must be in [0, 1), got {m.bn_momentum}"),
        (m.num_classes == 0 or m.num_classes >= 2, "model.num_classes",
         f"must be >= 2 (or 0: from the data file), got {m.num_classes}"),
        (_names_ok(m.class_names, m.num_classes), "model.class_names",
         f"must be {m.num_classes or 'the'} distinct non-empty names (or empty: from the "
         f"data file), got {_shown(list(m.class_names))}"),
        (m.in_channels >= 0, "model.in_channels",
         f"must be >= 1 (or 0: from the data file), got {m.in_channels}"),
        (not m.fn or ":" in m.fn, "model.fn",
         f"must be FILE.py:FUNCTION or package.module:FUNCTION, got {_shown(m.fn)}"),
        (_json_object(m.args), "model.args",
         f"must be a JSON object of finite values with string keys, got {_shown(m.args)}"),
        (m.spatial_dims in (2, 3), "model.spatial_dims", f"must be 2 or 3, got {m.spatial_dims}"),
        (m.precision in PRECISION_CHOICES, "model.precision",
         f"must be one of {PRECISION_CHOICES}, got {m.precision!r}"),
    ]


def _train_checks(cfg: "Config") -> list:
    """(ok, field, why) of the ``train`` fields."""
    t = cfg.train
    return [
        (t.epochs >= 1, "train.epochs", f"must be >= 1, got {t.epochs}"),
        (t.batch_size >= 1, "train.batch_size", f"must be >= 1, got {t.batch_size}"),
        (t.global_batch >= 0, "train.global_batch", f"must be >= 0 (0: off), got {t.global_batch}"),
        (t.lr > 0, "train.lr", f"must be > 0, got {t.lr}"),
        (not (t.lr_auto and t.lr_from), "train.lr_auto",
         f"cannot be combined with train.lr_from ({t.lr_from!r}): find the lr or take it"),
        (t.lr_scaling in LR_SCALINGS, "train.lr_scaling",
         f"must be one of {LR_SCALINGS}, got {t.lr_scaling!r}"),
        (t.grown_lr_scaling in LR_SCALINGS, "train.grown_lr_scaling",
         f"must be one of {LR_SCALINGS}, got {t.grown_lr_scaling!r}"),
        (t.batch_policy in BATCH_POLICIES, "train.batch_policy",
         f"must be one of {BATCH_POLICIES}, got {t.batch_policy!r}"),
        (t.max_batch_per_rank >= 1, "train.max_batch_per_rank",
         f"must be >= 1, got {t.max_batch_per_rank}"),
        (t.compression in COMPRESSION_CHOICES, "train.compression",
         f"must be one of {COMPRESSION_CHOICES}, got {t.compression!r}"),
        (t.warmup_epochs >= 0, "train.warmup_epochs", f"must be >= 0, got {t.warmup_epochs}"),
        (t.lr_schedule in LR_SCHEDULES, "train.lr_schedule",
         f"must be one of {LR_SCHEDULES}, got {t.lr_schedule!r}"),
        (t.loss in LOSSES, "train.loss", f"must be one of {LOSSES}, got {t.loss!r}"),
        (t.optimizer in OPTIMIZERS, "train.optimizer",
         f"must be one of {OPTIMIZERS}, got {t.optimizer!r}"),
        (0.0 <= t.momentum < 1.0, "train.momentum", f"must be in [0, 1), got {t.momentum}"),
        (t.weight_decay >= 0, "train.weight_decay", f"must be >= 0, got {t.weight_decay}"),
        (t.clip_norm >= 0, "train.clip_norm", f"must be >= 0 (0: off), got {t.clip_norm}"),
        (t.precise_bn >= 0, "train.precise_bn", f"must be >= 0 (0: off), got {t.precise_bn}"),
        (0.0 <= t.weight_ema < 1.0, "train.weight_ema",
         f"must be in [0, 1) (0: off), got {t.weight_ema}"),
        (t.noise_every >= 0, "train.noise_every", f"must be >= 0 (0: auto), got {t.noise_every}"),
        (t.on_nonfinite in NONFINITE, "train.on_nonfinite",
         f"must be one of {NONFINITE}, got {t.on_nonfinite!r}"),
        (t.intra_op_threads >= 0, "train.intra_op_threads", "must be >= 0"),
        (t.inter_op_threads >= 0, "train.inter_op_threads", "must be >= 0"),
        (t.checkpoint_every >= 0, "train.checkpoint_every", "must be >= 0"),
        (t.hang_timeout >= 0, "train.hang_timeout", "must be >= 0"),
        (t.keep_checkpoints >= 1, "train.keep_checkpoints", "must be >= 1"),
        (t.max_steps_per_epoch >= 0, "train.max_steps_per_epoch", "must be >= 0"),
    ]


def _data_checks(cfg: "Config") -> list:
    """(ok, field, why) of the ``data`` fields and the run directory."""
    m, d = cfg.model, cfg.data
    return [
        (d.prefetch >= 1, "data.prefetch", "must be >= 1"),
        (d.augment in AUGMENTS, "data.augment",
         f"must be one of {AUGMENTS}, got {d.augment!r}"),
        (m.spatial_dims == 3 or not d.slab, "data.slab",
         f"is for 3D models (--model unet3d), got {d.slab!r} with unet2d"),
        (m.spatial_dims == 2 or bool(d.slab), "data.slab",
         "is required with --model unet3d (--slab D,H,W or --slab full)"),
        (0.0 <= d.foreground_fraction <= 1.0, "data.foreground_fraction",
         f"must be in [0, 1], got {d.foreground_fraction}"),
        (0.0 <= d.val_overlap < 1.0, "data.val_overlap",
         f"must be in [0, 1), got {d.val_overlap}"),
        (d.fold >= -1, "data.fold", f"must be a fold index >= 0 (or -1: the file's split), got {d.fold}"),
        (bool(d.path), "data.path", "is required (--data FILE.h5)"),
        (bool(cfg.run_dir), "run_dir", "is required (--run-dir DIR)"),
    ]


def _json_object(value: Any) -> bool:
    """Whether ``value`` is a mapping that JSON holds as it is (string keys, no NaN)."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        return False
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _names_ok(names: tuple[str, ...], num_classes: int) -> bool:
    if not names:
        return True
    return (len(set(names)) == len(names) >= 2 and all(n.strip() for n in names)
            and num_classes in (0, len(names)))


def with_data_classes(cfg: Config, path: str, num_classes: int,
                      class_names: tuple[str, ...], channels: int = 1) -> Config:
    """``cfg`` with the classes of the data file at ``path`` (its ``num_classes`` and
    ``class_names``) and its input ``channels`` filled in where the config leaves them
    unset (0, empty).

    What the data file knows, the data file decides: a set value that differs is
    refused, naming both.

    Raises:
      InputError: one line naming the file and its value, the field and its value.
    """
    m = cfg.model
    if m.num_classes and m.num_classes != num_classes:
        raise InputError(f"{path}: holds {num_classes} classes (attribute num_classes), but "
                         f"config field model.num_classes is {m.num_classes}; leave the "
                         "field out (0: the data file decides) or train on a file of "
                         f"{m.num_classes} classes")
    if m.class_names and tuple(m.class_names) != tuple(class_names):
        raise InputError(f"{path}: names its classes {_shown(list(class_names))} (attribute "
                         f"class_names), but config field model.class_names is "
                         f"{_shown(list(m.class_names))}; leave the field out (the data "
                         "file decides)")
    if m.in_channels and m.in_channels != channels:
        raise InputError(f"{path}: holds images of {channels} channel(s), but config field "
                         f"model.in_channels is {m.in_channels}; leave the field out (0: the "
                         "data file decides)")
    model = dataclasses.replace(m, num_classes=num_classes, class_names=tuple(class_names),
                                in_channels=channels)
    return dataclasses.replace(cfg, model=model)


def default() -> Config:
    """The livermask-style 2D base of the presets: 240x240, 4 poolings, 64 filters
    (~31M params), GroupNorm, a fixed global batch of 8 (more ranks, the same model
    sooner: docs/studies/fixed-global-batch-2026-11-24.md). Each preset sets its own
    normalisation and loss, decided on real CT."""
    return Config(model=ModelConfig(norm="group"),
                  train=TrainConfig(global_batch=8, global_batch_grows=True))


def liver2d() -> Config:
    """``default()`` with BatchNorm over ghost batches of 2 (1, 2 and 4 ranks of the
    global batch of 8 normalise alike), Dice + cross-entropy, precise BatchNorm
    statistics before each validation, the poly schedule and no augmentation.
    On 4 folds of LiTS 117 (at 128x128) BatchNorm with Dice + cross-entropy reached a
    far higher validation liver Dice than the GroupNorm and Dice loss it replaced, and
    precise BatchNorm with poly stopped its swings between validations, at 1 and 2
    ranks alike (docs/studies/recipe-real-ct-2026-11-27.md). Augmentation
    (``--augment default``, the phantom's choice for the GroupNorm model this preset
    had, docs/studies/augmentation-2026-11-26.md) lowered this recipe's fold mean on
    held-out slabs of the real case and bought nothing on shifted phantoms, so it is
    off; a dataset of many patients and scanners may still want it (same study)."""
    base = default()
    return dataclasses.replace(
        base, model=dataclasses.replace(base.model, norm="batch", bn_ghost_batch=2),
        train=dataclasses.replace(base.train, loss="dice_ce", precise_bn=16, lr_schedule="poly"))


def demo() -> Config:
    """The bundled LiTS case at 128x128 with a small U-Net: minutes on a laptop."""
    base = default()
    return dataclasses.replace(
        base,
        # Ghost batches of 2: BatchNorm normalises as 4 ranks x 2 slices would, so 1, 2
        # and 4 ranks train the same model (docs/studies/fixed-global-batch-2026-11-24.md,
        # "Which normalisation for the demo").
        model=dataclasses.replace(base.model, image_size=128, base_filters=16, norm="batch",
                                  bn_ghost_batch=2),
        # Dice + cross-entropy: on 4 folds of LiTS 117 at 2 seeds it raised the mean final
        # validation liver Dice and the worst fold's, at 1 and 2 ranks alike; GroupNorm,
        # InstanceNorm, poly and a higher lr did not (docs/studies/folds-2026-11-27.md).
        train=dataclasses.replace(base.train, epochs=8, batch_size=8, lr=1e-3, warmup_epochs=1.0,
                                  global_batch=8, global_batch_grows=True, loss="dice_ce"),
    )


def smoke() -> Config:
    """A tiny model on tiny data for tests: seconds per epoch."""
    base = default()
    return dataclasses.replace(
        base,
        # float32, no precision trial: tests compare numbers across runs and ranks.
        model=dataclasses.replace(base.model, image_size=32, depth=2, base_filters=4,
                                  norm="batch", precision="float32"),
        # Per-rank batches, the lr scaled with the ranks: what most tests exercise.
        train=dataclasses.replace(base.train, epochs=1, batch_size=4, lr=5e-3, warmup_epochs=0.0,
                                  global_batch=0, global_batch_grows=False),
    )


def liver3d() -> Config:
    """The 3D U-Net of the reference BraTS study (16 base filters, 4 poolings, ~5.65M
    parameters) on 32x128x128 slabs, one per rank per step, trained as decided on 4
    folds of LiTS 117's volumes (docs/studies/recipe-real-ct-2026-11-27.md): BatchNorm
    (far above GroupNorm and InstanceNorm), Dice + cross-entropy, precise BatchNorm
    statistics before each validation, 90 epochs; measured at 1 and 2 ranks on
    ``lits-sample``'s default files too (CT normalised by the foreground). Adam at 1e-3
    constant beat nnU-Net's SGD with poly, poly alone and a fixed global batch of 2
    slabs."""
    base = default()
    return dataclasses.replace(
        base,
        model=dataclasses.replace(base.model, spatial_dims=3, base_filters=16, image_size=128,
                                  norm="batch"),
        data=dataclasses.replace(base.data, slab="32,128,128", foreground_fraction=0.5),
        # One slab per rank per step (a global batch that grows with the ranks): a fixed
        # global batch of 2 slabs made 1 and 2 ranks alike but ended lower and swung as
        # 2 ranks do (the study). precise_bn 16: the statistics of 16 steps, from the
        # epochs before where an epoch is shorter (LiTS 117's epochs are a few steps,
        # whose few slabs' statistics made 2 ranks' validation swing; the study's
        # "liver3d at 2 ranks: what swings").
        train=dataclasses.replace(base.train, batch_size=1, lr=1e-3, epochs=90, global_batch=0,
                                  global_batch_grows=False, loss="dice_ce", precise_bn=16))


def smoke3d() -> Config:
    """A tiny 3D U-Net on tiny volumes for tests: seconds per epoch."""
    base = smoke()
    return dataclasses.replace(
        base, model=dataclasses.replace(base.model, spatial_dims=3),
        data=dataclasses.replace(base.data, slab="16,32,32"),
        train=dataclasses.replace(base.train, batch_size=2))


PRESETS = {"liver2d": liver2d, "demo": demo, "smoke": smoke, "liver3d": liver3d,
           "smoke3d": smoke3d}


def _merge(obj: Any, updates: Mapping[str, Any], where: str) -> Any:
    """Returns a copy of dataclass ``obj`` with nested ``updates`` applied."""
    names = {f.name: f for f in dataclasses.fields(obj)}
    changes = {}
    for key, value in updates.items():
        if key not in names:
            label = f"{where}{key}"
            label = label if label.isprintable() else _shown(label)  # one line, whatever the key
            raise InputError(f"config field {label} is unknown (known: {', '.join(names)})")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, Mapping):
                raise InputError(f"config field {where}{key} must be a mapping")
            changes[key] = _merge(current, value, f"{where}{key}.")
        else:
            changes[key] = _typed(value, current, f"{where}{key}")
    return dataclasses.replace(obj, **changes)


def _typed(value: Any, current: Any, name: str) -> Any:
    """``value`` as the type of the field's ``current`` value, or a ValueError naming the
    field. No silent conversions: ``"false"`` is not a bool, ``2.5`` is not an int; nor
    is a number past 64 bits, infinite or NaN a setting (it would overflow later)."""
    kind = type(current)
    if kind is tuple:  # a list of names in JSON
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise InputError(f"config field {name} must be a list of strings, got {_shown(value)}")
        return tuple(value)
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = current is None or isinstance(value, kind)
    if not ok:
        raise InputError(f"config field {name} must be {kind.__name__}, got {_shown(value)}")
    limit = {int: 2 ** 63 - 1, float: sys.float_info.max}.get(kind)
    if limit is not None and not abs(value) <= limit:
        what = "an int of at most 64 bits" if kind is int else "a finite float"
        raise InputError(f"config field {name} must be {what}, got {_shown(value)}")
    return float(value) if kind is float else value


def _shown(value: Any) -> str:
    """``value`` for a one-line message: short, escaped, never an int too long to print."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    try:
        return reprlib.repr(value)
    except ValueError:  # an int too long to print, nested in a list
        return f"a {type(value).__name__}"


def resolve(preset: str = "liver2d", file: str | None = None,
            overrides: Mapping[str, Any] | None = None,
            under: Mapping[str, Any] | None = None) -> Config:
    """Layers preset -> ``under`` -> JSON file -> overrides (both ``{"train.lr": 0.1}``
    style) and validates. ``under``: values the file's own replace (what a field it
    lacks meant when it was written)."""
    if preset not in PRESETS:
        raise InputError(f"preset {preset!r} is unknown (known: {', '.join(PRESETS)})")
    cfg = _overridden(PRESETS[preset](), under)
    if file:
        try:
            with open(file, encoding="utf-8") as f:
                loaded = json.load(f)
        except (OSError, ValueError, RecursionError) as e:
            # ValueError: besides bad JSON, bytes that are not UTF-8 and integers too long
            # to convert; RecursionError: arrays nested thousands deep.
            raise InputError(f"config file {file}: cannot be read as JSON ({e})") from e
        if not isinstance(loaded, Mapping):
            raise InputError(f"config file {file}: holds {_shown(loaded)}, expected a JSON "
                             'object such as {"train": {"lr": 0.001}}')
        cfg = _merge(cfg, loaded, "")
    return _overridden(cfg, overrides).validate()


def _overridden(cfg: Config, overrides: Mapping[str, Any] | None) -> Config:
    """``cfg`` with ``{"train.lr": 0.1}``-style ``overrides`` (None values skipped)."""
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        *parents, leaf = dotted.split(".")
        update: Any = {leaf: value}
        for p in reversed(parents):
            update = {p: update}
        # One at a time: "train" (not a mapping) and "train.lr" may both be given.
        cfg = _merge(cfg, update, "")
    return cfg


#: Fields a resumed run may change: they do not change what is trained (``epochs`` may
#: only extend the run, which ``distseg.training.loop`` checks against the checkpoint).
RESUME_MAY_CHANGE = ("train.epochs", "train.intra_op_threads", "train.inter_op_threads",
                     "train.checkpoint_every", "train.keep_checkpoints", "train.validate",
                     "train.tensorboard",
                     "train.on_nonfinite", "train.hang_timeout", "train.noise_every",
                     "data.prefetch")


#: Fields added since runs were first written, with what a config.json without them
#: trained with, where that differs from the liver2d preset it is read over.
ABSENT_MEANS = {"train.lr_schedule": "constant", "train.precise_bn": 0,
                "train.compression": "none", "train.noise_every": 1}


def _get(cfg: Config, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def for_resume(run_dir: str, overrides: Mapping[str, Any] | None = None) -> Config:
    """The config of the run in ``run_dir`` (its ``config.json``) with the allowed
    ``overrides`` applied. An override that would change what is trained (data, model,
    seed, batch, learning rate...) raises ``InputError`` naming the field."""
    path = rundir.config_path(run_dir.rstrip("/"))
    if not os.path.exists(path):
        raise InputError(f"{run_dir}: holds no {rundir.CONFIG_FILE}, so there is no run to --resume")
    saved = resolve("liver2d", path, {"run_dir": run_dir}, under=ABSENT_MEANS)
    changes = {k: v for k, v in (overrides or {}).items() if v is not None and k != "run_dir"}
    for dotted, value in changes.items():
        was = _get(saved, dotted)
        if value != was and dotted not in RESUME_MAY_CHANGE:
            raise InputError(f"config field {dotted}: the run was trained with {was!r}; "
                             f"--resume cannot change it to {value!r} (it may change "
                             f"{', '.join(f.split('.')[-1] for f in RESUME_MAY_CHANGE)})")
    return resolve("liver2d", path, {**changes, "run_dir": run_dir}, under=ABSENT_MEANS)
