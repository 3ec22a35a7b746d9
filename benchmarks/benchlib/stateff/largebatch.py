"""The large-batch study's large-batch rows: global batches 8 to 64 (and 32 ranks x 1 to 8 slices)
in the step-exact emulation, from the study's scored runs. No TensorFlow.

  the sweep        samples to target per global batch B and lr rule: ``sqrt``
                   (``gbatch-gn``), ``gain`` (``gbatch-gn-gain``) and the fixed
                   multipliers of ``study.MULTIPLIERS`` (``gbatch-gn-x*``);
  the prediction   samples to target at B from the B = 8 run's per-epoch noise scale,
                   ``goodput.samples_at`` (Pollux), against the ``sqrt`` runs;
  goodput vs fixed projected time to target at 32 ranks: the goodput policy
                   (``gbatch-gn-goodput``) against each fixed per-rank batch b (the
                   ``sqrt`` run of global batch 32 b), each step costing the seconds of
                   its per-rank batch at the measured per-rank throughput.

A run's "ranks" is the number of ranks of one slice it stands for: ``gbatch-gn`` at 64
ranks is global batch 64, which is also 32 ranks x 2 slices (the same batches and lr).
"""

from __future__ import annotations

from distseg.core import goodput

from benchlib.stateff.study import BATCH, MULTIPLIERS
from benchlib.stateff.summary import fmt, ratio

RULES = {"sqrt": "gbatch-gn", "gain": "gbatch-gn-gain",
         **{name: f"gbatch-gn-{name}" for name in MULTIPLIERS}}
"""Rule (column of the sweep) -> the variant that runs it."""
BATCHES = (16, 32, 64)
"""The global batches past the base of the sweep and the prediction."""
POLICY_RANKS = 32
"""The ranks of the goodput policy's comparison."""
FIXED_PER_RANK = (1, 2, 4, 8)
"""The fixed per-rank batches the policy is compared with (at ``POLICY_RANKS``)."""


def pick(runs: list[dict], variant: str, ranks: int, seed: int) -> dict | None:
    """The emulated run of ``variant`` at ``ranks`` and ``seed``, or None."""
    return next((r for r in runs if (r["backend"], r["variant"], r["ranks"], r["seed"])
                 == ("sim", variant, ranks, seed)), None)


def samples(run: dict | None) -> float | None:
    return None if run is None else run["samples_to_target"]


def trained(run: dict | None) -> float | None:
    """The samples ``run`` trained in all (its budget, where it never reached the target)."""
    return run["cum_samples"][-1] if run and run["cum_samples"] else None


def sweep(runs: list[dict], seed: int) -> dict[int, dict[str, float | None]]:
    """Samples to target per global batch (8 and ``BATCHES``) and rule at ``seed``; a
    rule not run is absent, one that did not reach the target is None."""
    out = {}
    for b in (BATCH, *BATCHES):
        got = {rule: pick(runs, v, b, seed) for rule, v in RULES.items()}
        out[b] = {rule: samples(r) for rule, r in got.items() if r is not None}
    return out


def history(run: dict) -> list[tuple[float, float | None, float | None]]:
    """``goodput.samples_at``'s history of ``run`` up to the validation that reached the
    target: per validation the samples trained since the last one and the
    preconditioned |G|^2 and tr(Sigma) logged there."""
    cum = [s for s in run["cum_samples"] if s <= (run["samples_to_target"] or s)]
    noise = run["noise"][:len(cum)]
    return [(s - prev, (n or {}).get("g2"), (n or {}).get("tr_sigma"))
            for s, prev, n in zip(cum, [0, *cum], noise)]


def predictions(runs: list[dict], seed: int) -> list[dict]:
    """Per B in ``BATCHES``: the samples to target predicted from the B = 8 run (8 ranks x
    1 slice, ``gbatch-gn``) of ``seed`` and those the ``sqrt`` run measured."""
    base = pick(runs, RULES["sqrt"], BATCH, seed)
    if base is None or base["samples_to_target"] is None or not base.get("noise"):
        return []
    past = history(base)
    out = []
    for b in BATCHES:
        run = pick(runs, RULES["sqrt"], b, seed)
        out.append({"seed": seed, "batch": b, "base_samples": base["samples_to_target"],
                    "predicted": goodput.samples_at(b, BATCH, past), "measured": samples(run),
                    "trained": trained(run)})
    return out


def projected_seconds(stretches: list[tuple[float, int]], ranks: int,
                      step_seconds: dict[int, float]) -> float:
    """Time of a run at ``ranks`` ranks from its (samples, per-rank batch) stretches:
    each step of a stretch costs ``step_seconds`` at its per-rank batch."""
    return sum(n / (ranks * b) * step_seconds[b] for n, b in stretches)


