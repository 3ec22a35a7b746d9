"""What the benchmarks read from a finished run's per-rank logs: every rank's records,
the global training throughput and the precision the run trained in. One formula for
every benchmark that times ``distseg-train`` (``bench_horovod``, ``bench_table``,
``bench_stateff``)."""

from __future__ import annotations

from distseg.core import ranktime, rundir, schema


def rank_records(run_dir: str, ranks: int) -> list[list[dict]]:
    """Every rank's log records of the run in ``run_dir``, rank 0 first."""
    return [schema.read_log(rundir.log_path(run_dir, r))[0] for r in range(ranks)]


def throughput(records: list[list[dict]]) -> float | None:
    """Global training samples/s over the epochs after the first (tracing and warm-up
    excluded), from every rank's ``epoch`` records (``ranktime.epochs_throughput``: a
    synchronous epoch lasts as long as its slowest rank); None without such an epoch."""
    per_epoch: dict[int, list] = {}
    for recs in records:
        for r in recs:
            if r.get("type") == "epoch" and r["epoch"] > 0:
                per_epoch.setdefault(r["epoch"], []).append((r["samples"], r["train_time"]))
    return ranktime.epochs_throughput(per_epoch.values())


def run_throughput(run_dir: str, ranks: int) -> float | None:
    """``throughput`` of the run in ``run_dir`` on ``ranks`` ranks."""
    return throughput(rank_records(run_dir, ranks))


def run_precision(run_dir: str) -> dict:
    """The ``precision`` field of the ``run`` record (rank 0's first record) of the run
    in ``run_dir``: what it was asked for (``requested``) and what it trained in
    (``choice``), with ``--precision auto``'s trial where one ran (``seconds``,
    ``speedup``, ``reason``). A log from before the field: its model's precision."""
    first = schema.read_log(rundir.log_path(run_dir, 0))[0][0]
    if "precision" in first:
        return first["precision"]
    return {"requested": first["model"]["precision"], "choice": first["model"]["precision"]}
