"""Start-up of a run on every rank: the checks that need no side effect, then the run
directory, then the precision and the model and optimizer every rank holds
identically, and the link between the ranks as they measure it.

Every piece that can fail on one rank alone is called through ``agreement.agree``, so
all ranks stop together with the same message.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

from distseg.core import config as config_lib
from distseg.core import link, rundir
from distseg.core.errors import RunError
from distseg.data import feeds
from distseg.parallel import agreement
from distseg.parallel import distributed as dist
from distseg.training import checkpoint, lrfind, precision, resume


def check_inputs(cfg: config_lib.Config, ctx: dist.Context) -> feeds.Feed:
    """Everything that can be wrong with the data, or a ``--model-fn`` model, before
    training starts; the feed (slices or slabs) the run reads, whose ``cfg`` records
    the model's source (``userfn.recorded``)."""
    # Rank 0 reads every mask once to check the labels; the others trust its verdict.
    feed = feeds.open_feed(cfg, ctx.size, check_labels=ctx.is_root())
    if cfg.model.fn:
        feed.cfg = check_model_fn(feed.cfg, feed.input_shape)
    return feed


def with_model_source(cfg: config_lib.Config) -> config_lib.Config:
    """``cfg`` with a ``--model-fn``'s source recorded (``userfn.recorded``), on this
    rank alone (no collective: an elastic run's start)."""
    import dataclasses

    from distseg.networks import userfn
    return dataclasses.replace(cfg, model=userfn.recorded(cfg.model))


def check_model_fn(cfg: config_lib.Config, input_shape) -> config_lib.Config:
    """``cfg`` with its model's source recorded, after one build of the model in
    float32 whose output is checked (``userfn.build``)."""
    import dataclasses

    from distseg.networks import userfn
    cfg = with_model_source(cfg)
    userfn.build(dataclasses.replace(cfg.model, precision="float32"), input_shape,
                 run_dir=cfg.run_dir)
    return cfg


def _refuse_existing_run(run_dir: str, ctx: dist.Context) -> None:
    found = rundir.existing_run(run_dir) if ctx.is_root() else None
    if found:
        raise RunError(f"{run_dir}: already holds a run ({found} exists); "
                       "choose a new --run-dir", exit_code=2)


def _probe_writable(run_dir: str, ctx: dist.Context) -> None:
    logs = rundir.log_dir(run_dir)
    probe = os.path.join(logs, f".probe-{ctx.rank}-{os.getpid()}")
    try:
        os.makedirs(logs, exist_ok=True)
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise RunError(f"{run_dir}: run directory is not writable ({e.strerror})", exit_code=2)


def _write_config(cfg: config_lib.Config, ctx: dist.Context) -> None:
    # Chief-only side effect: one config per run, written before any rank logs.
    if ctx.is_root():
        from distseg.networks import userfn
        userfn.keep_copy(cfg.model, cfg.run_dir)
        checkpoint.write_json_atomic(rundir.config_path(cfg.run_dir), cfg.to_dict())
        os.makedirs(rundir.checkpoint_dir(cfg.run_dir), exist_ok=True)


def check_run_dir(cfg: config_lib.Config, ctx: dist.Context, resuming: bool) -> None:
    """Refuses a directory that holds a run (unless ``resuming`` it), then checks every
    rank can write its log directory. Two agreed phases: no rank may create logs/
    before rank 0 has looked for a previous run there (a fast rank 1 once made rank 0
    refuse a fresh directory)."""
    if not resuming:
        agreement.agree(_refuse_existing_run, cfg.run_dir, ctx)
    agreement.agree(_probe_writable, cfg.run_dir, ctx)


def prepare_run_dir(cfg: config_lib.Config, ctx: dist.Context, resuming: bool) -> None:
    """``check_run_dir``, then the config written (a third agreed phase)."""
    check_run_dir(cfg, ctx, resuming)
    agreement.agree(_write_config, cfg, ctx)


def build_state(cfg: config_lib.Config, ctx: dist.Context, input_shape, broadcast: bool = True):
    """(model, optimizer, synced variables), identical on every rank (``broadcast``
    False: each rank's own initial values, for an elastic run's state to sync)."""
    import keras

    from distseg.networks import models

    keras.utils.set_random_seed(cfg.train.seed + ctx.rank)
    model = models.build(cfg.model, input_shape, run_dir=cfg.run_dir)
    optimizer = keras.optimizers.Adam(learning_rate=cfg.train.lr)
    optimizer.build(model.trainable_variables)
    # What every rank must hold identically: weights (BatchNorm statistics included)
    # and optimizer state. Not model.variables: that also holds the dropout layers'
    # seed-generator states, which must stay different per rank (seeded by rank above)
    # or every rank would drop the same units.
    synced = model.weights + optimizer.variables
    if broadcast:
        # Horovod: every rank starts from rank 0's weights and optimizer state.
        dist.broadcast_variables(synced, root=0)
    return model, optimizer, synced


@dataclass
class Start:
    """Where a launch starts: its config (with the precision decided), the state every
    rank holds, and what it was resumed from."""

    cfg: config_lib.Config
    state: tuple
    """(model, optimizer, synced)."""
    resumed: resume.Resumed | None = None
    precision: dict | None = None
    """The run record's ``precision`` field: ``--precision auto``'s decision."""
    traced: dict = field(default_factory=dict)
    """Train steps already traced for the model (static batch -> step)."""
    lr_find: dict | None = None
    """The run record's ``lr_find`` field: ``--lr auto``'s range test."""


def start_state(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed,
                resuming: bool) -> Start:
    """The state of a new run, in the precision it decides (``precision.decide``), or of
    a resumed one, restored from its checkpoint in the precision its config holds. A new
    run checks its directory before building anything and writes its config once the
    precision is decided; a resumed one rewrites its config only once its checkpoint
    has loaded."""
    if not resuming:
        check_run_dir(cfg, ctx, resuming=False)
        build = functools.partial(build_state, ctx=ctx, input_shape=feed.input_shape)
        decided = precision.decide(cfg, ctx, feed, build)
        found = lrfind.find(decided.cfg, ctx, feed, decided.state, decided.traced)
        agreement.agree(_write_config, found.cfg, ctx)
        return Start(found.cfg, decided.state, None, decided.record, found.traced, found.record)
    state = build_state(cfg, ctx, feed.input_shape)
    resumed = resume.restore(ctx, cfg.run_dir, *state)
    resume.check_extends(resumed, cfg.train.epochs)
    prepare_run_dir(cfg, ctx, resuming=True)
    return Start(cfg, state, resumed)


def measure_link(ctx: dist.Context) -> dict | None:
    """Collective on 2 or more ranks: bandwidth and latency of the link between them as
    they see it (``distseg.core.link``), from timed allreduces before the agreed start
    (0.3 s here between two local ranks, about 0.9 s over a 1 Gbit/s link), and whether every rank is on one host (then
    it is the host's own path, not a network). None on one rank."""
    if ctx.size < 2:
        return None
    sizes, seconds = dist.time_allreduces(link.PROBE_BYTES, link.PROBE_REPEATS,
                                          link.PROBE_ALWAYS, link.PROBE_BUDGET_S)
    return {**(link.fit(sizes, seconds, ctx.size) or {}), "local": ctx.local_size == ctx.size}
