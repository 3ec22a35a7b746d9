"""The command-line options that every benchmark piece shares: the workload of
``make bench`` (the demo preset on LiTS case 117, batch 8 per rank, one intra-op
thread) unless told otherwise."""

from __future__ import annotations

import argparse


def workload_parser(doc: str | None, *, epochs: int | None = None, batch_size: bool = True,
                    threads: bool = True, batch_help: str = "per rank") -> argparse.ArgumentParser:
    """A parser with ``--data`` and ``--preset``, and ``--epochs`` (default ``epochs``,
    left out when None), ``--batch-size`` and ``--threads`` as asked."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/liver117.h5")
    p.add_argument("--preset", default="demo")
    if epochs is not None:
        p.add_argument("--epochs", type=int, default=epochs)
    if batch_size:
        p.add_argument("--batch-size", type=int, default=8, help=batch_help)
    if threads:
        p.add_argument("--threads", type=int, default=1, help="intra-op threads (inter-op: 1)")
    return p
