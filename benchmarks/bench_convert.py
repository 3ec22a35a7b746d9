"""Benchmark of ``distseg-data convert``: throughput, peak memory and the HDF5 filter.

1. Streaming: writes ``--cases`` phantom CT volumes (``--volume`` voxels in-plane,
   ``--slices`` slices, int16 ``.nii.gz``, three orientations) and a tenth of them,
   converts both with ``distseg-data convert --size 240`` in a subprocess, with 1 and
   2 workers, and prints cases/s, MB/s of volumes read and the peak RSS the command
   reports. Peak RSS must not grow with the number of cases.
2. Filters: converts the same phantom set and the real LiTS case 117 (written as NIfTI)
   with each of ``none``, ``lzf`` and ``gzip`` (level 1, byte shuffle), and measures the
   file size and reads of batches of 8 random slices, through ``data.SliceReader`` (as
   training reads) and one chunk per slice (the filter's own cost), from the page
   cache (warm) and after ``posix_fadvise(DONTNEED)`` dropped the file from it (cold,
   the first epoch on a node). Slices/s, median of 3.

Usage::

    python benchmarks/bench_convert.py                     # 24 cases of 256x256x96
    python benchmarks/bench_convert.py --cases 8 --keep /tmp/bench
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from distseg.data import slices as data
from distseg.data.convert import samples

from benchlib.launch import BIN


def convert(src: str, out: str, *extra: str) -> dict:
    started = time.perf_counter()
    done = subprocess.run([f"{BIN}/distseg-data", "convert", src, out, "--size", "240",
                           "--no-progress", *extra], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    line = done.stdout.splitlines()[0]
    rss = float(re.search(r"peak RSS (\d+) MiB", line).group(1))
    worker = re.search(r"largest worker (\d+) MiB", line)
    rate = float(re.search(r"([\d.]+) cases/s", line).group(1))
    mbs = float(re.search(r"([\d.]+) MB/s", line).group(1))
    return {"wall": wall, "rss": rss, "worker": float(worker.group(1)) if worker else 0.0,
            "rate": rate, "mbs": mbs, "size": os.path.getsize(out)}


def _drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_rate(path: str, batches: int = 60, batch: int = 8, cold: bool = False,
              per_slice: bool = False, cpu: bool = False) -> float:
    """Slices/s of random batches of ``batch`` slices: as the training prefetcher reads
    them (``SliceReader.read``, one fancy selection per batch), or ``per_slice``, one
    chunk read per slice (what the filter itself costs). ``cpu``: per CPU second of
    this process instead of per wall second (steadier on a shared machine)."""
    clock = time.process_time if cpu else time.perf_counter
    if cold:
        _drop_cache(path)
    rng = np.random.default_rng(0)
    with data.SliceReader(path) as reader:
        images = reader._images
        n = images.shape[0]
        started = clock()
        for _ in range(batches):
            ids = rng.choice(n, batch, replace=False)
            if per_slice:
                np.stack([images[i] for i in ids])
            else:
                reader.read(ids)
        return batches * batch / (clock() - started)


def streaming(root: str, cases: int, volume: int, slices: int) -> None:
    print(f"## streaming: phantom CT {volume}x{volume}x{slices} int16 .nii.gz -> 240x240 slices")
    print("| cases | workers | s | cases/s | MB/s read | peak RSS MiB | largest worker MiB |")
    print("|---|---|---|---|---|---|---|")
    few = max(2, cases // 10)
    for n in (few, cases):
        src = os.path.join(root, f"phantom{n}")
        if not os.path.isdir(src):
            samples.write_task(src, n, size=volume, slices=slices,
                               orientations=("LPS", "RAS", "PIR"), spacing_ras=(0.7, 0.7, 2.0))
        for workers in (1, 2):
            r = convert(src, os.path.join(root, f"s{n}w{workers}.h5"), "--workers", str(workers))
            print(f"| {n} | {workers} | {r['wall']:.1f} | {r['rate']:.2f} | {r['mbs']:.1f} | "
                  f"{r['rss']:.0f} | {r['worker'] or '-'} |")


def filters(root: str, cases: int) -> None:
    src = os.path.join(root, f"phantom{cases}")
    lits = os.path.join(root, "lits117")
    samples.write_lits117(lits)
    print("\n## filters: file size and random-batch reads (8 slices, SliceReader)")
    print("| data | filter | MB | convert s | SliceReader warm | cold | per-slice warm | cold "
          "| per-slice per CPU s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, folder in ((f"phantom x{cases}", src), ("LiTS 117", lits)):
        for comp in ("none", "lzf", "gzip"):
            out = os.path.join(root, f"{comp}.h5")
            r = convert(folder, out, "--compression", comp)
            read_rate(out, batches=5)  # open and touch once
            rates = [np.median([read_rate(out, cold=cold, per_slice=per) for _ in range(3)])
                     for per in (False, True) for cold in (False, True)]
            rates.append(np.median([read_rate(out, per_slice=True, cpu=True) for _ in range(3)]))
            print(f"| {name} | {comp} | {r['size'] / 1e6:.1f} | {r['wall']:.1f} | "
                  + " | ".join(f"{v:.0f}" for v in rates) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=24)
    ap.add_argument("--volume", type=int, default=256, help="in-plane voxels of a phantom")
    ap.add_argument("--slices", type=int, default=96)
    ap.add_argument("--keep", default=None, help="work folder to keep (default: a temporary one)")
    ap.add_argument("--only", choices=["streaming", "filters"], default=None)
    args = ap.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="bench-convert-")
    os.makedirs(root, exist_ok=True)
    try:
        if args.only != "filters":
            streaming(root, args.cases, args.volume, args.slices)
        if args.only != "streaming":
            if not os.path.isdir(os.path.join(root, f"phantom{args.cases}")):
                samples.write_task(os.path.join(root, f"phantom{args.cases}"), args.cases,
                                   size=args.volume, slices=args.slices,
                                   orientations=("LPS", "RAS", "PIR"), spacing_ras=(0.7, 0.7, 2.0))
            filters(root, args.cases)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
