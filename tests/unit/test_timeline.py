"""``distseg.core.timeline``: Horovod timelines read into fused collectives and the
waits before them. The events are written in the format Horovod 0.28 writes (one
process per tensor, a negotiation span, then an ``ALLREDUCE`` span around the fusion
copies and the wire); a real 2-rank run's timeline is read in
tests/e2e/test_netns.py."""

from __future__ import annotations

import json
import os

import pytest

from distseg.core import rundir, timeline


def _tensor(pid: int, name: str, negotiate: tuple[int, int], op: tuple[int, int]) -> list[dict]:
    """One tensor's events as Horovod writes them (microseconds)."""
    return [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}},
        {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": negotiate[0], "pid": pid},
        {"ph": "X", "name": "1", "ts": negotiate[0], "pid": pid, "dur": 0},
        {"ph": "X", "name": "0", "ts": negotiate[1], "pid": pid, "dur": 0},
        {"ph": "E", "ts": negotiate[1], "pid": pid},
        {"ph": "B", "name": "ALLREDUCE", "ts": op[0], "pid": pid},
        {"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": op[0] + 1, "pid": pid},
        {"ph": "E", "ts": op[0] + 2, "pid": pid},
        {"ph": "B", "name": "MPI_ALLREDUCE", "ts": op[0] + 3, "pid": pid},
        {"ph": "E", "ts": op[1] - 1, "pid": pid},
        {"ph": "E", "ts": op[1], "pid": pid, "args": {"dtype": "float32", "shape": "[3]"}},
    ]


def _step(t0: int, grads: int, wait_loss: int, wait_grads: int) -> list[dict]:
    """One distseg step: the loss's Dice sums (one tensor) at t0, then ``grads`` fused
    gradient tensors 400 ms later, 70 ms on the wire."""
    events = _tensor(1, "HorovodAllreduce_dice", (t0, t0 + wait_loss),
                     (t0 + wait_loss + 100, t0 + wait_loss + 200))
    g0 = t0 + 400_000
    for i in range(grads):
        events += _tensor(10 + i, f"HorovodGroupedAllreduce_{i}of{grads}",
                          (g0, g0 + wait_grads), (g0 + wait_grads + 50 + i, g0 + wait_grads + 70_000))
    return events


def test_the_timeline_gives_each_fused_allreduce_and_the_wait_before_it(tmp_path):
    events = []
    for k, (wl, wg) in enumerate([(5_000, 1_000), (20_000, 3_000), (40_000, 9_000)]):
        events += _step(k * 1_000_000, 20, wl, wg)
    path = tmp_path / "timeline.json"
    # Horovod leaves the array open until shutdown: a killed run's file ends in ",".
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",")
    ops = timeline.fused_ops(timeline.spans(timeline.read_events(str(path))))
    assert [op.tensors for op in ops] == [1, 20] * 3
    assert [op.wait for op in ops] == [5_000, 1_000, 20_000, 3_000, 40_000, 9_000]
    assert ops[1].seconds == pytest.approx(0.06995)  # first tensor in to last out
    parts = timeline.breakdown(str(path), after=0.0)
    assert parts["gradient_ops"] == 3 and parts["small_ops"] == 3
    assert parts["gradient_s"] == pytest.approx(0.06995)
    assert parts["gradient_wait_s"] == pytest.approx(0.003)
    assert parts["small_wait_s"] == pytest.approx(0.02)
    assert parts["small_s"] == pytest.approx(0.0001)
    # The keys every reader of an epoch record's ``comm`` takes from ``MEDIANS``.
    assert list(parts) == [*timeline.MEDIANS, "gradient_ops", "small_ops"]
    later = timeline.breakdown(str(path), after=0.5)  # ops from 1.235 s on (of 0-2.47 s)
    assert later["gradient_ops"] == 2 and later["small_ops"] == 1


def test_the_record_names_the_file_and_says_why_it_could_not_read_it(tmp_path):
    path = tmp_path / os.path.basename(rundir.timeline_path(str(tmp_path), 1))
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in _step(0, 12, 5_000, 2_000)) + "\n]")
    rec = timeline.record(str(path), steps=1)
    assert (rec["steps"], rec["file"], rec["gradient_ops"], rec["small_ops"]) == (
        1, "comm-timeline-e1.json", 1, 1)
    assert rec["gradient_wait_s"] == pytest.approx(0.002)
    missing = timeline.record(str(tmp_path / "none.json"), steps=3)
    assert missing["steps"] == 3 and missing["error"].startswith("FileNotFoundError")
    (tmp_path / "broken.json").write_text("[{\"ph\": ")
    assert "error" in timeline.record(str(tmp_path / "broken.json"), steps=3)
    (tmp_path / "foreign.json").write_text('[{"ph": "B", "name": "ALLREDUCE"}]')  # no pid
    assert timeline.record(str(tmp_path / "foreign.json"), steps=3)["error"].startswith("KeyError")
