"""The launches of a run across its ranks, and where each rank ran.

A resumed run has several launches; each rank's file holds one ``run`` record per
launch it took part in. ``map_launches`` matches them across ranks by
``summary.launch_key`` (the agreed start time and run id) and numbers the launches in
time; ``identify`` says who ran (size, hosts, the reference ``run`` record);
``launch_table``, ``launch_notes`` and ``placement_table`` describe each launch and each
rank's place in it; ``launch_durations`` and ``offsets_of`` lay the launches end to end
on the run's wall clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from analysis.document import Note
from analysis.logfile import dict_field, number
from analysis.summary import RankSummary, launch_key, launch_keys


@dataclass(frozen=True)
class Launches:
    """The launches of a run (a resumed run has several), across ranks.

    Attributes:
      keys: ``(start_time, run_id)`` of each launch, in time order; the index is the
        launch's (global) segment number.
      maps: rank -> index of a ``run`` record in that rank's file -> segment number.
    """

    keys: list[tuple]
    maps: dict[int, dict[int, int]]

    @property
    def count(self) -> int:
        return len(self.keys)

    @property
    def last(self) -> int:
        return len(self.keys) - 1

    def to_global(self, rank: int, local: np.ndarray) -> np.ndarray:
        """Segment numbers of ``rank``'s file -> launch numbers."""
        m = self.maps[rank]
        return np.array([m[i] for i in range(len(m))], np.int32)[local]

    def run_records(self, logs: Sequence[RankSummary], segment: int) -> list[tuple[int, dict]]:
        """``(rank, run record)`` of each record of launch ``segment``, in rank order."""
        return [(log.rank, r) for log in logs for i, r in enumerate(log.runs)
                if self.maps[log.rank][i] == segment]


def map_launches(logs: Sequence[RankSummary]) -> Launches:
    """Matches the ``run`` records of all ranks into launches."""
    keys = sorted({key for log in logs for key in launch_keys(log.runs)})
    index = {k: i for i, k in enumerate(keys)}
    maps = {log.rank: {i: index[launch_key(r, i)] for i, r in enumerate(log.runs)}
            for log in logs}
    return Launches(keys=keys, maps=maps)


def _sizes(records: Iterable[dict]) -> list[int]:
    """The ``size`` fields of ``records`` that are numbers."""
    return [int(number(r.get("size"))) for r in records if math.isfinite(number(r.get("size")))]


def _hosts(records: Iterable[tuple[int, dict]]) -> list[str]:
    """Distinct host names of ``(rank, run record)`` pairs, sorted."""
    return sorted({str(r["host"]) for _, r in records if r.get("host") is not None})


@dataclass(frozen=True)
class Identity:
    """Who ran: the size, the hosts and the reference ``run`` record.

    Attributes:
      size: ranks of the run (the largest any launch logged; ``None``: no run record).
      last_runs: rank -> ``run`` record of the last launch.
      run_record: the last launch's record of the lowest rank that has one.
      rank_hosts: rank -> host in the last launch.
      hosts: distinct hosts of the launch that ran on the most (the latest of those).
        Like ``size``, the most any one launch used: a run resumed on a fresh
        allocation of as many nodes never ran on both at once.
    """

    size: int | None
    last_runs: dict[int, dict]
    run_record: dict
    rank_hosts: dict[int, str]
    hosts: list[str]


def identify(logs: Sequence[RankSummary], launches: Launches) -> Identity:
    """The run's size, hosts and reference record, from its ``run`` records."""
    sizes = _sizes(r for log in logs for r in log.runs)
    last_runs = dict(launches.run_records(logs, launches.last))
    rank_hosts = {rank: str(r["host"]) for rank, r in last_runs.items()
                  if r.get("host") is not None}
    hosts: list[str] = []
    for k in range(launches.count):
        launch_hosts = _hosts(launches.run_records(logs, k))
        if len(launch_hosts) >= len(hosts):
            hosts = launch_hosts
    return Identity(size=max(sizes) if sizes else None, last_runs=last_runs,
                    run_record=last_runs[min(last_runs)] if last_runs else {},
                    rank_hosts=rank_hosts, hosts=hosts)


