"""The report's figures, drawn headless with matplotlib's Agg backend.

Each function takes the frames of ``analysis.tables`` and writes one PNG; nothing here
computes a number that is not already in a table, so the plots and CSVs agree.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # headless: no display on cluster nodes or in CI

import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.document import HOURS, TimeUnit  # noqa: E402

#: Train curves longer than this are thinned for drawing (the CSV keeps every point).
MAX_POINTS = 20_000


def _label(run: str, ranks, nodes) -> str:
    nodes = "?" if nodes is None or pd.isna(nodes) else int(nodes)
    return f"{run} ({int(ranks)} rank{'s' if int(ranks) != 1 else ''}, {nodes} node{'s' if nodes != 1 else ''})"


def _draw_curves(ax, curves: pd.DataFrame, smooth: int) -> None:
    """One colour per run: train loss (line, or faint raw + smoothed) and validation loss."""
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (run, g) in enumerate(curves.groupby("run", sort=False)):
        color = colors[i % len(colors)]
        label = _label(run, g["ranks"].iloc[0], g["nodes"].iloc[0])
        train = g[g["series"] == "train"]
        if len(train):
            step = max(1, len(train) // MAX_POINTS)
            thin = train.iloc[::step]
            if smooth > 1:
                ax.plot(thin["x"], thin["loss"], color=color, alpha=0.25, lw=0.8)
                ax.plot(thin["x"], thin["loss_smoothed"], color=color, lw=1.6,
                        label=f"{label} train (mean of {smooth} steps)")
            else:
                ax.plot(thin["x"], thin["loss"], color=color, lw=1.4, label=f"{label} train")
        val = g[(g["series"] == "val") & g["loss"].notna()]
        if len(val):
            ax.plot(val["x"], val["loss"], color=color, ls="--", marker="o", ms=4, lw=1,
                    label=f"{label} validation")


def _draw_targets(ax, curves: pd.DataFrame, targets: Sequence[float]) -> None:
    """Target lines; targets far outside the curves would squash them: only named."""
    losses = pd.concat([curves["loss"], curves["loss_smoothed"]]).astype(float)
    losses = losses[np.isfinite(losses)]
    low, high = (float(losses.min()), float(losses.max())) if len(losses) else (-1.0, 0.0)
    pad = max(high - low, 0.05)
    styles = [":", "-.", (0, (5, 2)), (0, (1, 3))]
    for i, target in enumerate(targets):
        inside = low - pad <= target <= high + pad
        ax.axhline(target, color="0.35", ls=styles[i % len(styles)], lw=1,
                   label=f"target loss {target:g}" + ("" if inside else " (off the axis)"))
        if inside:
            low, high = min(low, target), max(high, target)
    if len(losses):
        ax.set_ylim(low - 0.05 * pad, high + 0.05 * pad)
        ax.set_xlim(left=0)


def loss_figure(curves: pd.DataFrame, targets: Sequence[float] = (), smooth: int = 0,
                unit: TimeUnit = HOURS):
    """The loss-versus-time figure (a matplotlib ``Figure``; the caller closes it).

    The x axis is wall-clock time in ``unit`` (the frame's ``hours`` converted;
    ``report.report_unit`` picks the unit that fits the longest run).
    """
    curves = curves.assign(x=unit.of(curves["hours"].astype(float) * 3600.0))
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    _draw_curves(ax, curves, smooth)
    _draw_targets(ax, curves, targets)
    ax.set_xlabel(f"wall-clock time ({unit.word})")
    ax.set_ylabel("loss (negative mean soft Dice; -1 is perfect)")
    ax.set_title("Loss versus wall-clock time")
    ax.grid(True, alpha=0.3)
    if ax.has_data():
        ax.legend(fontsize=8, loc="upper right")
    else:
        ax.text(0.5, 0.5, "no loss records", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    return fig


def _written(fig, path: str) -> str:
    """Saves ``fig`` to ``path``, closes it and returns ``path``."""
    fig.savefig(path)
    plt.close(fig)
    return path


def loss_vs_time(curves: pd.DataFrame, path: str, targets: Sequence[float] = (),
                 smooth: int = 0, unit: TimeUnit = HOURS) -> str:
    """Training loss (line) and validation loss (markers) against wall-clock time in
    ``unit``, written to ``path`` (``loss_figure``)."""
    fig = loss_figure(curves, targets, smooth, unit)
    return _written(fig, path)


def val_dice_spread(spread: pd.DataFrame, path: str, classes: Sequence[str]) -> str:
    """Per class: median of the ranks' validation Dice per epoch with a min-max band."""
    panels = [c for c in classes if c in set(spread["class"])] or ["mean_foreground"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 1, 4.2), dpi=110,
                             squeeze=False, sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    runs = list(dict.fromkeys(spread["run"]))
    for ax, cls in zip(axes[0], panels):
        for i, run in enumerate(runs):
            g = spread[(spread["run"] == run) & (spread["class"] == cls)].sort_values("epoch")
            if not len(g):
                continue
            color = colors[i % len(colors)]
            ax.fill_between(g["epoch"], g["min"], g["max"], color=color, alpha=0.2, lw=0)
            ax.plot(g["epoch"], g["median"], color=color, marker="o", ms=3, lw=1.4,
                    label=f"{run}: rank median, min-max band")
            if g["global"].notna().any():
                ax.plot(g["epoch"], g["global"], color=color, ls=":", lw=1)
        ax.set_title(cls.replace("_", " "))
        ax.set_xlabel("epoch")
        ax.grid(True, alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0][0].set_ylabel("validation Dice (per rank's shard)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        axes[0][-1].legend(handles, labels, fontsize=7, loc="lower right")
    else:
        axes[0][0].text(0.5, 0.5, "no validation Dice", ha="center", va="center",
                        transform=axes[0][0].transAxes)
    fig.suptitle("Validation Dice across ranks (dotted: global Dice)")
    fig.tight_layout()
    return _written(fig, path)


def _rank_axis(ax, table: pd.DataFrame) -> None:
    """Ranks on a log2 axis, each tick naming the nodes of the runs with that many."""
    ticks = sorted(set(table["ranks"].astype(int)))
    labels = []
    for r in ticks:
        nodes = sorted({int(n) for n in table.loc[table["ranks"] == r, "nodes"].dropna()})
        labels.append(f"{r}\n({'/'.join(map(str, nodes)) or '?'} node"
                      f"{'s' if nodes != [1] else ''})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, labels)
    ax.minorticks_off()
    ax.set_xlabel("ranks (nodes)")
    ax.grid(True, alpha=0.3)


def _draw_efficiency(axes, g: pd.DataFrame, color, label: str) -> None:
    """One target: statistical efficiency (left) and samples (right) against ranks;
    bounds of targets not reached as hollow triangles (pointing where the value lies)."""
    g = g.sort_values("ranks")
    exact = g[np.isfinite(g["statistical_efficiency"].astype(float))]
    axes[0].plot(exact["ranks"], exact["statistical_efficiency"], color=color, marker="o",
                 lw=1.4, label=label)
    reached = g[g["reached"].astype(bool)]
    axes[1].plot(reached["ranks"], reached["samples"].astype(float), color=color, marker="o",
                 lw=1.4, label=label)
    for _, row in g.iterrows():
        text = str(row["statistical_efficiency_text"])
        if text[:1] in "<>":
            axes[0].plot(row["ranks"], float(text[2:]), ls="none", mfc="none", color=color,
                         marker="v" if text[0] == "<" else "^", ms=8)
        if not row["reached"] and np.isfinite(float(row["samples_lower_bound"])):
            axes[1].plot(row["ranks"], float(row["samples_lower_bound"]), ls="none", mfc="none",
                         color=color, marker="^", ms=8)


def efficiency_figure(table: pd.DataFrame):
    """Statistical efficiency and samples to target against ranks, one colour per
    target (a matplotlib ``Figure``; the caller closes it)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    groups = table.groupby(["metric", "target"], sort=False)
    for i, ((metric, target), g) in enumerate(groups):
        op = ">=" if str(metric).startswith("val_dice") else "<="
        _draw_efficiency(axes, g, colors[i % len(colors)], f"{metric} {op} {target:g}")
    axes[0].axhline(1.0, color="0.5", ls="--", lw=1)
    axes[0].set_ylabel(f"statistical efficiency (vs {table['base'].iloc[0]})")
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylabel("samples to target (all ranks)")
    axes[1].set_ylim(bottom=0)
    for ax in axes:
        _rank_axis(ax, table)
    axes[0].legend(fontsize=7, loc="lower left")
    fig.suptitle("Statistical efficiency and samples to target (hollow: bound, not reached)")
    fig.tight_layout()
    return fig


def statistical_efficiency(table: pd.DataFrame, path: str) -> str:
    """``efficiency_figure`` of ``stateff.efficiency_table``, written to ``path``."""
    fig = efficiency_figure(table)
    return _written(fig, path)


def _size_axis(ax, table: pd.DataFrame) -> None:
    """Voxels per sample on a log2 axis, each tick naming the input shape(s) of that size."""
    ticks = sorted(set(table["voxels_per_sample"].astype(float)))
    labels = []
    for v in ticks:
        shapes = table.loc[table["voxels_per_sample"] == v, "input_shape"].dropna()
        labels.append("/".join(dict.fromkeys(shapes)) or f"{v:,.0f}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, labels, rotation=30 if len(ticks) > 4 else 0)
    ax.minorticks_off()
    ax.set_xlabel("input size (voxels per sample, log scale)")


def size_figure(table: pd.DataFrame):
    """Voxels per second per rank against voxels per sample, one line per model and
    rank count (a matplotlib ``Figure``; the caller closes it)."""
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    keyed = table.assign(_model=table["model"].fillna("model not logged"))
    for i, ((model, ranks), g) in enumerate(keyed.groupby(["_model", "ranks"], sort=False)):
        g = g.sort_values("voxels_per_sample")
        ax.plot(g["voxels_per_sample"].astype(float),
                g["throughput_voxels_per_rank"].astype(float), color=colors[i % len(colors)],
                marker="o", lw=1.4, label=f"{model}, {int(ranks)} rank{'s' if ranks != 1 else ''}")
    _size_axis(ax, table)
    ax.margins(x=0.08)
    ax.set_ylabel("voxels per second per rank")
    ax.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
    top = table["throughput_voxels_per_rank"].astype(float).max()
    ax.set_ylim(0, top * 1.1 if np.isfinite(top) and top > 0 else 1)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title("Training throughput against input size (steady epochs)")
    fig.tight_layout()
    return fig


def throughput_vs_size(table: pd.DataFrame, path: str) -> str:
    """``size_figure`` of ``tables.throughput_vs_size``, written to ``path``."""
    fig = size_figure(table)
    return _written(fig, path)


def noise_figure(series: pd.DataFrame):
    """B_simple at the end of each epoch against samples trained, one line per run
    that measured it, shaded over its 90 % interval where the log has one above 0 and
    bounded, its global batch dotted (a matplotlib ``Figure``; the caller closes it)."""
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = series[np.isfinite(series["b_simple"].astype(float))
                   & np.isfinite(series["samples"].astype(float))]
    for i, (run, g) in enumerate(drawn.groupby("run", sort=False)):
        color = colors[i % len(colors)]
        batch = g["global_batch_size"].iloc[0]
        label = _label(run, g["ranks"].iloc[0], g["nodes"].iloc[0])
        ax.plot(g["samples"].astype(float), g["b_simple"].astype(float), color=color,
                marker="o", ms=3, lw=1.4,
                label=label + ("" if pd.isna(batch) else f", global batch {int(batch)}"))
        _shade_interval(ax, g, color)
        if not pd.isna(batch):
            ax.axhline(float(batch), color=color, ls=":", lw=1)
    ax.set_yscale("log")
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis(matplotlib.ticker.StrMethodFormatter("{x:,.4g}"))  # 6, not 6 x 10^0
    return _finished(fig, ax, "samples trained (all ranks)",
                     "B_simple = tr(Sigma) / |G|^2 (samples)",
                     "Gradient noise scale over training (dotted: each run's global batch)")


def _shade_interval(ax, run: pd.DataFrame, color) -> None:
    """B_simple's 90 % interval, on the epochs of ``run`` that logged one bounded on
    both sides (a lower end of 0 has no place on the log scale)."""
    low, high = (pd.to_numeric(run.get(c, pd.Series(np.nan, index=run.index)), errors="coerce")
                 .to_numpy(dtype=float) for c in ("b_simple_low", "b_simple_high"))
    known = np.isfinite(low) & np.isfinite(high) & (low > 0)
    if known.any():
        ax.fill_between(run["samples"].astype(float).to_numpy()[known], low[known],
                        high[known], color=color, alpha=0.15, lw=0)


def _finished(fig, ax, xlabel: str, ylabel: str, title: str):
    """``fig`` with its one axes labelled, gridded and (where it drew) given a legend."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3, which="both")
    if ax.has_data():
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def noise_scale(series: pd.DataFrame, path: str) -> str:
    """``noise_figure`` of ``noise.series``, written to ``path``."""
    return _written(noise_figure(series), path)


def lr_find_figure(curves: pd.DataFrame):
    """Each run's range test: the loss against the lr (log scale), its two-way smoothing
    and the lr chosen (dashed) (a matplotlib ``Figure``; the caller closes it)."""
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (run, g) in enumerate(curves.groupby("run", sort=False)):
        color, chosen = colors[i % len(colors)], float(g["chosen_lr"].iloc[0])
        ax.plot(g["lr"], g["loss"], color=color, lw=0.8, alpha=0.4)
        ax.plot(g["lr"], g["smoothed"], color=color, lw=1.6,
                label=f"{run} ({int(g['ranks'].iloc[0])} rank(s)): chose {chosen:.3g}")
        ax.axvline(chosen, color=color, ls="--", lw=1)
    ax.set_xscale("log")
    return _finished(fig, ax, "learning rate (base, before the lr rule's scaling)",
                     "training loss of the global batch",
                     "Learning-rate range test (--lr auto): thin raw, thick smoothed, dashed chosen")


def lr_find(curves: pd.DataFrame, path: str) -> str:
    """``lr_find_figure`` of ``lrrange.table``, written to ``path``."""
    return _written(lr_find_figure(curves), path)


def _hours_axis(ax, table: pd.DataFrame) -> None:
    """Ranks on a log2 axis, each tick naming its nodes (measured runs of one node may
    differ in ranks, so ranks place them; the label says the nodes)."""
    ticks = sorted(set(table["ranks"].astype(int)))
    labels = []
    for r in ticks:
        nodes = sorted({int(n) for n in table.loc[table["ranks"] == r, "nodes"].dropna()})
        labels.append(f"{'/'.join(map(str, nodes)) or '?'}\n({r} rank{'s' if r != 1 else ''})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, labels, fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("nodes (ranks)")
    ax.grid(True, alpha=0.3, which="both")


def _draw_hours(ax, g: pd.DataFrame, color, goal: str, unit: TimeUnit) -> None:
    """One target: predicted time (line, hollow circles), measured wall clock (filled
    squares) and measured training time (crosses) against ranks."""
    g = g.sort_values("ranks", kind="stable")
    for column, style, what in (("predicted_hours", dict(marker="o", mfc="none", lw=1.4),
                                 "predicted (training)"),
                                ("measured_hours", dict(marker="s", ls="none", ms=7),
                                 "measured (wall clock)"),
                                ("measured_train_hours", dict(marker="x", ls="none", ms=8),
                                 "measured (training)")):
        rows = g[np.isfinite(g[column].astype(float))]
        if len(rows):
            ax.plot(rows["ranks"], unit.of(rows[column].astype(float) * 3600.0), color=color,
                    label=f"{goal}: {what}", **style)


def hours_figure(table: pd.DataFrame, unit: TimeUnit = HOURS):
    """Predicted time to each target against node count and the measured time where a
    run ran at that count, one colour per target with a time (a matplotlib ``Figure``;
    the caller closes it). ``table``: ``project.node_rows``."""
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    times = table[["predicted_hours", "measured_hours", "measured_train_hours"]].astype(float)
    drawn = table[table["metric"].notna() & np.isfinite(times).any(axis=1)]
    for i, ((metric, target), g) in enumerate(drawn.groupby(["metric", "target"], sort=False)):
        op = ">=" if str(metric).startswith("val_dice") else "<="
        _draw_hours(ax, g, colors[i % len(colors)], f"{metric} {op} {target:g}", unit)
    _hours_axis(ax, table)
    ax.set_yscale("log")
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis(matplotlib.ticker.StrMethodFormatter("{x:,.4g}"))
    ax.set_ylabel(f"time to target ({unit.word})")
    ax.set_title("Predicted time to target against node count (model, not measured; "
                 "filled: measured)", fontsize=10)
    if ax.has_data():
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def predicted_hours(table: pd.DataFrame, path: str, unit: TimeUnit = HOURS) -> str:
    """``hours_figure`` of ``project.node_rows``, written to ``path``."""
    return _written(hours_figure(table, unit), path)
