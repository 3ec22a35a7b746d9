"""Benchmark of ``distseg-report`` on large synthetic logs: time and peak memory.

Generates one run directory with ``--ranks`` rank logs of ``--steps`` step records
each (plus the run, epoch and end records of a healthy run, with sample digests that
add up), then runs ``distseg-report`` on it in a subprocess and prints the wall time,
the peak resident memory of its largest process and of all its processes together
(the report may start worker processes). Two sizes have targets on a 2-core machine:

* ``--preset target`` (default): 64 ranks x 100,000 steps (6.4 M lines, ~1.6 GiB),
  under 60 s and 4 GiB;
* ``--preset allocation``: 256 ranks x 350,000 steps (89.6 M lines, ~22 GiB, a real
  allocation), under 10 minutes and 4 GiB.

The report it writes is checked against what was generated (ranks, epochs, every step
counted, every epoch covered, and the exact first crossing of each loss target, raw
and smoothed, recomputed here from the written values), so a fast run that skipped
data cannot pass.

Generation is vectorised: every step line is a row of one byte matrix, numbers
written as fixed-width decimal digits (space-padded, which JSON allows) by numpy; the
columns all ranks share are built once per process, and ranks are written by
``--gen-processes`` processes in parallel, so 22 GiB take minutes, not hours.

Usage::

    python benchmarks/bench_report.py                          # 64 x 100,000
    python benchmarks/bench_report.py --preset allocation      # 256 x 350,000
    python benchmarks/bench_report.py --ranks 4 --steps 2000 --keep /tmp/bench
    python benchmarks/bench_report.py --keep /tmp/b --reuse --workers 0   # serial reading
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pandas as pd

from distseg.core import rundir, schema
from distseg.core.config import LIVER_CLASSES

PRESETS = {"target": dict(ranks=64, steps=100_000, limit_s=60.0),
           "allocation": dict(ranks=256, steps=350_000, limit_s=600.0)}
START = 1.7e9
VAL_S = 5.0
BATCH = 8
TARGETS = (-0.75, -0.76)
SMOOTH = 25


# ----------------------------------------------------------------------------- bytes


def _const(text: str, n: int) -> np.ndarray:
    return np.broadcast_to(np.frombuffer(text.encode(), np.uint8), (n, len(text)))


def fixed(values: np.ndarray, int_width: int, decimals: int = 0,
          signed: bool = False) -> np.ndarray:
    """Numbers as rows of ASCII digits, ``int_width`` integer places (leading zeros as
    spaces) and ``decimals`` places; ``signed`` adds a sign column (``-`` or a space)
    and needs ``int_width`` 1. Returns an ``(n, width)`` uint8 array."""
    v = np.asarray(values, np.float64)
    scaled = np.rint(np.abs(v) * 10.0 ** decimals).astype(np.int64)
    places = int_width + decimals
    if len(scaled) and scaled.max() >= 10 ** places:
        raise ValueError(f"a value does not fit {int_width} integer places")
    pow10 = 10 ** np.arange(places - 1, -1, -1, dtype=np.int64)
    chars = ((scaled[:, None] // pow10) % 10 + 48).astype(np.uint8)
    lead = scaled[:, None] < pow10[:int_width - 1]
    chars[:, :int_width - 1][lead] = 32
    parts = [chars[:, :int_width]]
    if decimals:
        parts += [_const(".", len(v)), chars[:, int_width:]]
    if signed:
        if int_width != 1:
            raise ValueError("signed numbers need int_width 1")
        sign = np.where(v < 0, ord("-"), ord(" ")).astype(np.uint8)[:, None]
        parts.insert(0, sign)
    return np.concatenate(parts, axis=1)


def curve_values(steps: int) -> np.ndarray:
    """The loss every rank logs (a mean over ranks), as written: 15 decimals."""
    gs = np.arange(steps)
    loss = -0.8 * (1 - np.exp(-gs / (steps / 5))) + 0.01 * np.sin(gs)
    return np.rint(loss * 1e15) / 1e15


def shared_columns(steps: int, spe: int) -> dict[str, np.ndarray]:
    """The step-line fields every rank writes alike, as digit matrices."""
    gs = np.arange(steps)
    return {"epoch": fixed(gs // spe, 4), "step": fixed(gs % spe, 6),
            "global_step": fixed(gs, 7), "loss": fixed(curve_values(steps), 1, 15, signed=True),
            "lr": fixed(np.full(steps, 1e-3), 1, 6), "samples": fixed(np.full(steps, BATCH), 2)}


def rank_times(rank: int, steps: int, spe: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``step_time``, ``data_wait`` (as written: 12 decimals) and ``t`` (9) of one rank."""
    rng = np.random.default_rng(rank)
    step_time = np.round(0.5 + 0.02 * rng.random(steps) + 0.01 * (rank % 7 == 3), 12)
    data_wait = np.round(0.002 * rng.random(steps), 12)
    epochs = -(-steps // spe)
    t = np.round(np.cumsum(step_time) + np.repeat(np.arange(epochs) * VAL_S, spe)[:steps], 9)
    return step_time, data_wait, t


def step_matrix(rank: int, shared: dict[str, np.ndarray], step_time: np.ndarray,
                data_wait: np.ndarray, t: np.ndarray) -> np.ndarray:
    """One rank's step lines, one row each (newline included)."""
    n = len(t)
    pieces = [_const('{"type":"step","rank":%d,"time":' % rank, n), fixed(START + t, 10, 7),
              _const(',"epoch":', n), shared["epoch"], _const(',"step":', n), shared["step"],
              _const(',"global_step":', n), shared["global_step"], _const(',"t":', n),
              fixed(t, 6, 9), _const(',"step_time":', n), fixed(step_time, 1, 12),
              _const(',"data_wait":', n), fixed(data_wait, 1, 12), _const(',"loss":', n),
              shared["loss"], _const(',"loss_local":', n), shared["loss"], _const(',"lr":', n),
              shared["lr"], _const(',"samples":', n), shared["samples"], _const("}\n", n)]
    return np.concatenate(pieces, axis=1)


# ----------------------------------------------------------------------------- records


def run_record(rank: int, size: int, hosts: int, spe: int) -> dict:
    local = size // hosts
    return {"type": "run", "rank": rank, "time": START, "schema_version": 1, "size": size,
            "local_rank": rank % local, "local_size": local,
            "host": f"node{rank * hosts // size:03d}", "pid": 1000 + rank, "run_id": "bench",
            "start_time": START, "versions": {"python": "3.11"}, "controller": "mpi",
            "threads": {"intra_op": 1, "inter_op": 1, "cores": 1, "pinned": True,
                        "affinity": [rank % local]},
            "config_hash": "0123456789abcdef",
            "model": {"name": "unet2d", "params": 31_000_000, "image_size": 240},
            "dataset": {"path": "/data/lits.h5", "samples": size * BATCH * spe + 100,
                        "train_samples": size * BATCH * spe, "val_samples": 100,
                        "image_size": 240},
            "global_seed": 0, "steps_per_epoch": spe, "batch_size": BATCH,
            "global_batch_size": BATCH * size, "lr_base": 1e-4, "lr_scaled": 1e-4 * size}


def epoch_record(rank: int, e: int, epochs: int, spe: int, step_time: np.ndarray,
                 t: np.ndarray, loss: np.ndarray, digest: int) -> dict:
    sl = slice(e * spe, (e + 1) * spe)
    end_t = float(t[sl.stop - 1]) + VAL_S
    dice = {c: 0.5 + 0.4 * e / epochs for c in LIVER_CLASSES}  # a LiTS run's classes
    return {"type": "epoch", "rank": rank, "time": START + end_t, "epoch": e, "t": end_t,
            "epoch_time": float(step_time[sl].sum()) + VAL_S,
            "train_time": float(step_time[sl].sum()), "steps": spe, "samples": BATCH * spe,
            "sample_digest": f"{digest:016x}", "train_loss": float(loss[sl].mean()),
            "train_loss_local": 0.0, "val_loss": -0.6, "val_loss_local": -0.6,
            "val_dice": dice, "val_dice_local": {c: v - 0.001 * rank for c, v in dice.items()},
            "val_samples_local": 2, "weight_checksum": [1.0, 2.0]}


def _line(rec: dict) -> bytes:
    return (json.dumps(rec, separators=(",", ":")) + "\n").encode()


def write_rank(path: str, rank: int, size: int, steps: int, spe: int, digests: np.ndarray,
               hosts: int, shared: dict[str, np.ndarray]) -> int:
    """Writes one rank's log; returns its size in bytes."""
    step_time, data_wait, t = rank_times(rank, steps, spe)
    lines = step_matrix(rank, shared, step_time, data_wait, t)
    loss = curve_values(steps)
    epochs = steps // spe
    with open(path, "wb") as f:
        f.write(_line(run_record(rank, size, hosts, spe)))
        for e in range(epochs):
            f.write(memoryview(lines[e * spe:(e + 1) * spe]).cast("B"))
            f.write(_line(epoch_record(rank, e, epochs, spe, step_time, t, loss,
                                       int(digests[e]))))
        if steps > epochs * spe:
            f.write(memoryview(lines[epochs * spe:]).cast("B"))
        f.write(_line({"type": "end", "rank": rank, "time": START + float(t[-1]),
                       "status": "ok", "reason": "finished", "t": float(t[-1]) + VAL_S,
                       "epochs_done": epochs}))
    return os.path.getsize(path)


def _write_ranks(args: tuple) -> int:
    run_dir, ranks, size, steps, spe, digests, hosts = args
    shared = shared_columns(steps, spe)
    return sum(write_rank(rundir.log_path(run_dir, r), r, size, steps,
                          spe, digests[:, r], hosts, shared) for r in ranks)


def epoch_digests(ranks: int, epochs: int, spe: int) -> np.ndarray:
    """Per epoch and rank, the sample digest of the rank's shard (the shards of an
    epoch are a permutation of the train set cut in ``ranks`` pieces)."""
    n = ranks * BATCH * spe
    mixed = schema.mix64(np.arange(n, dtype=np.uint64))
    digests = np.zeros((max(epochs, 1), ranks), np.uint64)
    for e in range(epochs):
        perm = mixed[np.random.default_rng([0, e]).permutation(n)]
        with np.errstate(over="ignore"):
            digests[e] = np.add.reduce(perm.reshape(ranks, -1), axis=1, dtype=np.uint64)
    return digests


def generate(run_dir: str, ranks: int, steps: int, steps_per_epoch: int = 1000,
             nodes: int | None = None, processes: int = 2) -> int:
    """Writes the run directory; returns the bytes of logs written."""
    nodes = nodes or max(1, ranks // 4)
    while ranks % nodes:
        nodes -= 1
    os.makedirs(rundir.log_dir(run_dir), exist_ok=True)
    with open(rundir.config_path(run_dir), "w") as f:
        json.dump({"data": {"path": "/data/lits.h5"}, "model": {"image_size": 240},
                   "train": {"batch_size": BATCH, "seed": 0}, "run_dir": run_dir}, f)
    digests = epoch_digests(ranks, steps // steps_per_epoch, steps_per_epoch)
    jobs = [(run_dir, list(range(ranks))[i::processes], ranks, steps, steps_per_epoch,
             digests, nodes) for i in range(processes)]
    if processes <= 1:
        return sum(map(_write_ranks, jobs))
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        return sum(pool.map(_write_ranks, jobs))


# ----------------------------------------------------------------------------- checks


def expected_crossings(steps: int, spe: int) -> dict[tuple[float, int], tuple[int, float]]:
    """(target, window) -> (global step, hours) of the first crossing, from the values
    as written (rank 0's ``t``: every rank logs as many steps, so rank 0's curve)."""
    loss = pd.Series(curve_values(steps))
    _, _, t = rank_times(0, steps, spe)
    out = {}
    for window, values in ((0, loss), (SMOOTH, loss.rolling(SMOOTH, min_periods=1).mean())):
        for target in TARGETS:
            hit = np.flatnonzero(values.to_numpy() <= target)
            out[(target, window)] = (int(hit[0]), t[hit[0]] / 3600.0) if len(hit) else (-1, np.nan)
    return out


def check_report(out_dir: str, ranks: int, steps: int, steps_per_epoch: int) -> list[str]:
    """What in the written report disagrees with the generated logs."""
    with open(os.path.join(out_dir, "report.json")) as f:
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
    hours = pd.read_csv(os.path.join(out_dir, "hours_to_target.csv"))
    smoothed = hours[hours["metric"] == f"train_loss (smoothed {SMOOTH})"]
    for (target, window), (step, h) in expected_crossings(steps, steps_per_epoch).items():
        if window != SMOOTH:
            continue  # the report ran with --smooth: its table holds the smoothed crossing
        row = smoothed[np.isclose(smoothed["target"], target)].iloc[0]
        if step < 0 and row["reached"] or step >= 0 and (
                row["global_step"] != step or not np.isclose(row["hours"], h, rtol=0, atol=1e-9)):
            problems.append(f"target {target}: report says step {row['global_step']} at "
                            f"{row['hours']} h, expected step {step} at {h} h")
    # What the generated logs never measure, the projection assumes and says so: a
    # statistical-efficiency trend (one run) and the link between hosts (no link record).
    bad = [n for n in doc["notes"] if n["level"] in ("skipped", "warning")
           and "ASSUMED 1" not in n["message"] and not n["message"].startswith("ASSUMED link")]
    if bad:
        problems.append(f"notes: {bad[:3]}")
    return problems


# ----------------------------------------------------------------------------- running


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _usage(pid: int) -> tuple[int, float]:
    """Resident bytes and CPU seconds (user + system) of one process so far."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return rss, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0, 0.0


@dataclasses.dataclass
class Measured:
    """What ``run_report`` measured of the report and every process it started."""

    proc: subprocess.CompletedProcess
    wall_s: float
    largest_gib: float = 0.0
    """Peak resident memory of its largest process."""
    total_gib: float = 0.0
    """Peak resident memory of all its processes together (sampled every 0.2 s)."""
    cpu_s: float = 0.0
    """CPU seconds of all its processes (as last sampled, at most 0.2 s short each)."""


def run_report(cmd: list[str]) -> Measured:
    """Runs ``cmd`` and measures it: wall time, peak memory, CPU time."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    total = largest = 0
    cpu: dict[int, float] = {}
    done = threading.Event()

    def sample():
        nonlocal total, largest
        while not done.wait(0.2):
            usage = {p: _usage(p) for p in _tree(proc.pid)}
            total = max(total, sum(rss for rss, _ in usage.values()))
            largest = max([largest] + [rss for rss, _ in usage.values()])
            cpu.update({p: c for p, (_, c) in usage.items() if c})
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    done.set()
    sampler.join()
    wall = time.perf_counter() - t0
    own = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu[proc.pid] = own.ru_utime + own.ru_stime  # the report process's own, exact
    return Measured(subprocess.CompletedProcess(cmd, proc.returncode, out, err), wall,
                    max(largest, own.ru_maxrss * 1024) / 2**30,
                    max(total, own.ru_maxrss * 1024) / 2**30, sum(cpu.values()))


def report_command(run_dir: str, out_dir: str, workers: int | None) -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "distseg-report")
    cmd = ([exe] if os.path.exists(exe) else [sys.executable, "-c",
           "from analysis.cli import report; report()"])
    cmd += [run_dir, "--target-loss", str(TARGETS[0]), "--target-loss", str(TARGETS[1]),
            "--smooth", str(SMOOTH), "--project-nodes", "64,128,256", "--out", out_dir,
            "--no-progress"]
    return cmd + (["--workers", str(workers)] if workers is not None else [])


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="target")
    ap.add_argument("--ranks", type=int, default=None, help="default: the preset's")
    ap.add_argument("--steps", type=int, default=None, help="step records per rank")
    ap.add_argument("--steps-per-epoch", type=int, default=1000)
    ap.add_argument("--keep", default=None, help="write logs and report here and keep them")
    ap.add_argument("--reuse", action="store_true",
                    help="with --keep: use logs already there instead of writing them")
    ap.add_argument("--gen-processes", type=int, default=2)
    ap.add_argument("--workers", type=int, default=None,
                    help="distseg-report --workers (default: its own choice)")
    ap.add_argument("--limit-s", type=float, default=None, help="default: the preset's")
    ap.add_argument("--limit-gib", type=float, default=4.0)
    args = ap.parse_args()
    preset = PRESETS[args.preset]
    args.ranks = args.ranks or preset["ranks"]
    args.steps = args.steps or preset["steps"]
    args.limit_s = args.limit_s or preset["limit_s"]
    return args


def main() -> int:
    args = _args()
    work = args.keep or tempfile.mkdtemp(prefix="bench_report_")
    run_dir = os.path.join(work, f"np{args.ranks}")
    lines = args.ranks * args.steps
    try:
        if not (args.reuse and os.path.isdir(run_dir)):
            t0 = time.perf_counter()
            shutil.rmtree(run_dir, ignore_errors=True)
            size = generate(run_dir, args.ranks, args.steps, args.steps_per_epoch,
                            processes=args.gen_processes)
            print(f"generated {args.ranks} rank logs x {args.steps:,} step records "
                  f"({lines / 1e6:.2f} M lines, {size / 2**30:.2f} GiB) in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
        out_dir = os.path.join(work, "report")
        m = run_report(report_command(run_dir, out_dir, args.workers))
        if m.proc.returncode:
            print(m.proc.stderr[-3000:], file=sys.stderr)
            print(f"distseg-report failed with exit status {m.proc.returncode}")
            return 1
        problems = check_report(out_dir, args.ranks, args.steps, args.steps_per_epoch)
        for p in problems:
            print(f"report check failed: {p}")
        ok = m.wall_s < args.limit_s and m.total_gib < args.limit_gib and not problems
        print(f"distseg-report: {m.wall_s:.1f} s wall, {m.cpu_s:.1f} s CPU, peak RSS "
              f"{m.largest_gib:.2f} GiB (largest process), {m.total_gib:.2f} GiB (all "
              f"processes) ({lines / m.wall_s / 1e6:.2f} M lines/s) on {os.cpu_count()} "
              f"cores (load {os.getloadavg()[0]:.1f}); limits {args.limit_s:g} s, "
              f"{args.limit_gib:g} GiB: {'PASS' if ok else 'FAIL'}")
        return 0 if ok else 2
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
