"""What ``distseg-predict`` reports: ``metrics.csv``, the terminal table and the overlays
of the best, median and worst cases.

Results are ``predict.Result`` objects (``name``, ``output``, ``seconds``, ``scores``:
one ``metrics.ClassScore`` per foreground class, or None without labels). Plain numpy
and matplotlib: no TensorFlow.
"""

from __future__ import annotations

import csv
import math
import os

import numpy as np

from distseg import metrics
from distseg.data.convert import geometry, sources
from distseg.data.convert.intensity import Intensity

OVERLAY_PICKS = ("best", "median", "worst")
#: Truth and prediction contour colours per foreground class (1, 2, ...).
TRUTH_COLOURS = ("#00e000", "#00c8ff", "#ffd000", "#ffffff")
PRED_COLOURS = ("#ff2020", "#ff40ff", "#ff8c00", "#a0a0ff")



def class_columns(class_names) -> list[str]:
    cols = []
    for name in class_names[1:]:
        cols += [f"dice_{name}", f"hd95_mm_{name}", f"nsd_{name}", f"voxels_true_{name}",
                 f"voxels_pred_{name}"]
    return cols


def write_csv(path: str, results: list, class_names, tolerance_mm: float) -> None:
    """One row per scored case, then a ``mean`` row (see ``metrics.mean_scores``)."""
    scored = [r for r in results if r.scores is not None]
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["case", "seconds", "tolerance_mm"] + class_columns(class_names))
        for r in scored:
            row = [r.name, f"{r.seconds:.2f}", tolerance_mm]
            for s in r.scores:
                row += [_num(s.dice), _num(s.hd95), _num(s.nsd), s.true_voxels, s.pred_voxels]
            out.writerow(row)
        row = ["mean", "", tolerance_mm]
        for m in metrics.mean_scores([r.scores for r in scored]):
            row += [_num(m["dice"]), _num(m["hd95"]), _num(m["nsd"]), "", ""]
        out.writerow(row)


def _num(v: float) -> str:
    return "nan" if math.isnan(v) else "inf" if math.isinf(v) else f"{v:.4f}"


def table_lines(results: list, class_names, tolerance_mm: float) -> list[str]:
    """The terminal table: every scored case (the best, median and worst of more than
    20), then the mean; Dice / HD95 mm / NSD per class."""
    scored = ranked(results)
    if not scored:
        return []
    names = class_names[1:]
    head = f"{'case':<24}" + "".join(f"{n[:10] + ' Dice':>16}{'HD95 mm':>9}{'NSD':>7}" for n in names)
    lines = [f"metrics (NSD at {tolerance_mm:g} mm):", head]
    shown = scored if len(scored) <= 20 else [scored[i] for i in _pick_indices(len(scored))]
    for r in shown:
        lines.append(f"{r.name[:24]:<24}" + "".join(
            f"{_num(s.dice):>16}{_num(s.hd95):>9}{_num(s.nsd):>7}" for s in r.scores))
    means = metrics.mean_scores([r.scores for r in scored])
    lines.append(f"{'mean of ' + str(len(scored)):<24}" + "".join(
        f"{_num(m['dice']):>16}{_num(m['hd95']):>9}{_num(m['nsd']):>7}" for m in means))
    return lines


def ranked(results: list) -> list:
    """Scored cases from the best foreground Dice to the worst (NaN last, then name)."""
    scored = [r for r in results if r.scores is not None]
    def key(r):
        d = metrics.foreground_dice(r.scores)
        return (math.isnan(d), -d if not math.isnan(d) else 0.0, r.name)
    return sorted(scored, key=key)


