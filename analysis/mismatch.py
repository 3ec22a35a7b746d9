"""Whether the runs of one report can be compared: ``config_mismatches`` warns where
they differ in model, data, input shape or seed (their scaling numbers then compare
different work) and tells, as information, where they differ in the batch per rank,
the loss or the lr.

Read from each run's ``run`` record, else its ``config.json``; a run's input shape
(``analysis.logs.RunData.input_shape``) stands for the fields that follow from it.
"""

from __future__ import annotations

from typing import Sequence

from analysis.coverage import run_fold
from analysis.document import Note
from analysis.logfile import dict_field
from analysis.logs import RunData
from analysis.tables import shape_text

#: Fields of the run record's ``model`` and ``dataset`` that follow from the input
#: size (a 3D run's slab): runs that differ in size are told apart once, by their
#: ``input shape``, not again by these.
SIZE_FIELDS = {"model": ("input_shape", "image_size"),
               "data": ("slab", "train_slabs", "val_slabs", "padded_cases"),
               # a 3D run's samples are slabs, so their counts follow from the slab too
               "data3d": ("samples", "train_samples", "val_samples", "test_samples")}

#: Signature keys whose difference is a warning, and what it means; others are info.
NOT_COMPARABLE = {
    "model": "their scaling numbers are not comparable",
    "data": "their scaling numbers are not comparable",
    "global seed": "their scaling numbers are not comparable",
    "input shape": ("their samples/s, times per epoch and scaling numbers are not "
                    "comparable; compare their voxels/s per rank (Throughput against "
                    "input size)"),
}


def _without(obj: object, keys: Sequence[str]) -> object:
    return {k: v for k, v in obj.items() if k not in keys} if isinstance(obj, dict) else obj


def _signature(run: RunData) -> dict[str, object]:
    """What must agree across runs of one study: model, data, input shape and seed."""
    rec, cfg = run.run_record, run.config or {}
    model = dict_field(rec, "model")
    if model is None:
        model = cfg.get("model")
    data = dict_field(rec, "dataset")
    if data is None:
        data = cfg.get("data")
    data = _without(data, ("path",))
    if run.input_shape is not None:
        model = _without(model, SIZE_FIELDS["model"])
        data = _without(data, SIZE_FIELDS["data"]
                        + (SIZE_FIELDS["data3d"] if len(run.input_shape) == 3 else ()))
    seed = rec.get("global_seed", (cfg.get("train") or {}).get("seed"))
    train = cfg.get("train") or {}
    return {"model": model, "data": data, "input shape": shape_text(run.input_shape),
            "global seed": seed,
            "batch size per rank": rec.get("batch_size", train.get("batch_size")),
            "loss": train.get("loss"), "lr_scaling": train.get("lr_scaling"),
            "base lr": rec.get("lr_base", train.get("lr"))}


def _describe(a: object, b: object) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        return ", ".join(f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in keys[:4])
    return f"{a!r} vs {b!r}"


def config_mismatches(runs: Sequence[RunData]) -> list[Note]:
    """Warns when runs of different model, data, input shape or seed are compared
    (``NOT_COMPARABLE``; info for the other differences). The folds of a
    cross-validation train different cases by design: runs are compared with the runs of
    their own fold (config ``data.fold``; runs without one, with each other)."""
    folds: dict[int, list[RunData]] = {}
    for run in runs:
        folds.setdefault(run_fold(run), []).append(run)
    return [note for group in folds.values() for note in _mismatches(group)]


def _mismatches(runs: Sequence[RunData]) -> list[Note]:
    """``config_mismatches`` within one group of runs, each against the first."""
    if len(runs) < 2:
        return []
    notes = []
    sigs = [_signature(r) for r in runs]
    first = sigs[0]
    for key in first:
        meaning = NOT_COMPARABLE.get(key)
        for run, sig in zip(runs[1:], sigs[1:]):
            if sig[key] is None or first[key] is None or sig[key] == first[key]:
                continue
            what = (f"{first[key]} vs {sig[key]}" if key == "input shape"
                    else _describe(first[key], sig[key]))
            notes.append(Note("warning" if meaning else "info", "runs",
                              f"{runs[0].label} and {run.label} differ in {key}: {what}"
                              + (f"; {meaning}" if meaning else "")))
    return notes
