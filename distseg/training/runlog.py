"""Per-rank JSON-lines run logs (schema in ``distseg.core.schema``).

Every rank writes its own file, ``RUN/logs/rank-NNNNN.jsonl`` (``distseg.core.rundir``), one record per line,
written whole per line so that a killed job loses at most the line being written. Logs
are opened for appending: a resumed run continues its files. A line that cannot be
written (a full disk) is taken back, so the file holds whole records only, and raises
``WriteError`` (exit 1) naming the file.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from distseg.core import rundir
from distseg.core.errors import WriteError


def _clean(value: Any) -> Any:
    """JSON has no NaN/Inf: they become null (readers treat null as missing)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _clean(value.item())
    return value


class RunLog:
    """Appends typed records to one rank's log file."""

    def __init__(self, run_dir: str, rank: int):
        self.rank = rank
        self.path = rundir.log_path(run_dir, rank)
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            # Unbuffered: each record goes to the file in write() or not at all, so a
            # failed line is never written again by a later flush or by close().
            self._file = open(self.path, "ab", buffering=0)
        except OSError as e:
            raise WriteError.of(self.path, "opening the log", e) from e

    def write(self, kind: str, **fields: Any) -> dict:
        """Appends one record; raises ``WriteError`` (an ``OSError``) if it cannot."""
        record = {"type": kind, "rank": self.rank, "time": time.time(), **fields}
        line = (json.dumps(_clean(record), separators=(",", ":")) + "\n").encode()
        start = os.fstat(self._file.fileno()).st_size
        try:
            written = 0
            while written < len(line):  # a write can be short on a filling disk
                written += self._file.write(line[written:])
        except OSError as e:
            try:
                os.ftruncate(self._file.fileno(), start)  # no torn line left behind
            except OSError:
                pass
            raise WriteError.of(self.path, f"writing the {kind} record", e) from e
        return record

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
