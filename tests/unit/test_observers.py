"""``distseg.training.epoch.observers``: what ``Timeline`` and ``Console`` promise, hook by
hook, in one process.

``Timeline`` runs with the real ``dist.start_timeline``/``stop_timeline`` over a fake of
Horovod's two timeline calls (the real ones need Horovod initialised in this process,
and the timeline is taken on 2 or more ranks only; a real 2-rank timeline is read in
tests/e2e/test_netns.py): the fake writes a timeline as Horovod does, and the epoch's
``comm`` is read from it. ``Console`` runs
its real tqdm bar into pytest's captured stderr.
"""

from __future__ import annotations

import contextlib
import json

import pytest

from distseg.core import rundir, timeline
from distseg.core.timeline import GRADIENT_TENSORS, TIMELINE_STEPS
from distseg.parallel import distributed as dist
from distseg.training.epoch.observers import Console, Timeline

#: More steps than the timeline records.
EPOCH_STEPS = TIMELINE_STEPS + 4


def context(rank: int = 0, size: int = 2) -> dist.Context:
    return dist.Context(rank=rank, size=size, local_rank=rank, local_size=size,
                        controller="mpi", cores=1, pinned=False)


def step_record(epoch: int, step: int, loss: float = -0.25, lr: float = 2e-3) -> dict:
    return {"type": "step", "epoch": epoch, "step": step, "global_step": 100 + step,
            "loss": loss, "lr": lr}


class FakeHorovod:
    """Horovod's ``start_timeline``/``stop_timeline``: notes each call; the stop writes
    the file (left open, as Horovod leaves it until shutdown) with one small allreduce
    (1 tensor, 2 ms of negotiation) and the gradients' (``GRADIENT_TENSORS + 1`` fused,
    1 ms of negotiation, 2.9 ms of copies and wire)."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.path: str | None = None

    def start_timeline(self, path: str) -> None:
        self.calls.append(("start", path))
        self.path = path

    def stop_timeline(self) -> None:
        self.calls.append(("stop",))
        spans = [(0, 2_000, 2_100, 2_200)] + [(5_000, 6_000, 6_100, 9_000)] * (GRADIENT_TENSORS + 1)
        events = []
        for pid, (negotiate, negotiated, start, end) in enumerate(spans):
            events += [{"ph": "B", "name": timeline.NEGOTIATE, "ts": negotiate, "pid": pid},
                       {"ph": "E", "ts": negotiated, "pid": pid},
                       {"ph": "B", "name": timeline.OP, "ts": start, "pid": pid},
                       {"ph": "E", "ts": end, "pid": pid}]
        with open(self.path, "w") as f:
            f.write("[\n" + ",\n".join(json.dumps(e) for e in events) + ",")


@pytest.fixture
def horovod(monkeypatch) -> FakeHorovod:
    """The fake in place of the initialised Horovod module, the timeline dynamic."""
    fake = FakeHorovod()
    monkeypatch.setattr(dist, "_hvd", fake)
    monkeypatch.setenv("HOROVOD_TIMELINE", "DYNAMIC")
    return fake


def train_epoch(tl: Timeline, horovod: FakeHorovod, epoch: int, steps: int) -> list[int]:
    """One epoch through ``tl`` as the loop calls it; after each step, how many
    timeline calls Horovod has had."""
    tl.on_epoch_start(epoch, steps)
    calls = []
    for step in range(steps):
        tl.on_step(step_record(epoch, step))
        calls.append(len(horovod.calls))
    tl.on_epoch_trained()
    return calls


def test_the_timeline_records_the_first_steps_of_the_launchs_second_epoch(horovod, tmp_path):
    tl = Timeline(str(tmp_path), context(), first_epoch=0)
    # epoch 0 traces the step: no timeline
    assert train_epoch(tl, horovod, 0, EPOCH_STEPS) == [0] * EPOCH_STEPS
    assert (tl.comm, tl.epoch_fields()) == (None, {})
    # epoch 1: started at its start, stopped after its TIMELINE_STEPS-th step, once
    path = rundir.timeline_path(str(tmp_path), 1)
    assert path == str(tmp_path / "comm-timeline-e1.json")
    assert train_epoch(tl, horovod, 1, EPOCH_STEPS) == (
        [1] * (TIMELINE_STEPS - 1) + [2] * (EPOCH_STEPS - TIMELINE_STEPS + 1))
    assert horovod.calls == [("start", path), ("stop",)]
    # rank 0 read it at the end of the epoch's training, into the epoch record's comm
    comm = tl.comm
    assert tl.epoch_fields() == {"comm": comm} and comm == timeline.record(path, TIMELINE_STEPS)
    assert (comm["steps"], comm["file"], comm["gradient_ops"], comm["small_ops"]) == (
        TIMELINE_STEPS, "comm-timeline-e1.json", 1, 1)
    assert (comm["gradient_wait_s"], comm["small_wait_s"]) == pytest.approx((0.001, 0.002))
    assert comm["gradient_s"] == pytest.approx(0.0029)
    # epoch 2: nothing more, and the epoch record has no comm
    assert train_epoch(tl, horovod, 2, EPOCH_STEPS) == [2] * EPOCH_STEPS
    assert (tl.comm, tl.epoch_fields()) == (None, {})


def test_a_short_epoch_is_recorded_whole_and_an_empty_one_not_at_all(horovod, monkeypatch,
                                                                     tmp_path):
    tl = Timeline(str(tmp_path), context(), first_epoch=0)
    assert train_epoch(tl, horovod, 1, 5) == [1, 1, 1, 1, 2]
    assert tl.epoch_fields()["comm"]["steps"] == 5
    empty = FakeHorovod()
    monkeypatch.setattr(dist, "_hvd", empty)
    tl = Timeline(str(tmp_path), context(), first_epoch=0)
    assert train_epoch(tl, empty, 1, 0) == [] and empty.calls == []
    assert tl.epoch_fields() == {}


def test_a_resumed_launch_records_its_own_second_epoch(horovod, tmp_path):
    """Resumed at epoch 3, the launch's first epoch traces the step: epoch 4 is timed."""
    tl = Timeline(str(tmp_path), context(), first_epoch=3)
    for epoch in (1, 3):
        train_epoch(tl, horovod, epoch, EPOCH_STEPS)
    assert horovod.calls == []
    train_epoch(tl, horovod, 4, EPOCH_STEPS)
    assert horovod.calls == [("start", str(tmp_path / "comm-timeline-e4.json")), ("stop",)]
    assert tl.epoch_fields()["comm"]["file"] == "comm-timeline-e4.json"


