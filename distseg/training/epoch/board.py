"""Live TensorBoard scalars of a run: rank 0 writes ``RUN/tensorboard/`` while it trains.

The loop hands the board the same records it writes to the JSON-line log
(``distseg.core.tbscalars`` says which field becomes which tag): each ``step`` record
as it is written, each ``epoch`` record at the epoch's end, where one small allgather
brings every rank's mean step time, samples and training time to rank 0 for the
epoch's balance across ranks. Rank 0 flushes the event file after each epoch (and at
most ``FLUSH_S`` seconds after a step), so ``tensorboard --logdir RUN`` follows a
running job; a resumed launch opens a new file that hides what a killed launch wrote
past the checkpoint (``purge_step``).

The JSON logs are the run's record; the board is a view of them. A board that cannot
write (a full disk, a directory it may not create) says so once on stderr and stops
writing; it never stops the run, and never on one rank alone.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time

from distseg.core import rundir, tbscalars
from distseg.parallel import distributed as dist
from distseg.training.epoch.observers import Observer

#: Seconds after which a step's scalars are flushed (epochs flush at their end).
FLUSH_S = 10.0


class Board(Observer):
    """One rank's part of the live scalars: every rank tallies its own step times for
    the epoch's balance; rank 0 alone holds the writer.

    Args:
      writer: rank 0's ``tbscalars.ScalarWriter`` (None on the other ranks).
      size: ranks of this launch.
      start_time: the launch's agreed start (Unix seconds, rank 0's clock): scalars are
        written at ``start_time`` + the record's ``t``.
    """

    def __init__(self, writer: tbscalars.ScalarWriter | None, size: int, start_time: float):
        self.writer = writer
        self.size = size
        self.start_time = start_time
        self.last_step = -1
        """The ``global_step`` of the latest step record: the epoch's scalars' step."""
        self._seconds, self._steps = 0.0, 0
        self._flushed = time.monotonic()

    def on_run(self, record: dict) -> None:
        """Rank 0 writes ``--lr auto``'s range test, if the launch ran one."""
        if self.writer is not None:
            self._write(tbscalars.lr_find_scalars(record), flush=True)

    def on_step(self, record: dict) -> None:
        """A ``step`` record of this rank, as the log has it."""
        seconds = tbscalars.number(record.get("step_time"))
        if seconds is not None:
            self._seconds += seconds
            self._steps += 1
        self.last_step = int(record.get("global_step", self.last_step))
        if self.writer is not None:
            self._write(tbscalars.step_scalars(record, self.size, self.start_time),
                        flush=time.monotonic() - self._flushed > FLUSH_S)

    def on_epoch_end(self, record: dict) -> None:
        """Collective: this rank's ``epoch`` record; rank 0 writes the epoch's scalars
        and its balance across ranks, and flushes."""
        mine = (self._seconds / self._steps if self._steps else math.nan,
                record.get("samples"), record.get("train_time"))
        self._seconds, self._steps = 0.0, 0
        # Horovod: every rank's step times for the epoch, on every rank (a few bytes).
        ranks = [tbscalars.RankEpoch(r, *numbers)
                 for r, numbers in enumerate(dist.allgather_object(mine))]
        if self.writer is not None:
            wall = tbscalars.wall_time(record, self.start_time)
            self._write(tbscalars.epoch_scalars(record, self.last_step, self.start_time)
                        + tbscalars.balance_scalars(ranks, self.last_step, wall), flush=True)

    def _write(self, scalars: list, flush: bool) -> None:
        try:
            self.writer.write(scalars)
            if flush:
                self.writer.flush()
                self._flushed = time.monotonic()
        except Exception as e:  # noqa: BLE001 - a view of the logs never stops the run
            self._give_up(e)

    def _give_up(self, error: BaseException) -> None:
        where = getattr(self.writer, "logdir", rundir.TENSORBOARD_DIR)
        sys.stderr.write(f"warning: {where}: TensorBoard scalars stopped "
                         f"({error.__class__.__name__}: {error}); the logs are complete\n")
        with contextlib.suppress(Exception):
            self.writer.close()
        self.writer = None

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception as e:  # noqa: BLE001 - as in _write
                self._give_up(e)
            self.writer = None


def open_board(run_dir: str, ctx: dist.Context, global_step: int, start_time: float,
               enabled: bool, resources: contextlib.ExitStack) -> Board | None:
    """Every rank's ``Board`` for a launch that starts at ``global_step`` and, on the
    agreed clock, at ``start_time`` (None on
    every rank when ``enabled`` is off); rank 0's writes a new event file in
    ``RUN/tensorboard`` that hides what earlier launches wrote from ``global_step`` on.
    Closed by ``resources``."""
    if not enabled:
        return None
    writer = None
    if ctx.is_root():  # chief-only side effect: one TensorBoard run per training run
        try:
            writer = tbscalars.ScalarWriter(rundir.tensorboard_dir(run_dir), purge_step=global_step,
                                            suffix=f".{os.getpid()}")
        except Exception as e:  # noqa: BLE001 - the run goes on without its view
            sys.stderr.write(f"warning: {rundir.tensorboard_dir(run_dir)}: no TensorBoard scalars "
                             f"({e.__class__.__name__}: {e})\n")
    board = Board(writer, ctx.size, start_time)
    resources.callback(board.close)
    return board
