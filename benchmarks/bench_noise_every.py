"""The noise scale on every k-th step (``--noise-every``) against every step, in one run
of this script: what the statistics cost and what the estimate reads.

For each rank count, runs of the demo preset with ``--noise-every 1`` and ``auto``,
interleaved round by round (the machine is shared and noisy). Per run it prints:

- **cost**: the measuring steps' extra time as a share of the run's training steps,
  from the run's own step records (median step time of the measuring steps minus that
  of the others, times the measuring steps after the first, over the sum of every
  step's time after the first): side by side in one run, so the machine's drift
  between runs does not enter;
- the cadence ``auto`` took, and the share its decision predicted;
- **estimate**: the final preconditioned B_simple of each run (they train the same
  steps up to rounding), and the every-step run's logged norms replayed through
  ``training.noise.NoiseScale`` keeping only every k-th step, for the k auto took and
  for 4, 8, 16 and 32: the same trajectory, so the difference is the cadence's alone.

    python benchmarks/bench_noise_every.py --ranks 1,2 --repeat 2
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from distseg.training import noise  # noqa: E402

from benchlib import launch, machine  # noqa: E402
from benchlib.args import add_precision, add_results_dir, workload_parser  # noqa: E402
from benchlib.runlogs import rank_records  # noqa: E402

REPLAY_EVERY = (4, 8, 16, 32)
"""Cadences replayed on the every-step run's norms beside the one auto took."""


def cost_share(steps: list[dict]) -> dict:
    """The measuring steps' extra time over one rank's training steps (the first, which
    traces, left out): {measured_s, plain_s (medians), measuring, steps, share}."""
    timed = steps[1:]
    measured = [r["step_time"] for r in timed if "grad_sq" in r]
    plain = [r["step_time"] for r in timed if "grad_sq" not in r]
    if not measured or not plain:
        return {"measuring": len(measured), "steps": len(timed), "share": None}
    m, p = statistics.median(measured), statistics.median(plain)
    total = sum(r["step_time"] for r in timed)
    return {"measured_s": m, "plain_s": p, "measuring": len(measured), "steps": len(timed),
            "share": max(m - p, 0.0) * len(measured) / total}


def replayed(steps: list[dict], epoch_record: dict, every: int,
             offset: int = 0) -> noise.NoiseScale:
    """The every-step run's norms averaged as a run would, keeping only the global steps
    ``offset``, ``offset + every``, ... (each standing for ``every`` steps)."""
    ns = epoch_record["noise_scale"]
    # The record's small_batch is the samples behind each small gradient: half the
    # rank's batch where one rank takes it as two halves.
    halves = ns["method"] == "halves"
    scale = noise.NoiseScale(ns["small_batch"] * (2 if halves else 1), ns["big_batch"],
                             ns["base_batch"], gradients_per_rank=2 if halves else 1)
    for r in steps:
        if "grad_sq" in r and r["global_step"] % every == offset:
            scale.update(*r["grad_sq"], steps=every)
    return scale


def replay(steps: list[dict], epoch_record: dict, every: int, offset: int = 0) -> float | None:
    """The preconditioned B_simple of ``replayed``."""
    return replayed(steps, epoch_record, every, offset).b_simple


def interval_check(steps: list[dict], epoch_record: dict, every: int, want: float) -> dict:
    """At each offset of ``every``: whether the 90 % interval the replayed run would log
    (``noise.Average.b_simple_interval``) holds ``want``, the every-step estimate, and
    its ends relative to ``want`` (high None: open above; ``none``: offsets with too few
    measured steps for an interval)."""
    out = {"held": 0, "offsets": every, "open_above": 0, "none": 0, "low": [], "high": []}
    for offset in range(every):
        interval = replayed(steps, epoch_record, every, offset).averages[
            "preconditioned"].b_simple_interval()
        if interval is None:
            out["none"] += 1
            continue
        low, high = interval
        out["held"] += low <= want and (high is None or want <= high)
        out["open_above"] += high is None
        out["low"].append(low / want - 1)
        out["high"].append(None if high is None else high / want - 1)
    return out


def replay_spread(steps: list[dict], epoch_record: dict, every: int) -> list[float | None]:
    """``replay`` at every offset: how far apart the estimates of ``every``-th steps are
    from one another on the same run."""
    return [replay(steps, epoch_record, every, offset) for offset in range(every)]


def one_run(args, ranks: int, cadence: str, work: str, key: str) -> dict:
    run_dir = os.path.join(work, key)
    flags = ["--preset", "demo", "--data", args.data, "--epochs", str(args.epochs),
             "--precision", args.precision, "--compression", "none", "--noise-every", cadence,
             "--no-tensorboard"]
    launch.run_train(launch.train_command(flags, run_dir, ranks=ranks, threads=args.threads), key)
    records = rank_records(run_dir, ranks)[0]
    steps = [r for r in records if r["type"] == "step"]
    epochs = [r for r in records if r["type"] == "epoch"]
    row = {"ranks": ranks, "cadence": cadence, "cost": cost_share(steps),
           "every": epochs[-1]["noise_scale"]["cadence"]["every"],
           "decision": epochs[-1]["noise_scale"]["cadence"]["decision"],
           "b_simple": epochs[-1]["noise_scale"]["b_simple"],
           "logged_interval": [epochs[-1]["noise_scale"].get(k) for k in
                               ("b_simple_low", "b_simple_high", "effective_steps")]}
    if cadence == "1":
        assert _close(replay(steps, epochs[-1], 1), row["b_simple"]), "the replay is not the run's"
        row["replayed"] = {k: replay(steps, epochs[-1], k) for k in REPLAY_EVERY}
        row["replayed_offsets"] = {k: replay_spread(steps, epochs[-1], k) for k in REPLAY_EVERY}
        row["intervals"] = {k: interval_check(steps, epochs[-1], k, row["b_simple"])
                            for k in (1, *REPLAY_EVERY)}
        row["steps"] = steps
        row["last_epoch"] = epochs[-1]
    return row


