"""The arithmetic of benchmarks/bench_link.py: Horovod timelines read into fused
collectives and the waits before them (``benchlib.timeline``), the step breakdown, and
the CPU steal read from ``/proc/stat`` (``benchlib.machine``). The timeline events are
written in the format Horovod 0.28 writes (one trace process per tensor, a negotiation
span, then an ``ALLREDUCE`` span around the fusion copies and the wire)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from support import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import bench_link  # noqa: E402

from benchlib import machine, timeline  # noqa: E402


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
    later = timeline.breakdown(str(path), after=0.5)  # ops from 1.235 s on (of 0-2.47 s)
    assert later["gradient_ops"] == 2 and later["small_ops"] == 1


def test_the_breakdown_splits_a_step_into_allreduce_waits_and_the_rest():
    link = {"bandwidth_gbps": 1.0, "latency_us": 0.0}
    rows = [{"rate": "1gbit", "model": "demo", "variant": "distseg", "step_s": s,
             "gradient_s": 0.07, "gradient_wait_s": 0.01, "small_s": 0.0, "small_wait_s": 0.02,
             "link": link, "grad_bytes": 8e6} for s in (0.6, 0.7, 0.9)]
    rows.append({"rate": "1gbit", "model": "demo", "variant": "1proc", "step_s": 0.5,
                 "link": None})
    (part,) = bench_link.step_breakdown(rows)
    assert part["step_s"] == 0.7 and part["one_process_step_s"] == 0.5
    assert part["gradient_predicted_s"] == pytest.approx(8e6 * 8 / 1e9)  # 2 ranks: 1 x G
    assert part["wait_s"] == pytest.approx(0.03)
    assert part["rest_s"] == pytest.approx(0.7 - 0.07 - 0.03)


def test_cpu_steal_is_the_stolen_share_between_two_readings(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 1 2 3\n")
    before = machine.cpu_counters(str(stat))
    assert before == (35, 1000)
    stat.write_text("cpu  200 0 60 900 10 0 5 85 0 0\n")
    after = machine.cpu_counters(str(stat))
    assert machine.steal_fraction(before, after) == pytest.approx(50 / 260)
    assert machine.steal_fraction(None, after) is None
    assert machine.cpu_counters(str(tmp_path / "missing")) is None
