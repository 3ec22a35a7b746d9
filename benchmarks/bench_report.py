"""Benchmark of ``distseg-report`` on large synthetic logs: time and peak memory.

Generates one run directory with ``--ranks`` rank logs of ``--steps`` step records
each (plus the run, epoch and end records of a healthy run, with sample digests that
add up), then runs ``distseg-report`` on it in a subprocess and prints the wall time
and the subprocess's peak resident memory. The issue's target: 64 ranks x 100,000
steps (6.4 M lines, about 1.6 GiB of logs) in under 60 s and 4 GiB on 2 cores.
The report it writes is checked (ranks, epochs, steps, coverage), so a fast run that
skipped data cannot pass.

Generation is vectorised (Arrow compute builds the JSON text column by column), so it
takes seconds per GB rather than minutes.

Usage::

    python benchmarks/bench_report.py                      # 64 x 100,000
    python benchmarks/bench_report.py --ranks 4 --steps 2000 --keep /tmp/bench
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distseg import schema


def _text(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values), pa.string())


def json_lines(fixed: str, columns: dict[str, np.ndarray]) -> pa.Array:
    """One compact JSON object per row: ``{fixed, "col": value, ...}`` as text."""
    pieces: list = [pa.scalar("{" + fixed)]
    for name, values in columns.items():
        pieces.append(pa.scalar(f',"{name}":'))
        pieces.append(_text(values))
    pieces.append(pa.scalar("}"))
    return pc.binary_join_element_wise(*pieces, "")


def write_rank(path: str, rank: int, size: int, steps: int, steps_per_epoch: int,
               batch: int, digests: np.ndarray, hosts: int, start: float) -> None:
    rng = np.random.default_rng(rank)
    epochs = steps // steps_per_epoch
    gs = np.arange(steps)
    step_time = 0.5 + 0.02 * rng.random(steps) + 0.01 * (rank % 7 == 3)
    t = np.cumsum(step_time) + np.repeat(np.arange(epochs + 1) * 5.0, steps_per_epoch)[:steps]
    loss = -0.8 * (1 - np.exp(-gs / (steps / 5))) + 0.01 * np.sin(gs)
    step = json_lines(f'"type":"step","rank":{rank}', {
        "time": start + t, "epoch": gs // steps_per_epoch, "step": gs % steps_per_epoch,
        "global_step": gs, "t": t, "step_time": step_time,
        "data_wait": 0.002 * rng.random(steps), "loss": loss, "loss_local": loss + 0.001 * rank,
        "lr": np.full(steps, 1e-3), "samples": np.full(steps, batch)})
    run = {"type": "run", "rank": rank, "time": start, "schema_version": 1, "size": size,
           "local_rank": rank % (size // hosts), "local_size": size // hosts,
           "host": f"node{rank * hosts // size:03d}", "pid": 1000 + rank, "run_id": "bench",
           "start_time": start, "versions": {"python": "3.11"}, "controller": "mpi",
           "threads": {"intra_op": 1, "inter_op": 1}, "config_hash": "0123456789abcdef",
           "model": {"name": "unet2d", "params": 31_000_000, "image_size": 240},
           "dataset": {"path": "/data/lits.h5", "samples": size * batch * steps_per_epoch + 100,
                       "train_samples": size * batch * steps_per_epoch, "val_samples": 100,
                       "image_size": 240},
           "global_seed": 0, "steps_per_epoch": steps_per_epoch, "batch_size": batch,
           "global_batch_size": batch * size, "lr_base": 1e-4, "lr_scaled": 1e-4 * size}
    classes = ("background", "liver", "lesion")
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(run, separators=(",", ":")) + "\n")
        lines = step.to_numpy(zero_copy_only=False)
        for e in range(epochs):
            f.write("\n".join(lines[e * steps_per_epoch:(e + 1) * steps_per_epoch]) + "\n")
            end_t = float(t[(e + 1) * steps_per_epoch - 1]) + 5.0
            dice = {c: 0.5 + 0.4 * e / epochs for c in classes}
            f.write(json.dumps({
                "type": "epoch", "rank": rank, "time": start + end_t, "epoch": e, "t": end_t,
                "epoch_time": float(step_time[e * steps_per_epoch:(e + 1) * steps_per_epoch].sum()) + 5.0,
                "train_time": float(step_time[e * steps_per_epoch:(e + 1) * steps_per_epoch].sum()),
                "steps": steps_per_epoch, "samples": batch * steps_per_epoch,
                "sample_digest": f"{int(digests[e]):016x}",
                "train_loss": float(loss[e * steps_per_epoch:(e + 1) * steps_per_epoch].mean()),
                "train_loss_local": 0.0, "val_loss": -0.6, "val_loss_local": -0.6,
                "val_dice": dice, "val_dice_local": {c: v - 0.001 * rank for c, v in dice.items()},
                "val_samples_local": 2, "weight_checksum": [1.0, 2.0]},
                separators=(",", ":")) + "\n")
        tail = steps - epochs * steps_per_epoch
        if tail:
            f.write("\n".join(lines[epochs * steps_per_epoch:]) + "\n")
        f.write(json.dumps({"type": "end", "rank": rank, "time": start + float(t[-1]),
                            "status": "ok", "reason": "finished", "t": float(t[-1]) + 5.0,
                            "epochs_done": epochs}, separators=(",", ":")) + "\n")


def generate(run_dir: str, ranks: int, steps: int, steps_per_epoch: int = 1000,
             batch: int = 8, nodes: int | None = None) -> int:
    """Writes the run directory; returns the bytes of logs written."""
    nodes = nodes or max(1, ranks // 4)
    while ranks % nodes:
        nodes -= 1
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump({"data": {"path": "/data/lits.h5"}, "model": {"image_size": 240},
                   "train": {"batch_size": batch, "seed": 0}, "run_dir": run_dir}, f)
    n = ranks * batch * steps_per_epoch
    mixed = schema.mix64(np.arange(n, dtype=np.uint64))
    epochs = max(1, steps // steps_per_epoch)
    digests = np.zeros((epochs, ranks), np.uint64)
    for e in range(epochs):
        perm = mixed[np.random.default_rng([0, e]).permutation(n)]
        with np.errstate(over="ignore"):
            digests[e] = np.add.reduce(perm.reshape(ranks, -1), axis=1, dtype=np.uint64)
    total = 0
    for r in range(ranks):
        path = os.path.join(run_dir, "logs", f"rank-{r:05d}.jsonl")
        write_rank(path, r, ranks, steps, steps_per_epoch, batch, digests[:, r], nodes, 1.7e9)
        total += os.path.getsize(path)
    return total


def check_report(path: str, ranks: int, steps: int, steps_per_epoch: int) -> list[str]:
    """What in the written report disagrees with the generated logs."""
    with open(path) as f:
        doc = json.load(f)
    t = doc["tables"]
    epochs = steps // steps_per_epoch
    tpe = t["time_per_epoch"][0]
    problems = []
    if (tpe["ranks"], tpe["epochs"], tpe["steady_epochs"]) != (ranks, epochs, epochs - 1):
        problems.append(f"time_per_epoch says {tpe['ranks']} ranks, {tpe['epochs']} epochs")
    counted = sum(r["steps"] for r in t["rank_balance"])
    if counted != ranks * (steps - steps_per_epoch):  # warm-up epoch left out
        problems.append(f"rank_balance counted {counted} steps")
    covered = sum(1 for r in t["coverage"] if r["covered"])
    if covered != epochs:
        problems.append(f"{covered} of {epochs} epochs covered")
    skipped = [n for n in doc["notes"] if n["level"] in ("skipped", "warning")]
    if skipped:
        problems.append(f"notes: {skipped[:3]}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100_000, help="step records per rank")
    ap.add_argument("--steps-per-epoch", type=int, default=1000)
    ap.add_argument("--keep", default=None, help="write logs and report here and keep them")
    ap.add_argument("--limit-s", type=float, default=60.0)
    ap.add_argument("--limit-gib", type=float, default=4.0)
    args = ap.parse_args()

    work = args.keep or tempfile.mkdtemp(prefix="bench_report_")
    run_dir = os.path.join(work, f"np{args.ranks}")
    try:
        t0 = time.perf_counter()
        if os.path.isdir(run_dir):
            shutil.rmtree(run_dir)
        size = generate(run_dir, args.ranks, args.steps, args.steps_per_epoch)
        gen_s = time.perf_counter() - t0
        lines = args.ranks * args.steps
        print(f"generated {args.ranks} rank logs x {args.steps:,} step records "
              f"({lines / 1e6:.2f} M lines, {size / 2**30:.2f} GiB) in {gen_s:.1f} s", flush=True)

        exe = os.path.join(os.path.dirname(sys.executable), "distseg-report")
        cmd = ([exe] if os.path.exists(exe) else [sys.executable, "-c",
               "from analysis.cli import report; report()"])
        cmd += [run_dir, "--target-loss", "-0.75", "--target-loss", "-0.76",
                "--project-nodes", "64,128,256", "--out", os.path.join(work, "report"),
                "--no-progress"]
        t1 = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t1
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)
            print(f"distseg-report failed with exit status {proc.returncode}")
            return 1
        peak_gib = peak_kib / 2**20
        problems = check_report(os.path.join(work, "report", "report.json"), args.ranks,
                                args.steps, args.steps_per_epoch)
        for p in problems:
            print(f"report check failed: {p}")
        ok = wall < args.limit_s and peak_gib < args.limit_gib and not problems
        print(f"distseg-report: {wall:.1f} s wall, peak RSS {peak_gib:.2f} GiB "
              f"({lines / wall / 1e6:.2f} M lines/s) on {os.cpu_count()} cores; "
              f"limits {args.limit_s:g} s, {args.limit_gib:g} GiB: {'PASS' if ok else 'FAIL'}")
        return 0 if ok else 2
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
