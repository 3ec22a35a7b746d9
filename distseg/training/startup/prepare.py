"""Start-up of a run on every rank: the checks that need no side effect, then the run
directory, the link between the ranks as they measure it, then the precision, the
model and optimizer every rank holds identically, and the gradient compression.

Every piece that can fail on one rank alone is called through ``agreement.agree``, so
all ranks stop together with the same message.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from distseg.core import config as config_lib
from distseg.core import link, partial, rundir
from distseg.core.errors import RunError
from distseg.data import feeds
from distseg.parallel import agreement
from distseg.parallel import distributed as dist
from distseg.training.checkpoints import resume
from distseg.training.startup import compression, lrfind, precision
from distseg.training.step import factory


def check_inputs(cfg: config_lib.Config, ctx: dist.Context) -> feeds.Opened:
    """Everything that can be wrong with the data, or a ``--model-fn`` model, before
    training starts; the config with the data file's classes and the model's source
    (``userfn.recorded``), and the feed (slices or slabs) the run reads."""
    # Rank 0 reads every mask once to check the labels; the others trust its verdict.
    cfg, feed = feeds.open_feed(cfg, ctx.size, check_labels=ctx.is_root())
    if ctx.is_root() and getattr(feed, "plan", None) is not None:
        print(feed.plan.describe(), file=sys.stderr, flush=True)
    if cfg.model.fn:
        cfg = check_model_fn(cfg, feed.input_shape)
    return feeds.Opened(cfg, feed)


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
        partial.write_json(rundir.config_path(cfg.run_dir), cfg.to_dict())
        os.makedirs(rundir.checkpoint_dir(cfg.run_dir), exist_ok=True)


def check_run_dir(cfg: config_lib.Config, ctx: dist.Context, resuming: bool) -> None:
    """Refuses a directory that holds a run (unless ``resuming`` it), then checks every
    rank can write its log directory. Two agreed phases: no rank may create logs/
    before rank 0 has looked for a previous run there (else a fast rank 1 can make rank
    0 refuse a fresh directory)."""
    if not resuming:
        agreement.agree(_refuse_existing_run, cfg.run_dir, ctx)
    agreement.agree(_probe_writable, cfg.run_dir, ctx)


def prepare_run_dir(cfg: config_lib.Config, ctx: dist.Context, resuming: bool) -> None:
    """``check_run_dir``, then the config written (a third agreed phase)."""
    check_run_dir(cfg, ctx, resuming)
    agreement.agree(_write_config, cfg, ctx)


@dataclass
class Prepared:
    """What start-up prepared for a launch: the run's one live config (with the
    precision and the compression decided and the lr found), the state every rank
    holds, the train steps already traced for it, what it was resumed from, and the
    link its ranks measured."""

    cfg: config_lib.Config
    state: factory.State
    train_steps: factory.TrainSteps
    resumed: resume.Resumed | None = None
    precision: dict | None = None
    """The run record's ``precision`` field: ``--precision auto``'s decision."""
    lr_find: dict | None = None
    """The run record's ``lr_find`` field: ``--lr auto``'s range test."""
    compression: dict | None = None
    """The run record's ``compression_decision`` under ``--compression auto``."""
    link: dict | None = None
    """The run record's ``link`` (``measure_link``; None: one rank, or not measured
    yet: an elastic run measures it when its session opens)."""


def prepare(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed,
            resuming: bool) -> Prepared:
    """A new run, in the precision it decides (``precision.decide``), with the gradient
    compression it decides from the link it measures (``compression.decide``; until
    then its steps are exact) and with the lr it finds (``lrfind.find``), or a resumed
    one, restored from its checkpoint in the precision and compression its config
    holds. A new run checks its directory before building anything and writes its
    config once all are decided; a resumed one rewrites its config only once its
    checkpoint has loaded."""
    if resuming:
        return _resumed(cfg, ctx, feed)
    check_run_dir(cfg, ctx, resuming=False)
    try:
        measured = measure_link(ctx)
        decided = precision.decide(compression.exact(cfg), ctx, feed)
        state = decided.state or factory.build_state(decided.cfg, ctx, feed.input_shape)
        train_steps = factory.TrainSteps(state, feed.input_shape, ctx.size, decided.traced,
                                         decided.cfg.train.compression)
        chosen = compression.decide(decided.cfg, cfg.train.compression, ctx, feed, train_steps,
                                    measured, decided.record)
        found = lrfind.find(chosen.cfg, ctx, feed, train_steps)
    except RunError:
        _forget_probe(cfg.run_dir, ctx)
        raise
    agreement.agree(_write_config, found.cfg, ctx)
    return Prepared(found.cfg, state, train_steps, None, decided.record, found.record,
                    chosen.record, measured)


def _forget_probe(run_dir: str, ctx: dist.Context) -> None:
    """After an agreed failure before the config is written: the empty logs/ folder
    the writability probe made is removed (by rank 0), so the directory does not look
    like a run and the same command can be run again."""
    if ctx.is_root():
        try:
            os.rmdir(rundir.log_dir(run_dir))
        except OSError:
            pass  # not empty (someone's files) or already gone: left as it is


def _resumed(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed) -> Prepared:
    state = factory.build_state(cfg, ctx, feed.input_shape)
    resumed = open_run_dir(cfg, ctx, state, resuming=True)
    return Prepared(cfg, state, factory.TrainSteps(state, feed.input_shape, ctx.size),
                    resumed, link=measure_link(ctx))


def open_run_dir(cfg: config_lib.Config, ctx: dist.Context, state: factory.State,
                 resuming: bool) -> resume.Resumed | None:
    """Collective: the run directory of a launch whose ``state`` is built: when
    ``resuming``, the state restored from the newest checkpoint (which must reach no
    further than ``--epochs``), then the directory checked and the config written."""
    resumed = None
    if resuming:
        resumed = resume.restore(ctx, cfg.run_dir, *state)
        resume.check_extends(resumed, cfg.train.epochs)
    prepare_run_dir(cfg, ctx, resuming=resuming)
    return resumed


def measure_link(ctx: dist.Context) -> dict | None:
    """Collective on 2 or more ranks: bandwidth and latency of the link between them as
    they see it (``distseg.core.link``), from timed allreduces before the agreed start
    (docs/studies/link-2026-11-26.md says how long they take), and whether every rank
    is on one host (then it is the host's own path, not a network). None on one
    rank."""
    if ctx.size < 2:
        return None
    sizes, seconds = dist.time_allreduces(link.PROBE_BYTES, link.PROBE_REPEATS,
                                          link.PROBE_ALWAYS, link.PROBE_BUDGET_S)
    return {**(link.fit(sizes, seconds, ctx.size) or {}), "local": ctx.one_host()}