def _pick_indices(n: int) -> list[int]:
    return sorted({0, (n - 1) // 2, n - 1})


def overlay_picks(results: list) -> dict:
    """The best, median and worst scored cases (fewer when there are fewer cases)."""
    order = ranked(results)
    picks: dict = {}
    for pick, i in zip(OVERLAY_PICKS, (0, (len(order) - 1) // 2, len(order) - 1)):
        if order and order[i] not in picks.values():  # one picture per case
            picks[pick] = order[i]
    return picks


def _focus(truth: np.ndarray, pred: np.ndarray) -> tuple[int, int, int]:
    """Slice-layout voxel the overlay cuts through: the centre of the truth's last
    (lesion) class, else the prediction's, else any foreground, else the middle."""
    top = int(max(truth.max(), pred.max(), 1))
    for mask in (truth == top, pred == top, truth > 0, pred > 0):
        if mask.any():
            idx = np.argwhere(mask)
            centre = idx.mean(axis=0)
            nearest = idx[np.argmin(((idx - centre) ** 2).sum(axis=1))]  # a voxel in the mask
            return tuple(int(v) for v in nearest)
    return tuple(s // 2 for s in truth.shape)


def render_overlay(path: str, image: np.ndarray, truth: np.ndarray, pred: np.ndarray,
                   spacing, class_names, title: str) -> None:
    """Axial, coronal and sagittal slices through the lesion (slice-layout arrays,
    ``spacing`` (slice, row, column) mm): truth in solid, prediction in dashed contours,
    one colour pair per class."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    z, y, x = _focus(truth, pred)
    dz, dy, dx = spacing
    views = [  # (name, image, truth, pred, aspect = row spacing / column spacing)
        ("axial", image[z], truth[z], pred[z], dy / dx),
        ("coronal", image[::-1, y, :], truth[::-1, y, :], pred[::-1, y, :], dz / dx),
        ("sagittal", image[::-1, :, x], truth[::-1, :, x], pred[::-1, :, x], dz / dy),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.8))
    for ax, (name, img, t, p, aspect) in zip(axes, views):
        ax.imshow(img, cmap="gray", vmin=0, vmax=1, aspect=aspect, interpolation="nearest")
        for c in range(1, len(class_names)):
            for mask, colour, style in ((t, TRUTH_COLOURS, "solid"), (p, PRED_COLOURS, "dashed")):
                if (mask == c).any():
                    ax.contour(mask == c, levels=[0.5], colors=[colour[(c - 1) % len(colour)]],
                               linewidths=1.2, linestyles=style)
        ax.set_title(name)
        ax.axis("off")
    handles = []
    for c in range(1, len(class_names)):
        handles.append(Line2D([], [], color=TRUTH_COLOURS[(c - 1) % 4], label=f"{class_names[c]} truth"))
        handles.append(Line2D([], [], color=PRED_COLOURS[(c - 1) % 4], linestyle="dashed",
                              label=f"{class_names[c]} prediction"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def draw_overlay(pick: str, result, scan, prep, out_dir: str, class_names) -> str:
    """Reads the case's scan, truth and prediction back and renders its overlay PNG
    (``result``, ``scan``, ``prep``: ``predict.Result``, ``scans.Scan``,
    ``predict.Preprocessing``)."""
    first = prep.channel if prep.channel is not None else 0  # shown: the (first) channel
    img, (voxels,) = sources.case_channels(scan.files, first)
    intensity = prep.intensity
    if intensity.kind == "zscore":  # shown in [0, 1]: the first channel's percentiles
        intensity = Intensity.mr()
    volume = intensity.normaliser(voxels, intensity.bounds(voxels))(voxels.raw)
    truth = sources.label_array(sources.load(scan.label), scan.label)
    pred = sources.label_array(sources.load(result.output), result.output)
    ornt = geometry.ornt_of(img.affine)
    dice = ", ".join(f"{n} {_num(s.dice)}" for n, s in zip(class_names[1:], result.scores))
    path = os.path.join(out_dir, "overlays", f"{pick}_{result.name}.png")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    render_overlay(path, geometry.to_slices(volume, ornt), geometry.to_slices(truth, ornt),
                   geometry.to_slices(pred, ornt), geometry.slice_spacing(img.affine, ornt),
                   class_names, f"{pick}: {result.name} (Dice {dice})")
    return path
