"""An elastic run's incarnations (``horovodrun --host-discovery-script``): where each one
starts, and the state committed after each epoch.

``distributed.run_elastic`` calls ``launch`` again after every membership change; the
first incarnation starts like a plain run, a later one from the state committed after
the last epoch, at the new number of ranks.
"""

from __future__ import annotations

from typing import Any

from distseg.core import config as config_lib
from distseg.parallel import agreement
from distseg.parallel import distributed as dist
from distseg.training import checkpoint, resume, startup


def start(elastic: Any, cfg: config_lib.Config, ctx: dist.Context,
          resuming: bool, state) -> resume.Resumed | None:
    """Collective: where this incarnation of an elastic run starts. The first one
    prepares the run directory (and loads a checkpoint when ``resuming``) exactly like
    a plain run; a later one, after a rank was lost or hosts changed, continues from
    the state committed after the last epoch, at the new size."""
    if not elastic.started:
        if resuming:
            resumed = resume.restore(ctx, cfg.run_dir, *state)
            resume.check_extends(resumed, cfg.train.epochs)
        else:
            resumed = None
        startup.prepare_run_dir(cfg, ctx, resuming=resuming)
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
    feed = agreement.agree(startup.check_inputs, cfg, ctx)
    resumed = start(elastic, cfg, ctx, resuming, state)
    return train(startup.Start(cfg, state, resumed), ctx, feed, threads, elastic=elastic)


def commit(elastic: Any, epochs_done: int, size: int) -> None:
    """Collective: an elastic run's state after an epoch; raises Horovod's
    ``HostsUpdatedInterrupt`` on every rank when hosts were added or removed."""
    elastic.epoch = epochs_done
    elastic.size = size
    elastic.commit()
