"""``distseg.training.loop`` in this process, one rank, no launcher: the order of its
events. A recording observer joins the loop's observers (after the real ones, each
wrapped to note its calls), the parts that change the model (``modelparts``) are each
wrapped to note theirs, and the loop's own pieces (``run_step``, ``validate``,
``checkpoint_now``) are wrapped to note theirs; every wrapper calls the real thing.

Three launches of one run, trained once for the module: a new run of 3 epochs x 3 steps
(checkpoint every 2 epochs, TensorBoard on, the average of the weights and precise
BatchNorm on), a resume to 4 epochs stopped by a request inside epoch 3 (TensorBoard
off), and a resume from that checkpoint to the end. Nothing here asserts a loss, a
speed or a precision: only the order, the counts, that the records the observers see
are the ones the log holds, and that the newest checkpoint holds what the parts' order
promises (the average as its weights, the live weights beside it).

The launches run in one child process of their own (this file run as a script): Horovod
initialised in the pytest process would stay so, and Open MPI's singleton start leaves
variables in the C environment that a later ``horovodrun --mpi`` of the session inherits.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

import numpy as np
import pytest

from distseg.core import config as config_lib
from distseg.core.errors import Interrupted
from distseg.training import loop
from distseg.training.checkpoints import checkpoint
from distseg.training.epoch import modelparts, weightema
from distseg.training.epoch.observers import Observer

from support import REPO, command_env, log_records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(TIMEOUT + 60)

EPOCHS, STEPS, EVERY = 3, 3, 2
#: Where the second launch asks to stop: before step 1 of epoch 3, so the request rides
#: in that step's allreduce and the loop checkpoints 2 steps into epoch 3.
STOP_AT = (3, 1)
HOOKS = ("on_run", "on_epoch_start", "on_step", "on_epoch_trained", "epoch_fields",
         "on_epoch_end", "on_epoch_closed")
PART_HOOKS = ("on_epoch_start", "on_step", "before_validation", "epoch_fields",
              "before_checkpoint", "after_checkpoint")
#: The parts of the run, by class, in ``modelparts.ORDER``.
PARTS = ("WeightAverage", "PreciseBatchNorm", "BestDice")


class Recorder(Observer):
    """The last observer: notes each hook as an event, keeps the records it is given,
    and adds ``recorded_steps`` (the steps it saw in the epoch) to the epoch record."""

    def __init__(self, seen: "Seen"):
        self.events, self.seen, self.steps = seen.events, seen, 0

    def on_run(self, record: dict) -> None:
        self.events.append(("on_run",))
        self.seen.runs.append(record)

    def on_epoch_start(self, epoch: int, steps: int) -> None:
        self.events.append(("on_epoch_start", epoch, steps))
        self.steps = 0

    def on_step(self, record: dict) -> None:
        self.events.append(("on_step", record["epoch"], record["step"], record["global_step"]))
        self.seen.steps.append(record)
        self.steps += 1

    def on_epoch_trained(self) -> None:
        self.events.append(("on_epoch_trained",))

    def epoch_fields(self) -> dict:
        self.events.append(("epoch_fields",))
        return {"recorded_steps": self.steps}

    def on_epoch_end(self, record: dict) -> None:
        self.events.append(("on_epoch_end", record["epoch"]))
        self.seen.epochs.append(record)

    def on_epoch_closed(self) -> None:
        self.events.append(("on_epoch_closed",))


class Spy:
    """A real observer (or, ``kind`` "part", a real part), called through: each hook
    notes (``kind``, its class name, the hook), then runs its own."""

    def __init__(self, real, events: list, kind: str = "observer", hooks=HOOKS):
        self._real = real
        for hook in hooks:
            setattr(self, hook, self._noted(kind, type(real).__name__, hook, getattr(real, hook), events))

    def __getattr__(self, name):  # the part's own state and ``key``, for the checkpoint
        return getattr(self._real, name)

    @staticmethod
    def _noted(kind: str, name: str, hook: str, real, events: list):
        def call(*args):
            events.append((kind, name, hook))
            return real(*args)
        return call


@dataclass
class Seen:
    """What one launch showed: its events in order and what it handed its observers."""

    events: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    epochs: list = field(default_factory=list)
    vals: list = field(default_factory=list)
    """What each ``validate`` returned."""
    latest: checkpoint.Position | None = None
    """The newest checkpoint's position once the launch ended."""
    stop_at: tuple[int, int] | None = None
    """(epoch, step) before which the launch asks to stop."""

    @property
    def order(self) -> list[tuple]:
        """The events without the real observers' and parts' notes."""
        return [e for e in self.events if e[0] not in ("observer", "part")]