LAUNCH_COLUMNS = ["segment", "start_time", "run_id", "config_hash", "size", "nodes",
                  "ranks_logged", "duration_s"]


def launch_table(logs: Sequence[RankSummary], launches: Launches) -> pd.DataFrame:
    """One row per launch (durations still 0: see ``launch_durations``)."""
    rows = []
    for k, (_, run_id) in enumerate(launches.keys):
        pairs = launches.run_records(logs, k)
        recs = [r for _, r in pairs]
        seg_sizes = _sizes(recs)
        rows.append({"segment": k, "start_time": number(recs[0].get("start_time")),
                     "run_id": run_id,
                     "config_hash": ",".join(sorted({str(r.get("config_hash")) for r in recs})),
                     "size": max(seg_sizes) if seg_sizes else None,
                     "nodes": len(_hosts(pairs)) or None, "ranks_logged": len(recs),
                     "duration_s": 0.0})
    return pd.DataFrame(rows, columns=LAUNCH_COLUMNS)


def launch_notes(segments: pd.DataFrame, label: str) -> list[Note]:
    """Notes on the launches: none at all, or several that differ in config, size or
    nodes."""
    if not len(segments):
        return [Note("warning", label, "no run record in any log; ranks, nodes and dataset "
                     "size are unknown")]
    if len(segments) == 1:
        return []
    notes = [Note("info", label, f"resumed run: {len(segments)} launches; wall-clock time is "
                  "the sum of their durations")]
    if segments["config_hash"].nunique() > 1:
        notes.append(Note("warning", label, "the config changed between launches "
                          f"(config hashes {', '.join(segments['config_hash'])})"))
    if segments["size"].nunique() > 1:
        notes.append(Note("warning", label, "the number of ranks changed between launches "
                          f"({', '.join(map(str, segments['size']))})"))
    if "nodes" in segments and segments["nodes"].nunique() > 1:
        counts = ", ".join("?" if pd.isna(n) else str(int(n)) for n in segments["nodes"])
        notes.append(Note("warning", label, f"the number of nodes changed between launches "
                          f"({counts}); nodes is the most any launch ran on"))
    return notes


def _affinity(threads: dict) -> tuple[int, ...] | None:
    """The CPUs of ``threads.affinity`` (``None``: not logged, or not a list of ints)."""
    cpus = threads.get("affinity")
    if not isinstance(cpus, list) or not all(isinstance(c, int) for c in cpus):
        return None
    return tuple(sorted(set(cpus)))


PLACEMENT_COLUMNS = ["segment", "rank", "host", "local_size", "cores", "cpus", "affinity"]


def placement_table(logs: Sequence[RankSummary], launches: Launches) -> pd.DataFrame:
    """One row per launch and rank: where it ran and on which CPUs (``RunData.placement``)."""
    rows = []
    for k in range(launches.count):
        for rank, rec in launches.run_records(logs, k):
            threads = dict_field(rec, "threads") or {}
            cpus = _affinity(threads)
            rows.append({"segment": k, "rank": rank,
                         "host": None if rec.get("host") is None else str(rec["host"]),
                         "local_size": number(rec.get("local_size")),
                         "cores": number(threads.get("cores")),
                         "cpus": math.nan if cpus is None else float(len(cpus)),
                         "affinity": cpus})
    return pd.DataFrame(rows, columns=PLACEMENT_COLUMNS)


def launch_durations(logs: Sequence[RankSummary], launches: Launches) -> np.ndarray:
    """Seconds each launch lasted: the largest ``t`` any rank logged in it (steps,
    epochs, ends).

    Always at least one entry (0 when there is no launch), so offsets can be taken.
    """
    durations = np.zeros(max(launches.count, 1))
    for log in logs:
        m = launches.maps[log.rank]
        for local, t in log.tmax.items():
            if local in m:
                durations[m[local]] = max(durations[m[local]], t)
    return durations


def offsets_of(durations: np.ndarray) -> np.ndarray:
    """Start of each launch on the run's wall clock: the sum of the earlier durations."""
    return np.concatenate(([0.0], np.cumsum(durations)[:-1]))
