"""The fixed-global-batch study's goals, measured from the study's runs and table: time to the target at
2 vs 1 ranks, the largest fall of the validation Dice, samples to the target at 2, 4
and 8 ranks vs 1, and the gradient noise scale's prediction of a larger batch's
samples (McCandlish et al.; ``analysis.noise``), each row with the numbers behind it."""

from __future__ import annotations

import os
import statistics

from distseg.core import goodput

from benchlib.stateff.study import BATCH, DROP_LIMIT, SAMPLES_PER_EVAL
from benchlib.stateff.summary import find, fmt, ratio


def time_speedups(runs: list[dict], variant: str, scale: str) -> list[tuple[int, float, float]]:
    """(seed, time to target at 1 rank, at 2) of every seed with both real runs."""
    real = {(r["ranks"], r["seed"]): r["time_to_target"] for r in runs
            if (r["backend"], r["scale"], r["variant"]) == ("hvd", scale, variant)}
    return [(s, real[1, s], real[2, s]) for (n, s) in sorted(real)
            if n == 1 and real[1, s] and real.get((2, s))]


def samples_ratios(rows: list[dict], variant: str, scale: str) -> dict[int, float | None]:
    """Samples to target at each rank count > 1 as a multiple of 1 rank's (means over
    seeds, the emulation's where it ran)."""
    ranks = sorted({r["ranks"] for r in rows if r["variant"] == variant and r["ranks"] > 1})
    out = {}
    for n in ranks:
        many = find(rows, variant, n, ("sim", "hvd"), scale)
        one = find(rows, variant, 1, (many["backend"],), scale)
        out[n] = ratio(many["samples_to_target"]["mean"],
                       one["samples_to_target"]["mean"]) if one else None
    return out


