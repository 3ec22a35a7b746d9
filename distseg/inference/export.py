"""``distseg-predict --export DIR``: a trained run as a Keras model file that loads
without distseg, and the input convention beside it.

distseg's U-Net uses its own layers for training speed and memory (``FusedBatchNorm``,
``GroupNorm``, ``ConvUnit`` for ``--recompute``, bfloat16 policies): a ``.keras`` file of
that model would need distseg to load. The export builds an inference twin from the
one U-Net builder with Keras' own normalisation layers (``BatchNormalization`` and
``GroupNormalization``: the same weights, names and inference results), without
recomputation and in float32, copies the checkpoint's weights into it, and saves it.
``keras.models.load_model(DIR/model.keras)`` then needs nothing but Keras.

``DIR/model.json`` says what the model takes and gives (``convention``): spatial
dimensions, the input shape and window, channels-last layout, dtype, the intensity
window or normalisation and the slice layout of the training data, class names, and
that the output holds softmax probabilities over the classes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil

import numpy as np

from distseg import sliding
from distseg.core import config as config_lib
from distseg.core import rundir
from distseg.core.errors import InputError, output_dir
from distseg.data.convert import geometry
from distseg.inference import postprocess, predict

MODEL_FILE = "model.keras"
CONVENTION_FILE = "model.json"
FORMAT = "distseg-export"
FORMAT_VERSION = 1


@contextlib.contextmanager
def keras_norm_layers():
    """While open, the U-Net builder makes Keras' own normalisation layers."""
    import keras

    from distseg.networks import unet
    original = dict(unet.NORM_LAYERS)
    unet.NORM_LAYERS.update(batch=keras.layers.BatchNormalization,
                            group=keras.layers.GroupNormalization,
                            instance=keras.layers.GroupNormalization)
    try:
        yield
    finally:
        unet.NORM_LAYERS.clear()
        unet.NORM_LAYERS.update(original)


def inference_twin(model_cfg: config_lib.ModelConfig, input_shape, run_dir: str = "",
                   name: str = "unet"):
    """The network of ``model_cfg`` for ``input_shape`` in float32. distseg's U-Net is
    built of Keras layers only: Keras' normalisation layers, no recomputation, and no
    BatchNorm ghost batches (a training-time rule: inference normalises with the moving
    statistics, which Keras' BatchNormalization would refuse the option for). A
    ``--model-fn`` model is the researcher's own layers, from the run's source."""
    from distseg.networks import models
    plain = dataclasses.replace(model_cfg, recompute=False, precision="float32",
                                bn_ghost_batch=0)
    if model_cfg.fn:
        return models.build(plain, input_shape, run_dir=run_dir, name=name)
    with keras_norm_layers():
        return models.build(plain, input_shape, name=name)


def ensemble_model(twins):
    """One plain Keras model of ``twins`` (inference twins of one input shape, each of a
    distinct name): each sees the input, and the output is the mean of their softmax
    probabilities, as ``ensemble.averaged`` averages them in ``distseg-predict``."""
    import keras
    image = keras.Input(shape=tuple(twins[0].input_shape[1:]), name="image", dtype="float32")
    probs = keras.layers.Average(name="probs")([twin(image) for twin in twins])
    return keras.Model(image, probs, name="ensemble")


def copy_weights(source, twin) -> None:
    """Copies every weight of ``source`` into ``twin``, in the builder's order (a
    ``ConvUnit`` creates its variables in the plain model's order).

    Raises:
      ValueError: the models' weights differ in count, kind or shape.
    """
    src, dst = source.weights, twin.weights
    if len(src) != len(dst):
        raise ValueError(f"the twin has {len(dst)} weights, the model {len(src)}")
    for s, d in zip(src, dst):
        if s.shape != d.shape or s.name != d.name:
            raise ValueError(f"weight {s.path} {tuple(s.shape)} does not match the twin's "
                             f"{d.path} {tuple(d.shape)}")
        d.assign(np.asarray(s.numpy(), dtype=np.float32))


def convention(cfg: config_lib.Config, known: predict.TrainingData, window, overlap: float,
               run_dir: str, epoch: int) -> dict:
    """What ``DIR/model.json`` holds: how to make the model's input from a scan and
    what its output means."""
    import keras
    import tensorflow as tf
    prep, dims = known.prep, cfg.model.spatial_dims
    spatial = list(window[1:]) if dims == 2 else list(window)
    n = cfg.model.num_classes
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "model_file": MODEL_FILE,
        "spatial_dims": dims,
        "layout": "channels_last",
        "input": {"name": "image", "shape": [None] + spatial + [cfg.model.channels],
                  "dtype": "float32",
                  "range": ([0.0, 1.0] if all(i.kind != "zscore" for i in prep.intensities)
                            else "per channel: see channels"),
                  "axes": ("(batch, rows, columns, channel): one axial slice" if dims == 2 else
                           "(batch, slices, rows, columns, channel): a window of axial slices")},
        "window": list(window),
        "slice_layout": geometry.LAYOUT,
        "intensity": {**prep.intensity.describe(), "rule": _intensity_rule(prep.intensity)},
        "channels": [{"name": name, **i.describe(), "rule": _intensity_rule(i)}
                     for name, i in zip(_channel_names(prep), prep.intensities)],
        "channel": prep.channel,
        "in_plane": ({"size": [prep.size, prep.size], "interpolation": "linear, edge to edge"}
                     if prep.size else "each scan's own grid (not resampled)"),
        "resize_to_input": ("bilinear" if dims == 2 and prep.size and prep.size != window[1]
                            else None),
        "sliding_window": ({"overlap": overlap, "sigma_scale": sliding.SIGMA_SCALE, "blend": "gaussian",
                            "pad_value": float(sliding.PAD_IMAGE)} if dims == 3 else None),
        "class_names": list(known.class_names),
        "output": {"name": "probs", "shape": [None] + spatial + [n], "dtype": "float32",
                   "meaning": "softmax probabilities over the classes (last axis, in "
                              "class_names order); argmax gives the label"},
        "precision": {"computes_in": "float32", "trained_in": cfg.model.precision,
                      "weights": "float32 (mixed bfloat16 training keeps float32 weights)"},
        "preprocessing_from": prep.where,
        "run": os.path.abspath(run_dir), "epoch": epoch,
        "model": dataclasses.asdict(cfg.model),
        "keras_version": keras.__version__, "tensorflow_version": tf.__version__,
    }


