"""Which log field becomes which TensorBoard scalar, at which step: the one mapping that
the live writer of a run (``distseg.training.epoch.board``, rank 0) and the export of any
run's logs (``analysis.board``) share, so a run watched live and the same run exported
from its JSON-line logs show the same series.

The mapping is plain Python: records (``distseg.core.schema``) in, ``Scalar`` tuples
out. ``ScalarWriter`` writes them to an event file with tensorboardX's record writer
(imported when a writer opens; neither side needs TensorFlow).

Steps. Every scalar sits at a global step: a ``step`` record's at its
``global_step``, an ``epoch`` record's at the ``global_step`` of that epoch's last
step. One step axis for every tag is what lets a resumed launch hide what a killed one
wrote past its checkpoint (``ScalarWriter(purge_step=...)``). Wall times are the
launch's agreed start (the ``run`` record's ``start_time``, rank 0's clock) plus the
record's ``t``, the clock the report's ``wall_s`` counts on; TensorBoard's "Relative"
axis then compares runs at different numbers of ranks by time.

Tags (``TAGS`` lists them with what they hold):

* per step, from rank 0's ``step`` record: ``train/loss``, ``train/lr``,
  ``train/step_time``, ``train/data_wait``, ``train/samples_per_s``, ``batch/per_rank``,
  ``batch/global``; from every rank's (the export only): ``ranks/step_time/rank-NNNNN``;
* per epoch, from rank 0's ``epoch`` record: ``epoch/epoch``, ``epoch/train_loss``,
  ``epoch/val_loss``, ``epoch/val_dice/CLASS``, ``epoch/epoch_time``,
  ``epoch/train_time``, ``noise/*``, ``lr_rule/*``, ``goodput/*``, ``comm/*`` (the
  timeline's epoch);
* per epoch, from every rank's step times and epoch record (``balance_scalars``):
  ``ranks/slowest_step_time``, ``ranks/slowest_rank``, ``ranks/imbalance_ratio``,
  ``epoch/samples_per_s``.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from distseg.core import ranktime, timeline

#: What each tag holds (``CLASS`` and ``B`` stand for a class name and a per-rank batch).
TAGS: dict[str, str] = {
    "train/loss": "loss of the global batch (the same on every rank)",
    "train/lr": "learning rate of the step",
    "train/step_time": "seconds of the step on rank 0",
    "train/data_wait": "seconds of it rank 0 waited for input",
    "train/samples_per_s": "samples of the step, all ranks (rank 0's batch x ranks), per "
                           "second of rank 0's step",
    "batch/per_rank": "rank 0's batch",
    "batch/global": "rank 0's batch x ranks (the global batch; exact with a fixed one)",
    "ranks/step_time/rank-NNNNN": "seconds of each step on rank NNNNN (export only)",
    "epoch/epoch": "the epoch's index (0 first): what global step ends which epoch",
    "epoch/train_loss": "mean of the epoch's global-batch losses",
    "epoch/val_loss": "loss of the whole validation set",
    "epoch/val_dice/CLASS": "validation Dice of CLASS, counts summed over ranks",
    "epoch/epoch_time": "seconds of the epoch on rank 0, training and validation",
    "epoch/train_time": "seconds of the epoch's training on rank 0",
    "epoch/samples_per_s": "samples of the epoch, all ranks, per second of the slowest "
                           "rank's train_time (the report's throughput)",
    "ranks/slowest_step_time": "the largest of the ranks' mean step times in the epoch",
    "ranks/slowest_rank": "the rank with it",
    "ranks/imbalance_ratio": "it over the mean of the ranks' mean step times (1: balanced)",
    "noise/b_simple": "gradient noise scale B_simple, Adam-preconditioned",
    "noise/b_simple_low": "the low end of B_simple's 90 % confidence interval",
    "noise/b_simple_high": "its high end (not written where it has none)",
    "noise/b_simple_raw": "B_simple of the raw gradients",
    "noise/g2": "|G|^2, preconditioned",
    "noise/tr_sigma": "tr(Sigma), preconditioned",
    "lr_rule/gain": "AdaScale's gain of the global batch over the base batch",
    "lr_rule/progress": "gain-weighted steps of the base batch trained",
    "goodput/per_rank": "goodput policy: the per-rank batch the epoch ran",
    "goodput/next_per_rank": "goodput policy: the next epoch's per-rank batch",
    "goodput/switched": "goodput policy: 1 when the batch changes after the epoch",
    "goodput/predicted_gain": "goodput policy: predicted goodput of the choice over "
                              "the batch in force",
    "goodput/goodput/B": "goodput policy: predicted goodput of per-rank batch B",
    "comm/gradient_s": "timeline's epoch: the gradients' allreduce per step (median)",
    "comm/gradient_wait_s": "timeline's epoch: the wait for the last rank before it",
    "comm/small_s": "timeline's epoch: the global loss's small allreduce per step (median)",
    "comm/small_wait_s": "timeline's epoch: the wait before the global loss's allreduce",
}

_NOISE = ("b_simple", "b_simple_low", "b_simple_high", "b_simple_raw", "g2", "tr_sigma")
_LR_RULE = ("gain", "progress")
_UNSAFE = re.compile(r"[^\w.\-/]")


class Scalar(NamedTuple):
    """One TensorBoard scalar: ``tag`` = ``value`` at global ``step``, written at
    ``wall_time`` (Unix seconds)."""

    tag: str
    value: float
    step: int
    wall_time: float


class RankEpoch(NamedTuple):
    """What one rank contributes to an epoch's balance (``balance_scalars``).

    Attributes:
      rank: the rank.
      mean_step_time: mean ``step_time`` of its step records of the epoch in this
        launch (NaN: none).
      samples: its ``epoch`` record's ``samples``.
      train_time: its ``epoch`` record's ``train_time``.
    """

    rank: int
    mean_step_time: float
    samples: float
    train_time: float


def number(value: Any) -> float | None:
    """``value`` as a finite float (a bool as 0 or 1), else ``None``: a field that is
    absent, null (NaN in JSON) or not a number writes no scalar."""
    if isinstance(value, str) or value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def rank_tag(rank: int) -> str:
    """The per-rank step-time tag of ``rank``, named like its log file."""
    return f"ranks/step_time/rank-{rank:05d}"


def tag_part(name: Any) -> str:
    """A class name or batch size as one part of a tag (no spaces or other separators)."""
    return _UNSAFE.sub("_", str(name).replace("/", "_")) or "_"


def wall_time(record: Mapping[str, Any], start_time: float | None) -> float:
    """When ``record`` was written on rank 0's clock: ``start_time`` + its ``t`` (its own
    ``time`` when either is missing)."""
    t, start = number(record.get("t")), number(start_time)
    if t is not None and start is not None:
        return start + t
    return number(record.get("time")) or 0.0


def _scalars(pairs: Iterable[tuple[str, Any]], step: int, wall_time: float) -> list[Scalar]:
    out = []
    for tag, value in pairs:
        v = number(value)
        if v is not None:
            out.append(Scalar(tag, v, step, wall_time))
    return out


def _dict(record: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = record.get(key)
    return value if isinstance(value, Mapping) else {}


def lr_find_scalars(run_record: Mapping[str, Any]) -> list[Scalar]:
    """``--lr auto``'s range test from a ``run`` record (none without one): at each of
    its steps ``lr_find/lr``, ``lr_find/loss`` and ``lr_find/smoothed``, and the lr it
    chose as ``lr_find/chosen`` (TensorBoard's x axis is the sweep's step; the report
    draws the loss against the lr)."""
    found = _dict(run_record, "lr_find")
    wall = number(run_record.get("start_time")) or 0.0
    out = _scalars([("lr_find/chosen", found.get("lr"))], 0, wall)
    series = zip(found.get("lrs") or (), found.get("losses") or (), found.get("smoothed") or ())
    for k, (lr, loss, smoothed) in enumerate(series):
        out += _scalars([("lr_find/lr", lr), ("lr_find/loss", loss),
                         ("lr_find/smoothed", smoothed)], k, wall)
    return out


def step_scalars(record: Mapping[str, Any], size: int, start_time: float | None) -> list[Scalar]:
    """The global per-step scalars of rank 0's ``step`` record in a launch of ``size``
    ranks that started at ``start_time`` (none without a ``global_step``)."""
    step = number(record.get("global_step"))
    if step is None:
        return []
    samples, seconds = number(record.get("samples")), number(record.get("step_time"))
    total = None if samples is None else samples * size
    rate = total / seconds if total is not None and seconds else None
    return _scalars((("train/loss", record.get("loss")), ("train/lr", record.get("lr")),
                     ("train/step_time", seconds), ("train/data_wait", record.get("data_wait")),
                     ("train/samples_per_s", rate), ("batch/per_rank", samples),
                     ("batch/global", total)),
                    int(step), wall_time(record, start_time))


def rank_step_scalars(record: Mapping[str, Any], rank: int,
                      start_time: float | None) -> list[Scalar]:
    """``rank``'s own step time from its ``step`` record."""
    step = number(record.get("global_step"))
    if step is None:
        return []
    return _scalars(((rank_tag(rank), record.get("step_time")),), int(step),
                    wall_time(record, start_time))


