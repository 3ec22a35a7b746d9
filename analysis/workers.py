"""Reading many log files on several cores: worker processes, results in order.

Parsing a log is CPU work (pyarrow's JSON reader, numpy, pandas, and Python for the
few nested records); much of it holds the GIL, so files are parsed in worker
processes, each returning the small summary of one file (``summary.reduce_file``). The
results come back in the order the files were given, so the report is the same
however it was read. A pool costs start-up time (each worker imports pandas and
pyarrow) and memory (each worker holds the file it parses), so it is used only when
there is enough to read, more than one core, and memory for every worker.

Imports nothing of ``analysis``: the function to run is passed in.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Callable, Iterator, Sequence

#: Below this many bytes of logs, starting workers costs more than it saves: their
#: start-up is fixed, what they save grows with the logs
#: (docs/studies/report-speed-2026-11-23.md, "When workers pay").
MIN_BYTES = 512 << 20
#: Memory the workers may hold together while parsing.
MEMORY_BUDGET = 2 << 30
#: A worker's peak memory over the size of the file it parses: the measured ratio and
#: the libraries it imports, rounded up (docs/studies/report-speed-2026-11-23.md).
PEAK_PER_BYTE = 5
#: Most workers started, whatever the cores (more rarely pays: the parent combines
#: the results in one thread).
MAX_WORKERS = 8


def available_cores() -> int:
    """CPUs this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def worker_count(total_bytes: int, largest_bytes: int, files: int,
                 cores: int | None = None) -> int:
    """How many worker processes to read ``files`` files with; 0: read in this process.

    Args:
      total_bytes: size of all the files.
      largest_bytes: size of the largest (a worker holds one file at a time).
      files: number of files.
      cores: CPUs to use (default: ``available_cores()``).
    """
    cores = available_cores() if cores is None else cores
    if cores < 2 or files < 2 or total_bytes < MIN_BYTES:
        return 0
    by_memory = MEMORY_BUDGET // max(1, PEAK_PER_BYTE * largest_bytes)
    n = min(cores, files, by_memory, MAX_WORKERS)
    return n if n >= 2 else 0


def _init_worker() -> None:
    # One arrow thread per worker: the workers already use every core between them.
    import pyarrow

    pyarrow.set_cpu_count(1)


def _in_order(pool: ProcessPoolExecutor, fn: Callable, args: Sequence[tuple],
              ahead: int) -> Iterator[Any]:
    """``fn(*a)`` for each ``a`` in order, at most ``ahead`` submitted but not yet taken
    (so finished results do not pile up while an early one is still running)."""
    pending: deque[Future] = deque()
    it = iter(args)
    for a in it:
        pending.append(pool.submit(fn, *a))
        if len(pending) >= ahead:
            break
    while pending:
        result = pending.popleft().result()
        nxt = next(it, None)
        if nxt is not None:
            pending.append(pool.submit(fn, *nxt))
        yield result


@contextlib.contextmanager
def ordered_map(fn: Callable, args: Sequence[tuple], processes: int) -> Iterator[Iterator[Any]]:
    """Yields an iterator of ``fn(*a)`` for each ``a`` of ``args``, in order.

    With ``processes`` >= 1, in that many worker processes (``fn`` must be a
    module-level function; its exceptions are raised here); else lazily in this one.
    Workers are started with ``forkserver`` where there is one (a clean process, not a
    copy of this one's threads), else ``spawn``.
    """
    if processes < 1:
        yield (fn(*a) for a in args)
        return
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    pool = ProcessPoolExecutor(processes, mp_context=ctx, initializer=_init_worker)
    try:
        yield _in_order(pool, fn, args, 2 * processes)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
