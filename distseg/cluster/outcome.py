"""How a launch of ``distseg-train`` ended, read from what the run wrote:
``distseg-jobs outcome`` prints ``run_outcome``'s line, and the Slurm job scripts
decide from it whether to requeue the job and which ranks to name (not from the
launcher's exit status alone: srun reports a coordinated stop as a failure when the
ranks' exits are a moment apart).

Plain Python, like ``distseg.cluster.jobs``: it runs on the login and batch nodes
without TensorFlow or Horovod.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from distseg.core import rundir, schema


@dataclass(frozen=True)
class Outcome:
    """How a launch of ``distseg-train`` ended, read from what the run wrote."""

    #: Every rank's log ends in an ``end`` record with status ``interrupted`` and a
    #: checkpoint exists: ``--resume`` continues the run.
    stopped: bool
    #: Ranks whose log does not end in an ``end`` record (killed or crashed).
    without_end: tuple[int, ...]

    def line(self) -> str:
        """One word for the job script, then the ranks without an end record."""
        if self.stopped:
            return "stopped"
        return " ".join(["lost", *map(str, self.without_end)]) if self.without_end else "ended"


#: Bytes read from the end of a rank log for its last record (a log grows by a step
#: record per step; an end record is a few hundred bytes).
_TAIL_BYTES = 1 << 16


def last_record(path: str) -> dict | None:
    """The record on the last line of a log, or None: no log, an empty one, or a last
    line that holds no record (a write cut off by a kill, even after an earlier launch's
    end record), read by the one rule of ``schema.parse_line``."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - _TAIL_BYTES))
            tail = f.read()
    except OSError:
        return None
    return schema.last_line(tail).record


def run_outcome(run_dir: str, ranks: int) -> Outcome:
    """Reads the last record of each of ``ranks`` logs of ``run_dir`` (see ``Outcome``)."""
    ends = {r: last_record(rundir.log_path(run_dir, r)) for r in range(ranks)}
    without_end = tuple(r for r, rec in ends.items() if not rec or rec.get("type") != "end")
    interrupted = all(rec and rec.get("type") == "end" and rec.get("status") == "interrupted"
                      for rec in ends.values())
    stopped = interrupted and os.path.isfile(rundir.latest_path(run_dir))
    return Outcome(stopped=stopped, without_end=without_end)