def policy_stretches(run: dict) -> list[tuple[float, int]]:
    """(samples, per-rank batch) of each validation interval of the goodput policy's run
    up to the target."""
    cum = [s for s in run["cum_samples"] if s <= run["samples_to_target"]]
    return [(s - prev, b) for s, prev, b in zip(cum, [0, *cum], run["per_rank"])]


def goodput_vs_fixed(runs: list[dict], seed: int, step_seconds: dict[int, float]) -> dict | None:
    """Projected seconds to target at ``POLICY_RANKS`` ranks: the goodput policy's run and
    each fixed per-rank batch's (None: not reached or not run), and their ratio to the
    best fixed one; None without the policy's run."""
    policy = pick(runs, "gbatch-gn-goodput", POLICY_RANKS, seed)
    if policy is None:
        return None
    fixed, beyond = {}, {}
    for b in FIXED_PER_RANK:
        run = pick(runs, RULES["sqrt"], POLICY_RANKS * b, seed)
        n = samples(run)
        fixed[b] = None if n is None else projected_seconds([(n, b)], POLICY_RANKS, step_seconds)
        if run is not None and n is None:  # not reached: at least the time of what it trained
            beyond[b] = projected_seconds([(trained(run), b)], POLICY_RANKS, step_seconds)
    mine = None if policy["samples_to_target"] is None else \
        projected_seconds(policy_stretches(policy), POLICY_RANKS, step_seconds)
    best = min((t for t in fixed.values() if t is not None), default=None)
    return {"seed": seed, "policy": mine, "policy_samples": policy["samples_to_target"],
            "policy_per_rank": policy["per_rank"], "fixed": fixed, "not_reached_after": beyond,
            "vs_best": ratio(mine, best)}


def prediction_row(preds: list[dict]) -> dict:
    """Predicted / measured at each (seed, B); met if every one is within 25 %."""
    pairs = [(p["seed"], p["batch"], ratio(p["predicted"], p["measured"])) for p in preds]
    known = [x for _, _, x in pairs if x is not None]
    worst = max(known, key=lambda x: abs(x - 1), default=None)
    return {"measure": "predicted / measured samples to target at B = 16, 32, 64 from the "
                       "B = 8 run (goodput.samples_at), sqrt rule",
            "goal": "within 25 % at each", "measured": None if worst is None else round(worst, 2),
            "met": None if not pairs else all(x is not None and abs(x - 1) <= 0.25 for _, _, x in pairs),
            "detail": "; ".join(f"seed {s} B={b}: {p['predicted']:.0f} / " + (
                f"{p['measured']} = {fmt(x)}" if x is not None else
                f"not reached in {fmt(p['trained'])}") for (s, b, x), p in zip(pairs, preds))}


def gain_row(tables: dict[int, dict]) -> dict:
    """The gain rule's samples over the best fixed multiplier's (``sqrt`` is one: x
    sqrt(B/8) from the first step), at each B and seed that has both; met if every one
    is at most 1.10 (a gain run that never reached the target counts as failing)."""
    cells = []
    for seed, table in tables.items():
        for b in BATCHES:
            row = table.get(b, {})
            fixed = [row[m] for m in (*MULTIPLIERS, "sqrt") if row.get(m) is not None]
            if "gain" in row and fixed:
                cells.append((seed, b, ratio(row["gain"], min(fixed))))
    worst = max((x for _, _, x in cells if x is not None), default=None)
    return {"measure": "gain rule: samples to target / best fixed lr multiplier, B = 16, 32, 64",
            "goal": "<= 1.10 at each", "measured": None if worst is None else round(worst, 2),
            "met": None if not cells else all(x is not None and x <= 1.10 for _, _, x in cells),
            "detail": "; ".join(f"seed {s} B={b}: {fmt(x) if x is not None else 'gain not reached'}"
                                for s, b, x in cells)}


def default_row(runs: list[dict], seeds: list[int]) -> dict:
    """Samples to target at 16 and 32 ranks (global batch grown, sqrt) vs 1 rank, the
    mean over seeds; met if <= 1.25 and <= 1.6 and every seed reached the target."""
    out, texts, every = {}, [], True
    for ranks, limit in ((16, 1.25), (32, 1.6)):
        many = [samples(pick(runs, RULES["sqrt"], ranks, s)) for s in seeds]
        one = [samples(pick(runs, RULES["sqrt"], 1, s)) for s in seeds]
        every &= all(x is not None for x in many + one)
        got = [(m, o) for m, o in zip(many, one) if m is not None and o is not None]
        out[ranks] = ratio(sum(m for m, _ in got), sum(o for _, o in got)) if got else None
        texts.append(f"{ranks} ranks {fmt(out[ranks])}x (seeds {seeds}: "
                     + ", ".join(f"{fmt(m)} vs {fmt(o)}" for m, o in zip(many, one)) + ")")
    met = every and all(x is not None for x in out.values()) and out[16] <= 1.25 and out[32] <= 1.6
    return {"measure": "samples to target at 16 and 32 ranks vs 1 rank, default policy "
                       "(grown batch, sqrt)",
            "goal": "<= 1.25; <= 1.6, every seed reaches the target",
            "measured": f"{fmt(out[16])}; {fmt(out[32])}", "met": met, "detail": "; ".join(texts)}


