"""Where a distributed step's time goes, from Horovod's timeline.

distseg records it for a few steps of each launch's second epoch on 2 or more ranks
(``distseg.parallel.distributed.start_timeline``; the first epoch traces the step) and
logs what this module reads from it in that epoch's record, ``comm``; the file stays in
the run directory (``rundir.timeline_path``, ``comm-timeline-e<epoch>.json``: open it in
Perfetto or chrome://tracing). ``benchmarks/bench_link.py`` reads whole-run timelines with it too.

Rank 0, Horovod's coordinator, writes one process per tensor, in Chrome's JSON event
format: a ``NEGOTIATE_ALLREDUCE`` span from the first rank's request for the tensor to
the last rank's (for a grouped allreduce, whose tensors are all requested at once, the
time the first rank waited for the other), then an ``ALLREDUCE`` span: the copies into
and out of the fusion buffer and the wire time (``MPI_ALLREDUCE`` or
``GLOO_ALLREDUCE``) inside it. The tensors fused into one buffer share one such
collective: their spans overlap, and ``fused_ops`` merges them.

distseg's step makes two allreduces: the forward pass's Dice sums (a few floats) and the
grouped gradients (every trainable variable, plus the flags and norms). ``breakdown``
tells them apart by the number of tensors fused and gives the medians. Plain Python:
the report reads the records without TensorFlow.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass

OP = "ALLREDUCE"
NEGOTIATE = "NEGOTIATE_ALLREDUCE"
#: A fused allreduce of more tensors than this is the gradients'; fewer, a small one.
GRADIENT_TENSORS = 8
#: Steps of the timeline's epoch recorded (fewer where the epoch is shorter).
TIMELINE_STEPS = 16
#: The medians, in seconds, that ``breakdown`` gives and an epoch record's ``comm``
#: holds: the gradients' allreduce and the wait before it, the small allreduces' and
#: the wait before them. Every reader of ``comm`` (the report, TensorBoard) takes them
#: from here.
MEDIANS = ("gradient_s", "gradient_wait_s", "small_s", "small_wait_s")


@dataclass(frozen=True)
class FusedOp:
    """One collective (fusion copies and wire): its start and end (microseconds since
    the timeline began), the tensors fused into it, and the longest negotiation among
    them (how long the first rank waited for the last before it could start)."""

    start: int
    end: int
    tensors: int
    wait: int

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / 1e6


def read_events(path: str) -> list[dict]:
    """The timeline's events; a timeline cut off without its closing bracket (Horovod
    closes it at shutdown) is read up to its last whole event."""
    with open(path) as f:
        text = f.read().rstrip().rstrip(",")
    if not text.endswith("]"):
        text = text[:text.rfind("}") + 1] + "]"
    return json.loads(text)


def spans(events: list[dict]) -> list[tuple[str, int, int, int]]:
    """(activity, start, end, tensor) of every begin/end pair, per tensor (pid)."""
    open_spans: dict[int, list[dict]] = {}
    out = []
    for e in events:
        if e.get("ph") == "B":
            open_spans.setdefault(e["pid"], []).append(e)
        elif e.get("ph") == "E" and open_spans.get(e["pid"]):
            begin = open_spans[e["pid"]].pop()
            out.append((begin["name"], begin["ts"], e["ts"], e["pid"]))
    return out


def fused_ops(all_spans: list[tuple[str, int, int, int]]) -> list[FusedOp]:
    """The ``ALLREDUCE`` spans merged into collectives (overlapping spans are one fused
    op), each with the longest negotiation among its tensors that ended by its start."""
    wires = sorted((s, e, pid) for name, s, e, pid in all_spans if name == OP)
    negotiated: dict[int, list[tuple[int, int]]] = {}
    for name, s, e, pid in all_spans:
        if name == NEGOTIATE:
            negotiated.setdefault(pid, []).append((s, e))
    groups: list[list[tuple[int, int, int]]] = []
    for span in wires:
        if groups and span[0] <= max(e for _, e, _ in groups[-1]):
            groups[-1].append(span)
        else:
            groups.append([span])
    ops = []
    for group in groups:
        start, end = min(s for s, _, _ in group), max(e for _, e, _ in group)
        ops.append(FusedOp(start, end, len(group),
                           max((_last_before(negotiated.get(pid, ()), start)
                                for _, _, pid in group), default=0)))
    return ops


def _last_before(negotiations, start: int) -> int:
    """The length of the last of a tensor's (start, end) negotiations that ended by
    ``start`` (0: none)."""
    ended = [(e, e - s) for s, e in negotiations if e <= start]
    return max(ended)[1] if ended else 0


def breakdown(path: str, after: float = 0.5) -> dict:
    """Medians, in seconds, over the fused ops in the last ``1 - after`` of the timeline:
    ``gradient_s`` and ``gradient_wait_s`` (the gradients' allreduce, fusion copies and
    wire, and the wait for the other rank before it), ``small_s`` and ``small_wait_s``
    (the small allreduces'), in ``MEDIANS``' order, and how many of each were seen."""
    ops = fused_ops(spans(read_events(path)))
    if not ops:
        return {}
    cut = ops[0].start + after * (ops[-1].end - ops[0].start)
    late = [op for op in ops if op.start >= cut]
    big = [op for op in late if op.tensors > GRADIENT_TENSORS]
    small = [op for op in late if op.tensors <= GRADIENT_TENSORS]
    values = ([op.seconds for op in big], [op.wait / 1e6 for op in big],
              [op.seconds for op in small], [op.wait / 1e6 for op in small])
    return {**{k: statistics.median(v) if v else None for k, v in zip(MEDIANS, values)},
            "gradient_ops": len(big), "small_ops": len(small)}


def record(path: str, steps: int) -> dict:
    """The epoch record's ``comm`` from the timeline at ``path`` of ``steps`` steps:
    ``breakdown``'s medians over the whole file, ``steps`` and the file's name; with
    ``error`` instead where it cannot be read (a missing or broken file, or events
    without the fields Horovod writes)."""
    try:
        parts = breakdown(path, after=0.0)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return {"steps": steps, "file": os.path.basename(path), "error": f"{type(e).__name__}: {e}"}
    return {"steps": steps, "file": os.path.basename(path), **parts}
