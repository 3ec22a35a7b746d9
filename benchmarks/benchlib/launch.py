"""What the run-by-run benchmarks and studies share: running one distseg-train to its
end, and writing their results as a dated JSON file."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys

BIN = os.path.dirname(sys.executable)


def run_train(cmd: list[str], name: str, timeout: float = 3600) -> None:
    """Runs a distseg-train command line (its own first word a path or a command,
    TensorFlow's chatter quiet); raises naming ``name`` with its stderr's end."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"{name} failed ({out.returncode}):\n{out.stderr[-3000:]}")


def write_result(result: dict, results_dir: str, stem: str) -> str:
    """Writes ``result`` to RESULTS_DIR/STEM-YYYY-MM-DD-HHMM.json; returns the path."""
    os.makedirs(results_dir, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    path = os.path.join(results_dir, f"{stem}-{stamp}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    return path
