"""An elastic run's incarnations (``horovodrun --host-discovery-script``): where each one
starts, and the state committed after each epoch.

``distributed.run_elastic`` calls ``launch`` again after every membership change; the
first incarnation starts like a plain run, a later one from the state committed after
the last epoch, at the new number of ranks.
"""

from __future__ import annotations

from typing import Any

from distseg.core import config as config_lib
from distseg.data import feeds
from distseg.parallel import agreement
from distseg.parallel import distributed as dist
from distseg.training.checkpoints import checkpoint, resume
from distseg.training.startup import compression, lrfind, precision, prepare
from distseg.training.step import factory


def resumed_from(elastic: Any, cfg: config_lib.Config, ctx: dist.Context,
                 resuming: bool, state) -> resume.Resumed | None:
    """Collective: what this incarnation of an elastic run continues. The first one
    opens the run directory (and loads a checkpoint when ``resuming``) exactly like a
    plain run; a later one, after a rank was lost or hosts changed, continues from the
    state committed after the last epoch, at the new size."""
    if not elastic.started:
        resumed = prepare.open_run_dir(cfg, ctx, state, resuming)
        elastic.started = True
        elastic.epoch = resumed.position.epoch if resumed else 0
        elastic.commit()  # a rank lost in the first epoch must not set up the run again
        return resumed
    position = checkpoint.Position(epoch=elastic.epoch, size=elastic.size)
    why = ("hosts changed" if elastic.size == ctx.size else
           f"{'lost' if ctx.size < elastic.size else 'gained'} "
           f"{abs(elastic.size - ctx.size)} rank(s)")
    return resume.Resumed(position=position, manifest=None, elastic=why)


def launch(elastic: Any, train, cfg: config_lib.Config, resuming: bool,
           state, threads: tuple[int, int]) -> int:
    """One incarnation of an elastic run: the same checks as a plain run, then
    ``train`` (``loop.launch``) with the learning rate and shards of the current number
    of ranks."""
    ctx = dist.context()
    # cfg: as run() filled it, and planned as run() planned the state it built: a
    # --slab auto plan depends on the data file and the config alone, never the ranks.
    cfg, feed = agreement.agree(prepare.check_inputs, cfg, ctx)
    resumed = resumed_from(elastic, cfg, ctx, resuming, state)
    steps = factory.TrainSteps(state, feed.input_shape, ctx.size)
    return train(prepare.Prepared(cfg, state, steps, resumed), ctx, feed, threads,
                 elastic=elastic)


def run(cfg: config_lib.Config, ctx: dist.Context, resuming: bool, threads: tuple[int, int],
        train) -> int:
    """An elastic run: each rank builds its state alone, with no collective (a rank that
    joins later runs this alone), then Horovod's elastic loop calls ``launch`` for
    every incarnation."""
    cfg = feeds.with_classes(cfg)  # the data file's classes, as check_inputs gives them
    cfg = prepare.with_model_source(cfg)  # a --model-fn's source, as check_inputs records it
    cfg = precision.without_trial(cfg)  # no collective yet: no timed trial
    cfg = compression.exact(cfg)  # nor a measured link: exact float32
    lrfind.refuse_elastic(cfg)  # nor a range test
    built = feeds.with_plan(cfg)  # --slab auto's depth and slab, as launch plans them
    state = factory.build_state(built, ctx, feeds.input_shape(built), broadcast=False)
    elastic = dist.elastic_state(state.synced, epoch=0, size=ctx.size, started=False)
    return dist.run_elastic(launch, elastic, train, cfg, resuming, state, threads)


def commit(elastic: Any, epochs_done: int, size: int) -> None:
    """Collective: an elastic run's state after an epoch; raises Horovod's
    ``HostsUpdatedInterrupt`` on every rank when hosts were added or removed."""
    elastic.epoch = epochs_done
    elastic.size = size
    elastic.commit()
