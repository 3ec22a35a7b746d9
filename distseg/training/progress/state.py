"""The training state that changes with progress: the epoch plan in force, the gradient
noise scale's averages, the gain-weighted progress, the samples trained, the lr rule and
the ``goodput`` batch policy.

One object, ``TrainingState``, that the loop asks for each step's lr and each epoch's batch,
feeds with each step's gradient norms and time, and saves and restores with a checkpoint
(``state()``/``restore()``). The benchmark's emulation drives the same object, so a
change to the lr rule or the policy is made once. Plain Python: no TensorFlow, no
Horovod; the loop does the collectives (rank 0 decides, every rank ``take``s).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from distseg.core import batchplan, goodput, lr
from distseg.core import config as config_lib
from distseg.training.progress import noise as noise_lib
from distseg.training.progress.batchpolicy import BatchPolicy, kept_per_rank
from distseg.training.progress.noise import Cadence, NoiseScale
from distseg.training.progress.plan import EpochPlan, origin_step


def noise_steers(train_cfg) -> bool:
    """Whether the run's lr or batch follows the gradient noise scale: an lr rule of
    ``lr.GAIN_RULES`` (per-rank or grown batches) or the ``goodput`` policy."""
    return (train_cfg.batch_policy == "goodput"
            or bool({train_cfg.lr_scaling, train_cfg.grown_lr_scaling} & set(lr.GAIN_RULES)))


@dataclass
class TrainingState:
    """The lr and batch of every step of one launch, and what they depend on.

    It holds the values of the run's ``TrainConfig`` it reads at every step (the
    schedule's ``epochs``, ``warmup_epochs`` and ``lr_schedule``), not the config: the
    loop's session holds that, and hands it to ``take``, which plans a new batch by it.

    Args:
      epochs, warmup_epochs, lr_schedule: the run's (``train.*``).
      train_samples: training samples in the data file.
      ranks: ranks of this launch (the emulation's: processes it emulates).
      fold: how many ranks each of ``ranks`` stands for (the benchmark's emulation of a
        grown batch as fewer ranks of more slices; 1 in a real run). The policy chooses
        per stood-for rank.
    """

    epochs: int
    warmup_epochs: float
    lr_schedule: str
    train_samples: int
    ranks: int
    plan: EpochPlan
    noise: NoiseScale
    policy: BatchPolicy | None = None
    """The ``goodput`` batch policy (None: ``fixed``)."""
    fold: int = 1
    progress: float = 0.0
    """Steps of the base batch trained, each step weighted by its gain: the ``gain``
    rule's clock (AdaScale's scale-invariant iterations)."""
    samples: int = 0
    """Samples trained, all ranks: the warm-up's clock under the ``goodput`` policy."""
    lr_now: float | None = None
    """The lr of the latest step."""
    trained: int = 0
    """Samples trained in the whole run, all ranks, whatever the batch: the lr
    schedule's clock."""
    horizon: float = 0.0
    """The samples the run plans (at its first launch, ``state``): where the lr schedule
    ends."""
    note: str | None = None
    """What a resume did to the schedule, for the resume record's warnings."""
    cadence: Cadence = field(default_factory=lambda: Cadence(1))
    """Which steps measure the noise scale (``train.noise_every``); each launch decides
    its own under ``auto``."""

    @classmethod
    def initial(cls, train_cfg, train_samples: int, ranks: int, kept: dict | None = None,
              fold: int = 1) -> "TrainingState":
        """The state a launch starts with, at the batch a checkpoint's ``kept``
        ``state()`` was training under the policy (at the same number of ranks), else
        at the config's; ``restore`` then continues the rest of ``kept``."""
        per_rank = kept_per_rank(kept, ranks * fold)
        if per_rank is None and fold > 1:
            per_rank = batchplan.batch_plan(train_cfg, ranks * fold).per_rank
        plan = EpochPlan.of(train_cfg, train_samples, ranks,
                            None if per_rank is None else per_rank * fold)
        batch = plan.batch
        noise = NoiseScale(batch.per_rank, batch.global_batch, batch.base)
        policy = None
        if train_cfg.batch_policy == "goodput":
            policy = BatchPolicy(ranks * fold, batch.base, train_cfg.max_batch_per_rank,
                                 batch.per_rank // fold)
        planned = EpochPlan.of(train_cfg, train_samples, ranks * fold)
        horizon = float(train_cfg.epochs * planned.steps * planned.batch.global_batch)
        return cls(train_cfg.epochs, train_cfg.warmup_epochs, train_cfg.lr_schedule,
                   train_samples, ranks, plan, noise, policy, fold, horizon=horizon,
                   cadence=Cadence.of(train_cfg.noise_every, noise_steers(train_cfg)))

    @classmethod
    def for_launch(cls, train_cfg, train_samples: int, ranks: int, resumed,
                   origin: tuple[int, int]) -> tuple["TrainingState", int]:
        """The state a launch at (epoch, step) ``origin`` begins with, and its global
        step: a ``resume.Resumed`` launch continues what its checkpoint kept (a note on
        what it did to the schedule joins ``resumed.warnings``); None: a new run."""
        kept = resumed.position.training if resumed else None
        training = cls.initial(train_cfg, train_samples, ranks, kept)
        global_step = origin_step(resumed.position.global_step if resumed else 0,
                                  training.plan, origin)
        training.restore(kept, global_step)
        if training.note:
            resumed.warnings.append(training.note)
        return training, global_step

    @property
    def warm(self) -> float:
        """Samples of the warm-up, on the schedule's clock."""
        return self.warmup_epochs * self.horizon / self.epochs

    def decay(self) -> float:
        """The schedule's factor on the lr of the next step (``lr.decay``)."""
        return lr.decay(self.lr_schedule, self.trained, self.warm, self.horizon)

    # --- each step -------------------------------------------------------------------

    def lr(self, global_step: int) -> float:
        """The lr of the step after ``global_step`` steps (kept as ``lr_now``)."""
        # The warm-up's clock: steps of this batch, or, under the batch policy, samples
        # in steps of this batch (the same warm-up in samples whatever batches came
        # before).
        big = self.plan.batch.global_batch
        clock = global_step if self.policy is None else self.samples / big
        self.lr_now = lr.at(self.plan, clock, self.noise.gain(big), self.progress) * self.decay()
        return self.lr_now

    def set_lr(self, optimizer, global_step: int) -> float:
        """``lr(global_step)``, given to ``optimizer`` (``lr.assign``, its one writer)
        where it changed: during the warm-up, and every step with the gain rule."""
        before = self.lr_now
        now = self.lr(global_step)
        if now != before:
            lr.assign(optimizer, now)
        return now

    def observe(self, grad_sq, applied: bool, seconds: float | None = None,
                mode: int = noise_lib.MEASURE) -> None:
        """One step: its squared gradient norms (``steps.StepResult.grad_sq``), whether
        its update was applied (every rank skips a non-finite one), its time for the
        policy and the cadence (None: not timed, e.g. a step that traced the train
        step), and what it did for the noise scale (``noise.MEASURE``: its norms stand
        for the cadence's steps; otherwise it has none)."""
        big = self.plan.batch.global_batch
        if applied and mode == noise_lib.MEASURE:
            self.noise.update(*grad_sq, steps=self.cadence.every)
        if applied:
            self.progress += self.noise.gain(big)
        self.samples += big
        self.trained += big
        if self.policy is not None and seconds is not None:
            self.policy.observe(seconds)
        self.cadence.observe(mode, seconds)

    # --- each epoch's end ------------------------------------------------------------

    def decide(self, seconds=None) -> goodput.Choice | None:
        """The policy's choice of the next epoch's per-rank batch from what this rank
        measured (``seconds``: per-rank batch -> a step's seconds, instead of the
        policy's own times); None without the policy. Rank 0's is the one every rank
        takes."""
        if self.policy is None:
            return None
        avg = self.noise.averages["preconditioned"]
        return self.policy.decide(avg.g2, avg.tr_sigma, seconds)

    def take(self, choice: goodput.Choice | None, train_cfg: config_lib.TrainConfig) -> bool:
        """Adopts rank 0's ``choice``; on a new batch, the plan of that batch by
        ``train_cfg``'s batch rule (the run's) and the noise scale resized to it.
        Returns whether the batch changed."""
        if choice is None or not self.policy.take(choice):
            return False
        self.plan = EpochPlan.of(train_cfg, self.train_samples, self.ranks,
                                 self.policy.per_rank * self.fold)
        self.noise.resize(self.plan.batch.per_rank, self.plan.batch.global_batch)
        return True

    def epoch_fields(self, ran: int, choice: goodput.Choice | None) -> dict:
        """What an ``epoch`` record holds of this state: the noise scale, the lr rule and,
        under the policy, the per-rank batch the epoch ``ran`` and ``choice`` for the
        next one."""
        fields = {"noise_scale": {**self.noise.record(), "cadence": self.cadence.record()},
                  "lr_rule": self.lr_rule()}
        if self.policy is not None:
            fields["goodput"] = self.policy.record(ran, choice)
        return fields

    def lr_rule(self) -> dict:
        """The ``lr_rule`` field of an ``epoch`` record: the rule, the lr in force, the
        gain of this run's global batch over the base batch, and the gain-weighted
        progress."""
        batch = self.plan.batch
        return {"rule": batch.lr_scaling, "lr": self.lr_now,
                "schedule": self.lr_schedule, "horizon": self.horizon,
                "gain": self.noise.gain(batch.global_batch), "progress": self.progress,
                "global_batch": batch.global_batch, "base_batch": batch.base}

    # --- checkpoints -----------------------------------------------------------------

    def state(self) -> dict:
        """What a checkpoint keeps (its ``training`` entry; ``restore`` reads it back)."""
        return {"noise": self.noise.state(), "progress": self.progress,
                "samples": self.samples, "global_batch": self.plan.batch.global_batch,
                "trained": self.trained, "horizon": self.horizon, "epochs": self.epochs,
                "cadence": self.cadence.record(),
                "policy": None if self.policy is None else self.policy.state()}

    def restore(self, kept: dict | None, global_step: int = 0) -> None:
        """Continues a checkpoint's ``state()``: the averages, progress and samples where
        it trained the same global batch (a run of other ranks or batches: afresh), the
        policy's state where the policy kept one, the cadence ``auto`` decided
        (``noise.Cadence.restore``). A checkpoint that kept no sample count
        trained ``global_step`` steps of this batch."""
        big = self.plan.batch.global_batch
        if kept and kept.get("global_batch") == big:
            self.noise.restore(kept.get("noise"))
            self.progress = float(kept.get("progress", 0.0))
            self.samples = int(kept.get("samples", global_step * big))
        if kept and self.policy is not None:
            self.policy.restore(kept.get("policy"))
        if kept:
            self.cadence.restore(kept.get("cadence"))
        self.trained = int(kept["trained"]) if kept and "trained" in kept else \
            (self.samples or global_step * big)
        if kept and kept.get("horizon"):
            self._keep_horizon(float(kept["horizon"]), int(kept["epochs"]))

    def _keep_horizon(self, horizon: float, epochs: int) -> None:
        """The first launch's horizon; stretched in proportion when a resume changes
        ``--epochs`` (then ``note`` says how the next step's lr moves)."""
        before = lr.decay(self.lr_schedule, self.trained,
                          self.warmup_epochs * horizon / epochs, horizon)
        self.horizon = horizon * self.epochs / epochs
        if epochs != self.epochs and self.lr_schedule != "constant":
            self.note = (f"--epochs {epochs} -> {self.epochs} moves the end of the "
                         f"{self.lr_schedule} lr schedule from {horizon:,.0f} to "
                         f"{self.horizon:,.0f} samples: the next step's lr is "
                         f"{self.decay():.3g} x the base where it would have been {before:.3g} x")
