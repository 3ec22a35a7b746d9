"""The link between the ranks, as each run measured it, and the link the projection's
allreduce model runs on.

Every run of 2 or more ranks logs, in its ``run`` record, ``link``: the ring model
t(n) = 2 (R - 1) alpha + 2 (R - 1) / R x n / bandwidth fitted to allreduces of growing
sizes timed at its start (``distseg.core.link``), and ``local``, whether every rank was
on one host. A local link is the host's own path (shared memory or loopback), not a
network. ``link_table`` lists them, one row per run (older logs: not measured);
``choose`` picks the projection's ``Fabric``: the options given, else the link a run
measured between hosts (the median over such runs), else the assumed defaults. Each row
also says how the run's gradients travelled over that link and why (``compression``:
its run record's ``compression_decision``, where ``--compression auto`` predicted the
step with and without fp16 on the link it measured).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from analysis.logfile import count, dict_field, number
from analysis.logs import RunData
from analysis.stepmodel import Fabric
from distseg.core.link import VALUE_BYTES, gradient_bytes, ring_bytes, sync_seconds

LINK_COLUMNS = ["run", "ranks", "hosts", "local", "link", "bandwidth_gbps", "latency_us",
                "sizes_timed", "largest_bytes", "largest_s", "largest_gbps",
                "traced_steps", "traced_allreduce_s", "modelled_allreduce_s", "traced_wait_s",
                "compression", "compression_reason", "note"]
#: ``link`` of a run whose ranks were all on one host.
OWN_PATH = "the host's own path (not a network)"
NOT_MEASURED = "not measured"


def _hosts(run: RunData) -> int | None:
    """Distinct hosts of the last launch (whose run record holds the link)."""
    if not len(run.segments) or pd.isna(run.segments["nodes"].iloc[-1]):
        return run.nodes
    return int(run.segments["nodes"].iloc[-1])


def _unmeasured(run: RunData, ranks: int | None) -> tuple[str, str]:
    """``(link, note)`` of a run record without a fitted link."""
    if ranks is not None and ranks < 2:
        return "none (1 rank)", "one rank: nothing to allreduce with"
    if "link" not in run.run_record:
        return NOT_MEASURED, "older logs: the run record has no link"
    return NOT_MEASURED, "the run record's link is null"


def _largest(value: dict, ranks: int) -> dict:
    """The largest size timed, its seconds and the rate it saw (Gbit/s through each
    rank's link, latency included)."""
    sizes, seconds = value.get("bytes"), value.get("seconds")
    if not (isinstance(sizes, list) and isinstance(seconds, list) and sizes
            and len(sizes) == len(seconds)):
        return {"sizes_timed": 0}
    n, t = max(zip(map(number, sizes), map(number, seconds)))
    rate = ring_bytes(n, ranks) * 8 / t / 1e9 if t > 0 and ranks >= 2 else math.nan
    return {"sizes_timed": len(sizes), "largest_bytes": n, "largest_s": t, "largest_gbps": rate}


def _fit_note(value: dict, local: bool) -> str:
    if "bandwidth_gbps" not in value:
        return "fewer than 2 sizes timed: nothing fitted"
    if not number(value.get("bandwidth_gbps")) > 0:
        return "no bandwidth fitted: the time did not grow with the size"
    return ("ranks of one host: shared memory or loopback, not what a run across hosts "
            "meets" if local else "")


def compression(run: RunData) -> dict:
    """``{compression, compression_reason}``: how the run's gradients travelled, and why
    (its run record's ``compression_decision``; an older run's config.json, if any)."""
    decision = dict_field(run.run_record, "compression_decision")
    if decision and decision.get("choice") in VALUE_BYTES:
        asked = decision.get("requested")
        shown = f"{decision['choice']} ({asked})" if asked == "auto" else decision["choice"]
        return {"compression": shown,
                "compression_reason": str(decision.get("reason") or "named by the run's config")}
    train = dict_field(run.config or {}, "train") or {}
    if train.get("compression") in VALUE_BYTES:
        return {"compression": train["compression"],
                "compression_reason": "config.json (the run record has no decision)"}
    return {"compression": "", "compression_reason": ""}


def traced(run: RunData, ranks: int, bandwidth: float, latency: float) -> dict:
    """The traced epoch's medians (rank 0's ``comm``, the last one logged): the
    gradients' allreduce per step beside the one the measured link models for the
    logged gradient bytes (float16 where the run compressed them), and the waits for
    the other ranks before the allreduces."""
    e = run.epochs
    if "comm_gradient_s" not in e or not e["comm_gradient_s"].notna().any():
        return {}
    last = e[e["comm_gradient_s"].notna()].iloc[-1]
    params = count((dict_field(run.run_record, "model") or {}).get("params"))
    used = compression(run)["compression"].split(" ")[0] or "none"
    modelled = (sync_seconds(gradient_bytes(params, used), ranks, bandwidth, latency)
                if params and bandwidth > 0 and ranks >= 2 else math.nan)
    return {"traced_steps": count(last.get("comm_steps")),
            "traced_allreduce_s": float(last["comm_gradient_s"]),
            "modelled_allreduce_s": modelled,
            "traced_wait_s": float(np.nansum([last.get("comm_gradient_wait_s"),
                                               last.get("comm_small_wait_s")]))}


def link_row(run: RunData) -> dict:
    """One row of ``LINK_COLUMNS`` from the run record of the run's last launch."""
    rec = run.run_record
    value = rec.get("link")
    ranks = count(value.get("ranks")) if isinstance(value, dict) else None
    ranks = ranks or count(rec.get("size")) or run.ranks
    row = {"run": run.label, "ranks": ranks, "hosts": _hosts(run), **compression(run)}
    if not isinstance(value, dict):
        link, note = _unmeasured(run, ranks)
        return {**row, "link": link, "note": note}
    local = value.get("local")
    local = bool(local) if isinstance(local, bool) else row["hosts"] == 1
    bandwidth = number(value.get("bandwidth_gbps"))
    latency = number(value.get("latency_us"))
    return {**row, "local": local,
            "link": OWN_PATH if local else f"network between {row['hosts']} hosts",
            "bandwidth_gbps": bandwidth if bandwidth > 0 else math.nan,
            "latency_us": latency, **_largest(value, ranks or 0),
            **traced(run, ranks or 0, bandwidth, latency), "note": _fit_note(value, local)}


def link_table(runs: Sequence[RunData]) -> pd.DataFrame:
    """The measured link of each run (``LINK_COLUMNS``; a run without one says why)."""
    out = pd.DataFrame([link_row(r) for r in runs], columns=LINK_COLUMNS)
    for c in ("ranks", "hosts", "sizes_timed", "largest_bytes", "traced_steps"):
        out[c] = pd.to_numeric(out[c]).astype("Int64")
    out["local"] = out["local"].astype("boolean")
    return out


def between_hosts(table: pd.DataFrame) -> pd.DataFrame:
    """The rows whose link is a network between hosts with a fitted bandwidth: what a
    projection across nodes may use."""
    if not len(table):
        return table
    network = table["local"].eq(False).fillna(False).astype(bool)
    return table[network & (table["bandwidth_gbps"].astype(float) > 0)]


@dataclass(frozen=True)
class LinkChoice:
    """The link the projection's allreduce model runs on.

    Attributes:
      fabric: its bandwidth, latency and latency term.
      lines: the assumption lines that say where each value comes from (the first
        ``MEASURED``, ``GIVEN`` or ``ASSUMED``) and which measured links are not used.
      runs: the runs whose measured link it uses (none: given or assumed).
    """

    fabric: Fabric
    lines: tuple[str, ...]
    runs: tuple[str, ...] = ()


def _runs_text(used: pd.DataFrame) -> str:
    """``from run net, 4 ranks on 2 hosts`` or ``the median of runs a (...), b (...)``."""
    if len(used) == 1:
        r = used.iloc[0]
        return f"from run {r['run']}, {r['ranks']} ranks on {r['hosts']} hosts"
    named = [f"{r['run']} ({r['ranks']} ranks on {r['hosts']} hosts)" for _, r in used.iterrows()]
    return f"the median of runs {', '.join(named[:-1])} and {named[-1]}"


def _source(given: float | None, measured: float | None, default: float,
            option: str) -> tuple[float, str, str]:
    """A value of the link, where it comes from (``GIVEN``, ``MEASURED``, ``ASSUMED``)
    and what says so: the option, the measurement, the default."""
    if given is not None:
        return given, "GIVEN", f" ({option})"
    if measured is not None:
        return measured, "MEASURED", ""
    return default, "ASSUMED", " (default)"


def _source_line(fabric: Fabric, sources: Sequence[tuple[str, str]], used: pd.DataFrame,
                 measured: tuple[float, float] | None) -> str:
    """The first line of ``LinkChoice.lines``: the link and where each value comes from."""
    (b_kind, b_why), (l_kind, l_why) = sources
    b = f"B = {fabric.bandwidth_gbps:.4g} Gb/s"
    lat = f"latency = {fabric.latency_us:.4g} us per message"
    head = (f"{b_kind} link: {b}{b_why}, {lat}{l_why}" if b_kind == l_kind
            else f"Link: {b} {b_kind}{b_why}, {lat} {l_kind}{l_why}")
    if measured is None:
        return (f"{head}: no run measured a link between hosts (a run of 2 or more ranks on "
                "more than one host logs one at its start; links.csv)."
                + (" The default B is an EDR InfiniBand or Omni-Path class fabric."
                   if b_kind == "ASSUMED" else ""))
    how = "allreduces timed at the run's start, ring model fitted; links.csv"
    if "MEASURED" in (b_kind, l_kind):
        return f"{head}, {_runs_text(used)} ({how})."
    return (f"{head}; the options win over the link measured {_runs_text(used)} (B = "
            f"{measured[0]:.4g} Gb/s, latency = {measured[1]:.4g} us; {how}).")


def _unused_lines(table: pd.DataFrame, used: pd.DataFrame) -> list[str]:
    """Why measured links the projection does not use are left out."""
    local = table[table["local"].eq(True).fillna(False).astype(bool)] if len(table) else table
    unfitted = table[table["local"].eq(False).fillna(False).astype(bool)
                     & ~table["run"].isin(used["run"])] if len(table) else table
    lines = []
    if len(local):
        names = ", ".join(f"{r['run']} ({r['ranks']} ranks)" for _, r in local.iterrows())
        lines.append(f"Not used for the projection across nodes: the link {names} measured "
                     "on one host, the host's own path (shared memory or loopback), not a "
                     "network; a run across nodes allreduces over the network between hosts, "
                     "which such a link would make look far faster than it is.")
    if len(unfitted):
        lines.append(f"Not used: {', '.join(unfitted['run'])} measured a link between hosts "
                     "without a fitted bandwidth (links.csv says why).")
    return lines


def choose(table: pd.DataFrame, bandwidth_gbps: float | None = None,
           latency_us: float | None = None, latency_term: str = "ring") -> LinkChoice:
    """The projection's link: each of ``bandwidth_gbps`` and ``latency_us`` given wins;
    the other comes from the links measured between hosts (``between_hosts`` of the
    ``link_table``: the median over those runs), else from ``Fabric``'s defaults,
    flagged ASSUMED. A link measured on one host is never used: it is not a network."""
    used = between_hosts(table)
    measured = ((statistics.median(used["bandwidth_gbps"].astype(float)),
                 statistics.median(used["latency_us"].astype(float).fillna(0.0)))
                if len(used) else None)
    default = Fabric()
    bw, *bw_source = _source(bandwidth_gbps, measured and measured[0],
                             default.bandwidth_gbps, "--bandwidth-gbps")
    lat, *lat_source = _source(latency_us, measured and measured[1], default.latency_us,
                               "--latency-us")
    fabric = Fabric(bw, lat, latency_term)
    sources = (tuple(bw_source), tuple(lat_source))
    uses = "MEASURED" in (bw_source[0], lat_source[0])
    return LinkChoice(fabric, (_source_line(fabric, sources, used, measured),
                               *_unused_lines(table, used)),
                      tuple(used["run"]) if uses else ())
