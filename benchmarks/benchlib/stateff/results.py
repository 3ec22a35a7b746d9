"""The study's results file, ``bench/results/stateff-<date>.json``: the machine, the
target, the variants and scales, the goal rows (read by ``make bench``:
``benchlib/table.py``), the table and every run."""

from __future__ import annotations

import datetime
import json
import os
import platform

from benchlib.stateff.study import BATCH, SAMPLES_PER_EVAL, SCALES, VARIANTS


def machine() -> dict:
    return {"host": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "load_now": os.getloadavg()}


def write_results(args, runs: list[dict], rows: list[dict], goals: list[dict],
                  large_batch: dict | None = None) -> str:
    """Writes the results file (``--out``, else today's in ``--results-dir``); returns
    its path. ``large_batch``: the large-batch study's numbers (``largebatch.rows``)."""
    today = datetime.date.today().isoformat()
    out = args.out or os.path.join(args.results_dir, f"stateff-{today}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    doc = {
        "benchmark": "bench_stateff", "date": today, "machine": machine(),
        "target": {"measure": args.measure, "dice": args.target,
                   "samples_per_eval": SAMPLES_PER_EVAL, "batch_per_rank": BATCH},
        "variants": {v: {"what": VARIANTS[v][0], "overrides": VARIANTS[v][1]}
                     for v in args.variants},
        "scales": {sc: SCALES[sc] for sc in args.scale},
        # The goal rows, read by `make bench` (benchmarks/benchlib/table.py).
        "rows": goals,
        "summary": {"recommended": args.recommended, "scale": args.scale[0]},
        "large_batch": large_batch, "table": rows, "runs": runs,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    return out