def noise_at_target(run: dict, field: str = "b_simple") -> float | None:
    """B_simple (``field``: ``b_simple``, or ``b_simple_adam`` preconditioned) logged
    at the validation where ``run`` first reached the target, else at the latest
    earlier one that has it: ``analysis.noise.measured_near`` on the run's per-epoch
    series (one validation per epoch, every ``SAMPLES_PER_EVAL`` samples)."""
    import pandas as pd

    from analysis import noise
    if run["samples_to_target"] is None:
        return None
    values = list(run.get(field) or [])
    frame = pd.DataFrame({"run": "run", "epoch": range(len(values)),
                          "b_simple": pd.Series(values, dtype=float)})
    row = noise.measured_near(frame, "run", int(run["samples_to_target"] // SAMPLES_PER_EVAL) - 1)
    return None if row is None else float(row["b_simple"])


def noise_predictions(runs: list[dict], base: str, grown: str, scale: str,
                      ranks: int = 8, field: str = "b_simple") -> list[dict]:
    """Per seed: samples to target at ``grown``'s global batch (``ranks`` x BATCH)
    predicted from the run of ``base`` (global batch BATCH, the 1-rank computation) at
    ``ranks`` emulated ranks, which measures B_noise (``field``) from each rank's
    one-slice gradient; beside the samples ``grown`` measured."""
    from analysis.noise import NoisePrior
    pick = {(r["variant"], r["seed"]): r for r in runs
            if r["scale"] == scale and r["ranks"] == ranks and r["backend"] == "sim"}
    out = []
    for (variant, seed), b in sorted(pick.items()):
        g = pick.get((grown, seed))
        b_noise = noise_at_target(b, field)
        if variant != base or g is None or b_noise is None:
            continue
        prior = NoisePrior(b_noise=b_noise, run=f"{base} seed {seed}", epoch=0,
                           base_batch=BATCH, base_samples=b["samples_to_target"])
        out.append({"seed": seed, "b_noise": b_noise, "base_samples": b["samples_to_target"],
                    "predicted": prior.samples(ranks * BATCH), "measured": g["samples_to_target"]})
    return out


def _predicted_over_measured(preds: list[dict]) -> tuple[float | None, list[dict]]:
    both = [p for p in preds if p["measured"] is not None]
    measured = statistics.fmean(p["measured"] for p in both) if both else None
    predicted = statistics.fmean(p["predicted"] for p in both) if both else None
    return ratio(predicted, measured), both


def _prediction_goal(preds: list[dict], base: str, grown: str, adam: list[dict]) -> dict:
    """The goal row of the prediction from the raw B_noise (``b_simple_raw`` in
    distseg-train's log), with the Adam-preconditioned one's beside it."""
    off, both = _predicted_over_measured(preds)
    off_adam, with_adam = _predicted_over_measured(adam)
    measured = statistics.fmean(p["measured"] for p in both) if both else None
    predicted = statistics.fmean(p["predicted"] for p in both) if both else None
    also = "" if off_adam is None else (
        "; from the Adam-preconditioned B_noise (" + ", ".join(f"{p['b_noise']:.1f}" for p in with_adam)
        + f"): {off_adam:.2f}x the measured samples")
    return {"measure": "predicted vs measured samples to target, 8 ranks x 8 slices",
            "goal": "within 25 %", "measured": None if off is None else round(off, 2),
            "met": None if off is None else abs(off - 1) <= 0.25,
            "detail": "" if off is None else
            f"predicted from {base} at 8 emulated ranks x 1 slice (B_noise "
            + ", ".join(f"{p['b_noise']:.1f}" for p in both) + f" at the target), mean of "
            f"{len(both)} seeds: {predicted:.0f} predicted, {measured:.0f} measured ({grown})"
            + also}


def _time_goal(runs: list[dict], timed_variant: str, timed_scale: str) -> dict:
    """Time to the target at 2 vs 1 ranks: the median of the seeds' own ratios."""
    seeds = time_speedups(runs, timed_variant, timed_scale)
    loads = [x for r in runs if (r["backend"], r["scale"], r["variant"])
             == ("hvd", timed_scale, timed_variant) for x in r["load"]]
    speedup = statistics.median(t1 / t2 for _, t1, t2 in seeds) if seeds else None
    return {"measure": "time to validation Dice target, 2 vs 1 ranks", "goal": ">= 1.6",
            "measured": None if speedup is None else round(speedup, 2),
            "met": None if speedup is None else speedup >= 1.6,
            "detail": "" if speedup is None else
            f"{timed_variant} ({timed_scale}), real runs, median of {len(seeds)} seeds: "
            + ", ".join(f"{t1:.1f} s vs {t2:.1f} s" for _, t1, t2 in seeds)
            + f"; load average {min(loads):.0f}-{max(loads):.0f} on {os.cpu_count()} cores"}


def _drop_goal(mine: list[dict], variant: str) -> dict:
    drops = [r["max_drop"] for r in mine]
    return {"measure": "validation Dice never falls > 0.1 between epochs",
            "goal": f"<= {DROP_LIMIT}", "measured": round(max(drops), 3) if drops else None,
            "met": (max(drops) <= DROP_LIMIT) if drops else None,
            "detail": f"largest fall after warm-up between validations every {SAMPLES_PER_EVAL} "
                      f"samples, {variant}, {len(drops)} runs at ranks "
                      f"{','.join(map(str, sorted({r['ranks'] for r in mine})))}"}


def _samples_goal(samples: dict[int, float | None], variant: str) -> dict:
    worst = max((x for x in samples.values() if x is not None), default=None)
    return {"measure": "samples to target at 2, 4 and 8 ranks vs 1", "goal": "<= 1.05",
            "measured": None if worst is None else round(worst, 2),
            "met": None if worst is None else worst <= 1.05,
            "detail": f"{variant}, the largest of " + ", ".join(
                f"{n} ranks {fmt(x)}x" for n, x in samples.items()) + " (means of seeds)"}


def goal_rows(rows: list[dict], runs: list[dict], variant: str,
              scale: str = "small", grown: str = "gn", timed: tuple[str, str] | None = None) -> list[dict]:
    """The fixed-global-batch study's goals, measured for ``variant`` (the recommended default, a fixed
    global batch) at ``scale``, each with the numbers behind it (``detail``); ``grown``:
    the variant whose 8-rank runs (8 slices per rank) the noise scale predicts;
    ``timed``: the (variant, scale) of the real runs timed to the target (default:
    ``variant`` at ``scale``)."""
    timed_variant, timed_scale = timed or (variant, scale)
    rows = [r for r in rows if r["scale"] == scale]
    mine = [r for r in runs if r["scale"] == scale and r["variant"] == variant]
    every = samples_ratios(rows, variant, scale)
    return [
        _time_goal(runs, timed_variant, timed_scale),
        _drop_goal(mine, variant),
        _samples_goal({n: x for n, x in every.items() if n <= BATCH}, variant),
        _prediction_goal(noise_predictions(runs, variant, grown, scale), variant, grown,
                         noise_predictions(runs, variant, grown, scale, field="b_simple_adam")),
        *[past_g_row(runs, variant, scale, n, x) for n, x in every.items() if n > BATCH],
    ]


def past_g_row(runs: list[dict], variant: str, scale: str, ranks: int, measured: float | None) -> dict:
    """Samples to target at ``ranks`` > BATCH (one slice per rank: the global batch
    grows to ``ranks``, with its learning-rate rule) vs 1 rank, beside McCandlish's
    (B_noise + ranks) / (B_noise + BATCH) from the B_noise the 8-rank runs measured near
    the target (raw, and Adam-preconditioned): ``goodput.samples_at`` of one sample at
    BATCH, |G|^2 = 1 and tr(Sigma) = B_noise."""
    at8 = [r for r in runs if (r["backend"], r["scale"], r["variant"], r["ranks"])
           == ("sim", scale, variant, BATCH)]
    predicted = {}
    for field in ("b_simple", "b_simple_adam"):
        b = [x for x in (noise_at_target(r, field) for r in at8) if x is not None]
        predicted[field] = [goodput.samples_at(ranks, BATCH, [(1.0, 1.0, x)]) for x in b]
    text = ", ".join(f"{name} {statistics.fmean(v):.2f}x (B_noise {len(v)} seeds)"
                     for name, v in (("raw", predicted["b_simple"]),
                                     ("Adam-preconditioned", predicted["b_simple_adam"])) if v)
    return {"measure": f"samples to target at {ranks} ranks x 1 slice (global batch grows "
                       f"from {BATCH} to {ranks}) vs 1 rank",
            "goal": "reported", "measured": None if measured is None else round(measured, 2),
            "met": None, "detail": f"{variant}, means of seeds; predicted from the "
                                  f"{BATCH}-rank runs' noise scale: {text or 'none'}"}
