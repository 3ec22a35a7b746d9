"""The study's table: mean and spread over seeds per (back-end, scale, variant,
ranks), with the ratios to 1 rank; printed, and as Markdown for
docs/statistical-efficiency.md."""

from __future__ import annotations

import statistics


def mean_spread(values: list) -> dict:
    """Mean, min and max of the values that are not None, and how many were None
    (runs that never reached the target)."""
    got = [v for v in values if v is not None]
    return {"mean": statistics.fmean(got) if got else None, "min": min(got, default=None),
            "max": max(got, default=None), "n": len(got), "missing": len(values) - len(got)}


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def fmt(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def table(runs: list[dict]) -> list[dict]:
    """Mean and spread over seeds per (backend, scale, variant, ranks), with the
    samples to target as a multiple of the same variant's at 1 rank (1.0: no samples
    lost to the larger batch) and the speed-up of the time to target (1 rank's / N's)."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["backend"], r["scale"], r["variant"], r["ranks"]), []).append(r)
    out = []
    for (backend, scale, variant, ranks), rs in groups.items():
        row = {"backend": backend, "scale": scale, "variant": variant, "ranks": ranks,
               "seeds": [r["seed"] for r in rs]}
        for k in ("samples_to_target", "time_to_target", "max_drop", "max_drop_per_pass",
                  "final_dice", "throughput"):
            row[k] = mean_spread([r[k] for r in rs])
        one = groups.get((backend, scale, variant, 1))
        if one:
            row["samples_vs_1"] = ratio(row["samples_to_target"]["mean"],
                                        mean_spread([r["samples_to_target"] for r in one])["mean"])
            row["time_speedup"] = ratio(mean_spread([r["time_to_target"] for r in one])["mean"],
                                        row["time_to_target"]["mean"])
        out.append(row)
    return out


def find(rows: list[dict], variant: str, ranks: int, backends=("hvd", "sim"),
         scale: str = "small") -> dict | None:
    """The table row of ``variant`` at ``ranks``, from the first back-end that has it."""
    for b in backends:
        for r in rows:
            if (r["backend"], r["scale"], r["variant"], r["ranks"]) == (b, scale, variant, ranks):
                return r
    return None


def spread_text(m: dict, digits: int = 0) -> str:
    if m["mean"] is None:
        return f"not reached ({m['missing']})"
    text = f"{m['mean']:.{digits}f} [{m['min']:.{digits}f}-{m['max']:.{digits}f}]"
    return text + (f" +{m['missing']} not reached" if m["missing"] else "")


def print_table(rows: list[dict]) -> None:
    print(f"{'backend':7s} {'scale':5s} {'variant':17s} {'np':>3s}  {'samples to target':28s} "
          f"{'x 1np':>6s}  {'time to target s':22s} {'speedup':>7s}  {'max drop':17s} "
          f"{'final Dice':17s}")
    for r in sorted(rows, key=lambda r: (r["backend"], r["scale"], r["variant"], r["ranks"])):
        time_text = "-" if r["backend"] == "sim" else spread_text(r["time_to_target"], 1)
        print(f"{r['backend']:7s} {r['scale']:5s} {r['variant']:17s} {r['ranks']:3d}  "
              f"{spread_text(r['samples_to_target']):28s} {fmt(r.get('samples_vs_1')):>6s}  "
              f"{time_text:22s} {fmt(r.get('time_speedup')):>7s}  "
              f"{spread_text(r['max_drop'], 2):17s} {spread_text(r['final_dice'], 3):17s}")


def markdown_table(rows: list[dict]) -> str:
    """The table as Markdown, for docs/statistical-efficiency.md."""
    lines = ["| variant | back-end | ranks | seeds | samples to target | x 1 rank | time to target s "
             "| speed-up | largest drop | final Dice |", "|---" * 10 + "|"]
    for r in sorted(rows, key=lambda r: (r["scale"], r["variant"], r["backend"], r["ranks"])):
        time_text = "-" if r["backend"] == "sim" else spread_text(r["time_to_target"], 1)
        lines.append(
            f"| {r['variant']} | {r['backend']} | {r['ranks']} | {len(r['seeds'])} | "
            f"{spread_text(r['samples_to_target'])} | {fmt(r.get('samples_vs_1'))} | {time_text} | "
            f"{fmt(r.get('time_speedup'))} | {fmt(r['max_drop']['max'])} | "
            f"{spread_text(r['final_dice'], 2)} |")
    return "\n".join(lines)