def _policy_pairs(policy: Mapping[str, Any]) -> list[tuple[str, Any]]:
    if not policy:
        return []
    goodput = _dict(policy, "goodput")
    ran, chosen = policy.get("per_rank"), policy.get("next_per_rank")
    now, then = number(goodput.get(str(ran))), number(goodput.get(str(chosen)))
    pairs = [("goodput/per_rank", ran), ("goodput/next_per_rank", chosen),
             ("goodput/switched", policy.get("switched")),
             ("goodput/predicted_gain", then / now if now and then is not None else None)]
    return pairs + [(f"goodput/goodput/{tag_part(b)}", v) for b, v in goodput.items()]


def epoch_scalars(record: Mapping[str, Any], step: int, start_time: float | None) -> list[Scalar]:
    """The scalars of rank 0's ``epoch`` record, at global ``step`` (the epoch's last),
    of a launch that started at ``start_time``."""
    noise, rule = _dict(record, "noise_scale"), _dict(record, "lr_rule")
    pairs = [("epoch/epoch", record.get("epoch")), ("epoch/train_loss", record.get("train_loss")),
             ("epoch/val_loss", record.get("val_loss")),
             *((f"epoch/val_dice/{tag_part(c)}", d) for c, d in _dict(record, "val_dice").items()),
             ("epoch/epoch_time", record.get("epoch_time")),
             ("epoch/train_time", record.get("train_time")),
             *((f"noise/{k}", noise.get(k)) for k in _NOISE),
             *((f"lr_rule/{k}", rule.get(k)) for k in _LR_RULE),
             *_policy_pairs(_dict(record, "goodput")),
             *((f"comm/{k}", _dict(record, "comm").get(k)) for k in timeline.MEDIANS)]
    return _scalars(pairs, step, wall_time(record, start_time))