def summarise(rows: list[dict]) -> list[dict]:
    """Per rank count: medians of the cost, the cadence auto took, and each estimate
    against the every-step run's of the same round."""
    out = []
    for ranks in sorted({r["ranks"] for r in rows}):
        mine = [r for r in rows if r["ranks"] == ranks]
        every1 = [r for r in mine if r["cadence"] == "1"]
        auto = [r for r in mine if r["cadence"] == "auto"]
        for one, a in zip(every1, auto):  # the replay at auto's own k
            a["replayed_at_auto"] = replay(one["steps"], one["last_epoch"], a["every"])
        out.append({
            "ranks": ranks,
            "auto_every": [a["every"] for a in auto],
            "auto_cost": [a["cost"]["share"] for a in auto],
            "every1_cost": [o["cost"]["share"] for o in every1],
            "b_simple_every1": [o["b_simple"] for o in every1],
            "b_simple_auto": [a["b_simple"] for a in auto],
            "replay_auto_vs_every1": [_rel(a["replayed_at_auto"], o["b_simple"])
                                      for o, a in zip(every1, auto)],
            "replay": {k: [_rel(o["replayed"][k], o["b_simple"]) for o in every1]
                       for k in REPLAY_EVERY},
            "replay_offsets": {k: [_rel(x, every1[0]["b_simple"])
                                   for x in every1[0]["replayed_offsets"][k]]
                               for k in REPLAY_EVERY} if every1 else {},
            "auto_vs_every1": [_rel(a["b_simple"], o["b_simple"]) for o, a in zip(every1, auto)],
            "auto_interval": [a["logged_interval"] for a in auto],
            "every1_interval": [o["logged_interval"] for o in every1],
            "intervals": every1[0]["intervals"] if every1 else {},
        })
    return out


def _close(x: float | None, ref: float | None) -> bool:
    return x is not None and ref is not None and abs(x - ref) <= 1e-6 * abs(ref)


def _rel(x: float | None, ref: float | None) -> float | None:
    return None if x is None or not ref else x / ref - 1


def _fmt(values, spec: str) -> str:
    return ", ".join("-" if v is None else format(v, spec) for v in values)


def print_summary(summary: list[dict]) -> None:
    print("\n| ranks | auto's k | cost, auto | cost, every step | B_simple every step | "
          "B_simple auto | auto vs every step | replay at auto's k |")
    print("|---|---|---|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['ranks']} | {_fmt(s['auto_every'], 'd')} | {_fmt(s['auto_cost'], '.2%')} | "
              f"{_fmt(s['every1_cost'], '.2%')} | {_fmt(s['b_simple_every1'], '.1f')} | "
              f"{_fmt(s['b_simple_auto'], '.1f')} | {_fmt(s['auto_vs_every1'], '+.1%')} | "
              f"{_fmt(s['replay_auto_vs_every1'], '+.1%')} |")
    print("\nthe every-step run's norms replayed at every k-th step, against its own estimate"
          " (first round; each offset 0..k-1: min, median, max):")
    for s in summary:
        for k, rel in s["replay_offsets"].items():
            got = sorted(r for r in rel if r is not None)
            if got:
                print(f"  {s['ranks']} rank(s), k={k}: {got[0]:+.1%}, "
                      f"{statistics.median(got):+.1%}, {got[-1]:+.1%}")
    print_intervals(summary)


def print_intervals(summary: list[dict]) -> None:
    """The 90 % intervals: as the runs logged them, and the replayed ones' hold on the
    every-step estimate."""
    print("\nthe 90 % interval of B_simple as logged at the end ([low, high, effective steps]):")
    for s in summary:
        print(f"  {s['ranks']} rank(s): every step {s['every1_interval']}, auto {s['auto_interval']}")
    print("replayed at every k-th step (first round): offsets whose interval holds the every-"
          "step estimate; median ends relative to it; offsets open above")
    for s in summary:
        for k, c in s["intervals"].items():
            highs = [h for h in c["high"] if h is not None]
            low = statistics.median(c["low"]) if c["low"] else None
            high = statistics.median(highs) if highs else None
            print(f"  {s['ranks']} rank(s), k={k}: held {c['held']}/{c['offsets']}, "
                  f"[{_fmt([low], '+.0%')}, {_fmt([high], '+.0%')}], open above "
                  f"{c['open_above']}, no interval {c['none']}")


def main(argv=None) -> int:
    p = add_results_dir(add_precision(workload_parser(__doc__, epochs=8, batch_size=False)))
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--repeat", type=int, default=2, help="interleaved rounds")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for r in range(args.repeat):
            for ranks in map(int, args.ranks.split(",")):
                for cadence in ("1", "auto"):
                    row = one_run(args, ranks, cadence, work, f"r{r}-np{ranks}-{cadence}")
                    print(f"round {r + 1}: {ranks} rank(s), --noise-every {cadence}: k "
                          f"{row['every']}, cost {row['cost']['share']}, B_simple "
                          f"{row['b_simple']}", flush=True)
                    rows.append(row)
        summary = summarise(rows)
    for row in rows:
        row.pop("steps", None)
        row.pop("last_epoch", None)
    print_summary(summary)
    path = launch.write_result({"benchmark": "bench_noise_every", "args": vars(args),
                                "machine": machine.describe(ROOT, {"intra_op": args.threads,
                                                                   "inter_op": 1}),
                                "rows": rows, "summary": summary},
                               args.results_dir, "noise-every")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