def goodput_row(compared: list[dict]) -> dict:
    """The goodput policy's projected time to target / the best fixed per-rank batch's."""
    known = [c["vs_best"] for c in compared if c["vs_best"] is not None]
    worst = max(known, default=None)
    return {"measure": f"goodput policy at {POLICY_RANKS} emulated ranks: projected time to "
                       "target / best fixed per-rank batch of {1, 2, 4, 8}",
            "goal": "<= 0.85", "measured": None if worst is None else round(worst, 2),
            "met": None if not compared else len(known) == len(compared) and worst <= 0.85,
            "detail": "; ".join(
                f"seed {c['seed']}: policy {_seconds(c['policy'], None)} ({fmt(c['policy_samples'])} "
                f"samples, per-rank {c['policy_per_rank']}), fixed " + ", ".join(
                    f"{b}: {_seconds(t, c['not_reached_after'].get(b))}" for b, t in c["fixed"].items())
                for c in compared)}


def rows(runs: list[dict], seeds: list[int], step_seconds: dict[int, float]) -> tuple[list[dict], dict]:
    """(the large-batch study's goal rows, the numbers behind them for the results file)."""
    tables = {s: sweep(runs, s) for s in seeds}
    preds = [p for s in seeds for p in predictions(runs, s)]
    compared = [c for c in (goodput_vs_fixed(runs, s, step_seconds) for s in seeds) if c]
    goal = [prediction_row(preds), gain_row(tables), default_row(runs, seeds), goodput_row(compared)]
    return goal, {"sweep": tables, "predictions": preds, "goodput_vs_fixed": compared,
                  "step_seconds": step_seconds}


def print_sweep(tables: dict[int, dict]) -> None:
    """The sweep as a table per seed: samples to target per global batch and rule."""
    names = list(RULES)
    print("seed   B  " + " ".join(f"{n:>7s}" for n in names))
    for seed, table in tables.items():
        for b, row in table.items():
            cells = [("-" if n not in row else "n/r" if row[n] is None else f"{row[n]:.0f}")
                     for n in names]
            print(f"{seed:4d} {b:3d}  " + " ".join(f"{c:>7s}" for c in cells))


def _cell(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _seconds(t: float | None, beyond: float | None) -> str:
    """Projected seconds to target; "> s" for a run that did not reach it in s."""
    return f"{t:.1f} s" if t is not None else f"not reached (> {beyond:.1f} s)" if beyond else "not run"


def markdown(large: dict) -> str:
    """The large-batch study's tables as Markdown, for docs/statistical-efficiency.md: the sweep (a
    rule not run: blank; not reached: "n/r"), the predictions, goodput vs fixed."""
    names = list(RULES)
    lines = ["| seed | B | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for seed, table in large["sweep"].items():
        for b, row in table.items():
            lines.append(f"| {seed} | {b} | " + " | ".join(
                "" if n not in row else "n/r" if row[n] is None else f"{row[n]:,.0f}"
                for n in names) + " |")
    lines += ["", "| seed | B | B = 8 samples | predicted | measured (sqrt) | predicted / measured |",
              "|---|---|---|---|---|---|"]
    for p in large["predictions"]:
        measured = _cell(p["measured"]) if p["measured"] or not p["trained"] else \
            f"not reached in {p['trained']:,}"
        lines.append(f"| {p['seed']} | {p['batch']} | {p['base_samples']:,} | {_cell(p['predicted'])} "
                     f"| {measured} | {fmt(ratio(p['predicted'], p['measured']))} |")
    lines += ["", "| seed | policy: s (samples; per-rank batch by validation) | "
              + " | ".join(f"fixed {b}: s" for b in FIXED_PER_RANK) + " | policy / best fixed |",
              "|---" * (len(FIXED_PER_RANK) + 3) + "|"]
    for c in large["goodput_vs_fixed"]:
        lines.append(f"| {c['seed']} | {_seconds(c['policy'], None)} ({_cell(c['policy_samples'])}; "
                     f"{' '.join(map(str, c['policy_per_rank']))}) | "
                     + " | ".join(_seconds(c["fixed"][b], c["not_reached_after"].get(b))
                                  for b in FIXED_PER_RANK)
                     + f" | {fmt(c['vs_best'])} |")
    return "\n".join(lines)