def _channel_names(prep) -> list[str]:
    return list(prep.channel_names) or [f"channel {c}" for c in range(len(prep.intensities))]


def _intensity_rule(intensity) -> str:
    if intensity.kind == "zscore":
        return ("(x - mean) / std over the case's non-zero voxels of this channel; zero "
                "voxels stay 0")
    if intensity.kind == "ct":
        return (f"(clip(HU, {intensity.low:g}, {intensity.high:g}) - ({intensity.low:g})) "
                f"/ {intensity.high - intensity.low:g}")
    if intensity.kind == "ct_foreground":
        return (f"(clip(HU, {intensity.low:.6g}, {intensity.high:.6g}) - {intensity.mean:.6g}) "
                f"/ {intensity.std:.6g}")
    return (f"clip to the volume's {intensity.low:g} and {intensity.high:g} percentiles of "
            "its non-zero voxels, then scale that range to [0, 1]")


def _save(obj_writer, path: str) -> None:
    """Writes through a temporary file and renames it, so a reader never sees half."""
    tmp = f"{path}.{os.getpid()}.tmp{os.path.splitext(path)[1]}"
    try:
        obj_writer(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def run(opts: predict.Options, out_dir: str) -> list[str]:
    """Exports the run's checkpoint (``opts.which``: the best when the run has one, else
    the newest: ``predict.choose_checkpoint``) to ``out_dir``; returns the lines to
    print, the first saying which checkpoint.

    Raises:
      InputError: inputs given too, or any of predict's start-up errors (run, data file,
        checkpoint).
    """
    if opts.inputs or opts.out:
        raise InputError(f"--export {out_dir}: writes the model only; predict INPUTS with "
                         "--out in a separate distseg-predict")
    cfg = predict.run_config(opts.run_dir)
    known = predict.training_data(cfg, opts)
    window = predict.model_window(cfg, known.path, opts.run_dir)
    chosen = predict.choose_checkpoint(opts.run_dir, opts.which)
    model = predict.build_model(cfg, opts.run_dir, predict.input_shape(cfg, window), chosen)
    twin = inference_twin(cfg.model, predict.input_shape(cfg, window), opts.run_dir)
    copy_weights(model, twin)
    _, overlap = predict.inferer_settings(cfg, opts)
    info = convention(cfg, known, window, overlap, opts.run_dir, int(chosen.entry["epoch"]))
    info["checkpoint"] = chosen.record()
    info["postprocessing"] = decisions(opts.run_dir, known.class_names, chosen.stem)
    lines = [*(f"warning: {w}" for w in chosen.warnings), f"checkpoint: {chosen.words}",
             f"preprocessing: {known.prep.describe()}"]
    return lines + write(out_dir, twin, info, cfg, opts.run_dir, _network_words(cfg.model))


def write(out_dir: str, model, info: dict, cfg: config_lib.Config, run_dir: str,
          words: str) -> list[str]:
    """Writes ``model`` as ``DIR/model.keras`` and ``info`` as ``DIR/model.json`` (each
    through a temporary file), and a ``--model-fn`` network's source beside them;
    returns the lines that say so."""
    output_dir(out_dir, "--export")
    model_path = os.path.join(out_dir, MODEL_FILE)
    json_path = os.path.join(out_dir, CONVENTION_FILE)
    _save(model.save, model_path)
    _save(lambda path: _write_json(path, info), json_path)
    lines = [f"wrote {model_path} ({words}, input {tuple(model.input_shape)}, float32; loads "
             f"with keras.models.load_model) and {json_path} (its input convention)"]
    if cfg.model.fn:
        source = os.path.join(out_dir, rundir.MODEL_FN_FILE)
        from distseg.networks import userfn
        shutil.copyfile(userfn.source_with_hash(cfg.model.fn, cfg.model.fn_sha256, run_dir),
                        source)
        lines.append(f"wrote {source} (the model's source: a model with layers of its own "
                     "loads with keras.models.load_model(..., custom_objects=...) from it)")
    return lines


def decisions(run_dir: str, class_names, stem: str) -> dict:
    """``model.json``'s ``postprocessing``: what ``distseg-predict`` would apply with
    this checkpoint by default (``postprocessing.json``'s decisions for it), so a user
    of the plain model can do the same."""
    return decisions_of(postprocess.choose(run_dir, class_names, stem), class_names)


def decisions_of(applied: postprocess.Applied, class_names) -> dict:
    """``model.json``'s ``postprocessing`` from what predict applies."""
    return {"mirror": applied.mirror,
            "mirror_axes": "every combination of the spatial axes; outputs flipped back and averaged",
            "largest_component": [class_names[c] for c in applied.largest],
            "connectivity": "full (8 neighbours in 2D, 26 in 3D), on the whole case volume",
            "why": applied.words}


def _network_words(m: config_lib.ModelConfig) -> str:
    return f"the model of --model-fn {m.fn}" if m.fn else f"{m.spatial_dims}D U-Net"


def _write_json(path: str, info: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