def test_every_rank_starts_and_stops_it_and_rank_0_alone_reads_it(monkeypatch, tmp_path):
    """The same calls after the same steps on every rank (no collective depends on
    them); the comm field on rank 0 alone, for the timed epoch alone."""
    monkeypatch.setenv("HOROVOD_TIMELINE", "DYNAMIC")
    seen = []
    for rank in (0, 1):
        fake = FakeHorovod()
        monkeypatch.setattr(dist, "_hvd", fake)
        tl = Timeline(str(tmp_path), context(rank), first_epoch=0)
        steps, fields = [], []
        for epoch in range(3):
            steps.append(train_epoch(tl, fake, epoch, EPOCH_STEPS))
            fields.append(tl.epoch_fields())
        seen.append((steps, fake.calls, fields))
    assert seen[0][:2] == seen[1][:2] and len(seen[0][1]) == 2
    assert [list(f) for f in seen[0][2]] == [[], ["comm"], []]
    assert seen[1][2] == [{}, {}, {}]


def test_one_rank_or_a_timeline_not_dynamic_records_nothing(horovod, monkeypatch, tmp_path):
    """One rank has no collective to time; a ``HOROVOD_TIMELINE`` file of the user's own
    (or none, in an elastic run) is left alone: no start, no stop, no comm."""
    one = Timeline(str(tmp_path), context(0, size=1), first_epoch=0)
    for epoch in range(3):
        train_epoch(one, horovod, epoch, EPOCH_STEPS)
        assert one.epoch_fields() == {}
    for setting in (str(tmp_path / "mine.json"), None):
        if setting is None:
            monkeypatch.delenv("HOROVOD_TIMELINE")
        else:
            monkeypatch.setenv("HOROVOD_TIMELINE", setting)
        tl = Timeline(str(tmp_path), context(), first_epoch=0)
        for epoch in range(3):
            train_epoch(tl, horovod, epoch, EPOCH_STEPS)
            assert tl.epoch_fields() == {}
    assert horovod.calls == []


EPOCH = {"type": "epoch", "epoch": 1, "epoch_time": 12.34, "train_loss": -0.25,
         "val_loss": -0.3, "val_dice": {"background": 0.9, "liver": 0.8123, "lesion": 0.4}}


def test_rank_0_shows_a_bar_over_the_launchs_steps_and_prints_the_epoch_lines(capsys):
    with contextlib.ExitStack() as resources:
        console = Console.open(context(0), total=10, done=4, resources=resources)  # a resumed launch
        bar = console.bar
        assert (bar.n, bar.total, bar.desc, bar.unit) == (4, 10, "train x2", "step")
        console.on_step(step_record(1, 0))
        assert (bar.n, bar.postfix) == (5, "epoch=1, loss=-0.2500, lr=2.00e-03")
        console.say("batch policy: 8 per rank from epoch 2")
        console.set_left(6)  # a new batch: 6 steps from here
        assert (bar.n, bar.total) == (5, 11)
        console.on_epoch_end(EPOCH)
        console.on_epoch_end({**EPOCH, "epoch": 2, "val_loss": None,
                              "val_dice": {"liver": None, "lesion": 0.25}})
        console.on_epoch_end({**EPOCH, "epoch": 3, "val_loss": None, "val_dice": {}})
        assert not bar.disable
    assert bar.disable  # closed with the launch's resources
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "batch policy: 8 per rank from epoch 2",
        "epoch 1: 12.3 s, train loss -0.2500, val loss -0.3000, "
        "val Dice background 0.900, liver 0.812, lesion 0.400",
        "epoch 2: 12.3 s, train loss -0.2500, val loss n/a, val Dice lesion 0.250",
        "epoch 3: 12.3 s, train loss -0.2500, val loss n/a, val Dice n/a"]
    renders = err.split("\r")
    assert renders[1].startswith("train x2:  40%") and " 4/10 " in renders[1]
    assert err.endswith("\n") and renders[-1].startswith("train x2:  45%") and " 5/11 " in renders[-1]


def test_other_ranks_are_silent(capsys):
    with contextlib.ExitStack() as resources:
        console = Console.open(context(1), total=10, done=0, resources=resources)
        assert console.bar is None
        console.on_run({"type": "run"})
        console.on_epoch_start(0, 10)
        console.on_step(step_record(0, 0))
        console.say("resuming from epoch 3")
        console.set_left(4)
        console.on_epoch_end(EPOCH)
    assert capsys.readouterr() == ("", "")