@dataclass
class Launches:
    """The run's three launches, in order."""

    run_dir: str
    new: Seen
    stopped: Seen
    resumed: Seen


def record_launches(tiny: str, run_dir: str) -> Launches:
    """The run's three launches, each watched (this process: the child's)."""
    current = Seen()
    # TensorFlow's thread pools are left to the run's default.
    cfg = config_lib.resolve("smoke", overrides={
        "data.path": tiny, "run_dir": run_dir, "train.epochs": EPOCHS,
        "train.max_steps_per_epoch": STEPS, "train.checkpoint_every": EVERY,
        "train.tensorboard": True, "train.weight_ema": 0.9, "train.precise_bn": 2})
    resume = {"train.epochs": EPOCHS + 1, "train.tensorboard": False}

    def open_observers(real):
        def noted(s, resources):
            observers = real(s, resources)
            return (*(Spy(o, current.events) for o in observers), Recorder(current))
        return noted

    def open_parts(real):
        def noted(s):
            return tuple(Spy(p, current.events, "part", PART_HOOKS) for p in real(s))
        return noted

    def run_step(real):
        def noted(s, result, step):
            current.events.append(("run_step", result.epoch, step))
            if (result.epoch, step) == current.stop_at:
                s.stop.request("the test asks to stop")
            return real(s, result, step)
        return noted

    def validate(real):
        def noted(s):
            current.events.append(("validate",))
            current.vals.append(real(s))
            return current.vals[-1]
        return noted

    def checkpoint_now(real):
        def noted(s, result, step):
            current.events.append(("checkpoint", result.epoch, step))
            return real(s, result, step)
        return noted

    def launch(cfg, resuming: bool, stop_at: tuple | None = None) -> Seen:
        nonlocal current
        current = Seen(stop_at=stop_at)
        try:
            loop.run(cfg, resuming=resuming)
        finally:
            newest = checkpoint.latest(run_dir)
            current.latest = newest["position"] if newest else None
        return current

    with pytest.MonkeyPatch.context() as mp:
        for wrapper in (open_observers, open_parts, run_step, validate, checkpoint_now):
            mp.setattr(loop, wrapper.__name__, wrapper(getattr(loop, wrapper.__name__)))
        new = launch(cfg, resuming=False)
        with pytest.raises(Interrupted, match="the test asks to stop; checkpoint at epoch 3 step 2"):
            launch(config_lib.for_resume(run_dir, resume), resuming=True, stop_at=STOP_AT)
        stopped = current
        resumed = launch(config_lib.for_resume(run_dir, resume), resuming=True)
    return Launches(run_dir, new, stopped, resumed)


def _seen(fields: dict) -> Seen:
    """A ``Seen`` back from its JSON form (events as tuples, the position as one)."""
    latest = fields.pop("latest")
    seen = Seen(**fields)
    seen.events = [tuple(e) for e in seen.events]
    seen.latest = checkpoint.Position(**latest) if latest else None
    return seen


