"""Per-rank JSON-lines run logs (schema in ``distseg.core.schema``).

Every rank writes its own file, ``RUN/logs/rank-NNNNN.jsonl`` (``distseg.core.rundir``), one record per line,
flushed per line so that a killed job loses at most the line being written. Logs are
opened for appending: a resumed run continues its files.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from distseg.core import rundir


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
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, kind: str, **fields: Any) -> dict:
        record = {"type": kind, "rank": self.rank, "time": time.time(), **fields}
        self._file.write(json.dumps(_clean(record), separators=(",", ":")) + "\n")
        self._file.flush()
        return record

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