def balance_scalars(ranks: Sequence[RankEpoch], step: int, wall_time: float) -> list[Scalar]:
    """An epoch's balance across ranks, from every rank's ``RankEpoch``: the slowest
    rank's mean step time, which rank, the imbalance ratio and the epoch's throughput
    (``ranktime``'s, as the report's rank balance and time per epoch take them)."""
    times = [(r.mean_step_time, r.rank) for r in ranks if number(r.mean_step_time) is not None]
    pairs: list[tuple[str, Any]] = []
    if times:
        slowest, who = max(times)
        mean = sum(t for t, _ in times) / len(times)
        pairs += [("ranks/slowest_step_time", slowest), ("ranks/slowest_rank", who),
                  ("ranks/imbalance_ratio", ranktime.imbalance(slowest, mean))]
    samples = [number(r.samples) for r in ranks]
    if ranks and None not in samples:
        epoch = [(n, number(r.train_time)) for n, r in zip(samples, ranks)]
        pairs.append(("epoch/samples_per_s", ranktime.epochs_throughput([epoch])))
    return _scalars(pairs, step, wall_time)


class ScalarWriter:
    """``Scalar`` lists into one event file of a TensorBoard run directory, written
    synchronously (a step's scalars are one small event) and flushed by ``flush``.

    Args:
      logdir: the TensorBoard run's directory (created).
      purge_step: a launch that continues a run from global step ``purge_step``:
        TensorBoard hides what earlier event files of the directory hold at that step
        and later (a killed launch's steps past its checkpoint), as tensorboardX's
        ``SummaryWriter(purge_step=...)`` marks it (a ``SessionLog.START`` event).
      suffix: added to the file name (events.out.tfevents.TIME.HOST``suffix``).
    """

    def __init__(self, logdir: str, purge_step: int | None = None, suffix: str = ""):
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto import event_pb2, summary_pb2

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        os.makedirs(logdir, exist_ok=True)
        self.logdir = logdir
        self._file = EventsWriter(os.path.join(logdir, "events"), suffix)
        self.path = self._file._file_name
        if purge_step is not None:
            self._file.write_event(self._event(
                step=int(purge_step), session_log=event_pb2.SessionLog(
                    status=event_pb2.SessionLog.START)))

    def write(self, scalars: Iterable[Scalar]) -> None:
        """One event per run of consecutive ``scalars`` of one (step, wall time), in their
        order. Only consecutive ones share an event: two ranks' records may land on the
        same step and wall time (to the clock's last bit), and merging them would move a
        later series' point ahead of its own earlier steps."""
        for (step, wall), run in itertools.groupby(scalars, key=lambda s: (s.step, s.wall_time)):
            values = [self._summary.Value(tag=s.tag, simple_value=s.value) for s in run]
            self._file.write_event(self._event(step=step, wall_time=wall,
                                               summary=self._summary(value=values)))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