@pytest.fixture(scope="module")
def launches(tiny, tmp_path_factory) -> Launches:
    base = tmp_path_factory.mktemp("events")
    run_dir, out = str(base / "run"), base / "launches.json"
    env = command_env(PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests")]))
    done = subprocess.run([sys.executable, __file__, tiny, run_dir, str(out)], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    kept = json.loads(out.read_text())
    return Launches(run_dir, *(_seen(kept[k]) for k in ("new", "stopped", "resumed")))


def epoch_events(epoch: int, global_step: int, first: int = 0, checkpoint: bool = True) -> list:
    """One epoch's events as the loop promises them, from step ``first`` on."""
    out = [("on_epoch_start", epoch, STEPS - first)]
    for step in range(first, STEPS):
        out += [("run_step", epoch, step), ("on_step", epoch, step, global_step)]
        global_step += 1
    out += [("on_epoch_trained",), ("validate",), ("epoch_fields",), ("on_epoch_end", epoch)]
    return out + ([("checkpoint", epoch, 0)] if checkpoint else []) + [("on_epoch_closed",)]


def test_each_epoch_starts_steps_validates_ends_then_checkpoints_when_due(launches):
    """A new run: the run record, then per epoch its start (3 steps), 3 x (step, its
    record), the training's end, validation, the epoch record, and a checkpoint after
    the 2nd epoch (every 2) and the last."""
    want = [("on_run",)]
    for epoch in range(EPOCHS):
        want += epoch_events(epoch, epoch * STEPS, checkpoint=(epoch + 1) % EVERY == 0
                             or epoch + 1 == EPOCHS)
    assert launches.new.order == want
    assert (launches.new.latest.epoch, launches.new.latest.step,
            launches.new.latest.global_step) == (EPOCHS, 0, EPOCHS * STEPS)


def test_a_resumed_launch_begins_at_its_checkpoint_and_a_stop_inside_an_epoch_checkpoints_it(
        launches):
    """Resumed from epoch 3's start (the new run's last checkpoint), the launch's first
    epoch is 3; a stop asked for before step 1 rides in that step, then the loop
    checkpoints the 2 finished steps and raises, with no end of epoch. Resumed again,
    epoch 3 starts with the 1 step left, at global step 11."""
    stopped, resumed = launches.stopped, launches.resumed
    assert stopped.order == [("on_run",), ("on_epoch_start", 3, 3),
                             ("run_step", 3, 0), ("on_step", 3, 0, 9),
                             ("run_step", 3, 1), ("on_step", 3, 1, 10), ("checkpoint", 3, 2)]
    assert (stopped.latest.epoch, stopped.latest.step, stopped.latest.global_step) == (3, 2, 11)
    assert resumed.order == [("on_run",), *epoch_events(3, 11, first=2)]
    assert (resumed.latest.epoch, resumed.latest.step, resumed.latest.global_step) == (4, 0, 12)


def test_every_hook_reaches_the_observers_in_their_order(launches):
    """Timeline, TensorBoard (when on), console, then the recorder: for every hook, each
    observer once and in that order, and nothing else in between."""
    for seen, names in ((launches.new, ["Timeline", "Board", "Console"]),
                        (launches.stopped, ["Timeline", "Console"]),
                        (launches.resumed, ["Timeline", "Console"])):
        before = []
        for event in (e for e in seen.events if e[0] != "part"):
            if event[0] == "observer":
                before.append(event[1:])
                continue
            assert before == ([(name, event[0]) for name in names] if event[0] in HOOKS
                              else []), event
            before = []
        assert before == []


#: Where the parts' hooks come among the loop's events: the recorder's hook a part hook
#: comes just before (it is the last observer), or just after.
BEFORE = {"on_epoch_start": "on_epoch_start", "on_step": "on_step",
          "on_epoch_trained": "before_validation", "epoch_fields": "epoch_fields",
          "on_epoch_closed": "after_checkpoint"}
AFTER = {"on_epoch_end": "before_checkpoint"}


def with_parts(events: list) -> list:
    """``events`` with the parts' hooks where the loop promises them, each hook reaching
    every part in ``PARTS`` order."""
    out = []
    for event in events:
        if event[0] in BEFORE:
            out += [("part", name, BEFORE[event[0]]) for name in PARTS]
        out.append(event)
        if event[0] in AFTER:
            out += [("part", name, AFTER[event[0]]) for name in PARTS]
    return out


def test_the_parts_change_the_model_at_their_moments_in_their_order(launches):
    """The parts' order is ``modelparts.ORDER`` (the average before precise BatchNorm,
    the best checkpoint's choice last) at every hook; the model becomes what is validated
    before validation, the best is chosen after the epoch's record and before its
    checkpoint, and the live weights come back only after the checkpoint is written."""
    for seen in (launches.new, launches.stopped, launches.resumed):
        assert [e for e in seen.events if e[0] != "observer"] == with_parts(seen.order)
    assert modelparts.ORDER == ("weight_average", "precise_bn", "best")
    # The checkpoint after the 2nd epoch: the best chosen just before it, the live
    # weights back just after it.
    events = launches.new.events
    at = events.index(("checkpoint", 1, 0))
    assert events[at - 1] == ("part", "BestDice", "before_checkpoint")
    assert events[at + 1] == ("part", "WeightAverage", "after_checkpoint")


def test_the_newest_checkpoint_saves_the_average_and_the_live_weights_beside_it(launches):
    """Written after the model took the average and before the live weights came back:
    its weights file (what ``distseg-predict`` loads) is the average, and its state file
    keeps the live weights training goes on from, which differ from it."""
    from distseg.inference import predict
    chosen = predict.choose_checkpoint(launches.run_dir, "latest")
    assert chosen.stem == "epoch-0004"
    net = predict.build_model(config_lib.for_resume(launches.run_dir), launches.run_dir,
                              chosen=chosen)
    arrays = checkpoint.read_state(chosen.entry)
    average = weightema.arrays_of(weightema.AVERAGE_KEY, arrays)
    live = weightema.arrays_of(weightema.LIVE_KEY, arrays)
    assert live is not None and len(average) == len(live) == len(net.trainable_variables)
    for v, value in zip(net.trainable_variables, average):
        np.testing.assert_array_equal(v.numpy(), value)
    assert any(not np.array_equal(a, b) for a, b in zip(average, live))


def _as_logged(record: dict) -> dict:
    """``record`` as a JSON line holds it (NaN as null, numpy scalars as numbers)."""
    return json.loads(json.dumps(record, default=lambda v: v.item()), parse_constant=lambda _: None)


def test_the_records_the_observers_see_are_the_logged_ones(launches):
    """The rank's log holds the run, step and epoch records the recorder was handed, in
    the same order; global steps count up by one across the three launches; each epoch
    record holds what validation returned and the recorder's own field."""
    seen = (launches.new, launches.stopped, launches.resumed)
    log = log_records(launches.run_dir, 0)
    for kind, attr in (("run", "runs"), ("step", "steps"), ("epoch", "epochs")):
        assert [r for r in log if r["type"] == kind] == [
            _as_logged(r) for s in seen for r in getattr(s, attr)], kind
    steps = [r for r in log if r["type"] == "step"]
    assert [r["global_step"] for r in steps] == list(range((EPOCHS + 1) * STEPS))
    assert [(r["epoch"], r["step"]) for r in steps] == [
        (e, k) for e in range(EPOCHS + 1) for k in range(STEPS)]
    epochs = [r for r in log if r["type"] == "epoch"]
    assert [r["epoch"] for r in epochs] == list(range(EPOCHS + 1))
    assert [r["recorded_steps"] for r in epochs] == [STEPS] * EPOCHS + [1]
    batch = log[0]["batch_size"]
    # epoch 3 counts the 2 steps its checkpoint carried over and the 1 trained after
    assert [(r["steps"], r["samples"]) for r in epochs] == [(STEPS, STEPS * batch)] * (EPOCHS + 1)
    vals = [v for s in seen for v in s.vals]
    assert [(r["val_loss"], r["val_dice"]) for r in epochs] == [
        (_as_logged(v)["val_loss"], _as_logged(v)["val_dice"]) for v in vals]
    assert all(r["val_loss"] is not None for r in epochs)
    ends = [(r["status"], r["epochs_done"]) for r in log if r["type"] == "end"]
    assert ends == [("ok", EPOCHS), ("interrupted", EPOCHS), ("ok", EPOCHS + 1)]
    assert [(r["from_epoch"], r["from_step"], r["global_step"])
            for r in log if r["type"] == "resume"] == [(3, 0, 9), (3, 2, 11)]


if __name__ == "__main__":  # the launches, in a child process of the fixture
    watched = record_launches(sys.argv[1], sys.argv[2])
    with open(sys.argv[3], "w") as f:
        json.dump({k: dataclasses.asdict(getattr(watched, k)) for k in ("new", "stopped", "resumed")},
                  f, default=lambda v: v.item())
