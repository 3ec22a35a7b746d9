"""A researcher's own Keras model: ``distseg-train --model-fn FILE.py:FUNCTION`` (or
``package.module:FUNCTION``) in place of distseg's U-Net.

The contract (docs/own-model.md)::

    FUNCTION(input_shape, num_classes, **model.args) -> keras.Model

``input_shape`` is the sample's spatial extents plus its channels, ``(H, W, C)`` or
``(D, H, W, C)``, from the data file; the model has one output, the softmax
probabilities ``(batch, *spatial, num_classes)``, which distseg's loss (global soft
Dice, optionally with cross-entropy) scores. distseg wraps the model so its output is
float32 whatever the precision, and checks the output's shape and that it sums to one
over the classes before any rank trains.

What keeps a run reproducible: the SHA-256 of the function's source file is recorded in
``config.json`` (``model.fn_sha256``) and the file is copied to ``RUN/model_fn.py``.
Resume, predict and export load the source whose hash is the recorded one: the original
file while it is unchanged, else the run's copy; a checkpoint is never loaded into a
model built from other code. The copy is loaded as a file of its own, so a module that
imports its package's siblings by relative import resumes only from its package.

Keras only (no Horovod): every error is a one-line ``InputError`` naming the reference;
the training start-up shares it among the ranks (``distseg.training.startup.prepare``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import shutil
import sys
from typing import Callable, Sequence

import numpy as np

from distseg.core import rundir
from distseg.core.config import ModelConfig
from distseg.core.errors import InputError


def parse(ref: str) -> tuple[str, str]:
    """``(target, function)`` of ``FILE.py:FUNCTION`` or ``package.module:FUNCTION``."""
    target, sep, function = ref.rpartition(":")
    if not sep or not target or not function.isidentifier():
        raise InputError(f"--model-fn {ref!r}: expected FILE.py:FUNCTION or "
                         "package.module:FUNCTION")
    return target, function


def is_file(target: str) -> bool:
    return target.endswith(".py") or os.sep in target


def absolute(ref: str) -> str:
    """``ref`` with a file target made absolute (a run keeps working from another
    directory); a module reference as given."""
    target, function = parse(ref)
    return f"{os.path.abspath(target)}:{function}" if is_file(target) else ref


def source_file(ref: str) -> str:
    """The path of the source file ``ref`` names.

    Raises:
      InputError: no such file or module.
    """
    target, _ = parse(ref)
    if is_file(target):
        if not os.path.isfile(target):
            raise InputError(f"--model-fn {ref}: no such file {target}")
        return target
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError) as e:
        raise InputError(f"--model-fn {ref}: module {target} cannot be found ({e})") from None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        raise InputError(f"--model-fn {ref}: no module {target} with a source file "
                         "(install it, or pass FILE.py:FUNCTION)")
    return spec.origin


def digest(path: str) -> str:
    """The SHA-256 of the file at ``path``."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def recorded(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with ``fn`` absolute and ``fn_sha256`` set from the source as it is now
    (a new run); a resumed run's config, which holds both, unchanged."""
    import dataclasses
    if not cfg.fn or cfg.fn_sha256:
        return cfg
    ref = absolute(cfg.fn)
    return dataclasses.replace(cfg, fn=ref, fn_sha256=digest(source_file(ref)))


def keep_copy(cfg: ModelConfig, run_dir: str) -> None:
    """Copies ``cfg.fn``'s source to ``RUN/model_fn.py`` (rank 0, once per run)."""
    if not cfg.fn:
        return
    copy = rundir.model_fn_path(run_dir)
    if os.path.isfile(copy) and digest(copy) == cfg.fn_sha256:
        return
    source = source_with_hash(cfg.fn, cfg.fn_sha256, run_dir="")
    tmp = f"{copy}.tmp-{os.getpid()}"
    shutil.copyfile(source, tmp)
    os.replace(tmp, copy)


def source_with_hash(ref: str, sha256: str, run_dir: str) -> str:
    """The first of (the original, the run's copy) whose hash is ``sha256``."""
    tried = []
    candidates = [("the original", lambda: source_file(ref))]
    if run_dir:
        candidates.append(("the run's copy", lambda: rundir.model_fn_path(run_dir)))
    for what, where in candidates:
        try:
            path = where()
        except InputError as e:
            tried.append(f"{what}: {str(e).split(': ', 1)[-1]}")
            continue
        if not os.path.isfile(path):
            tried.append(f"{what} {path} is missing")
        elif digest(path) != sha256:
            tried.append(f"{what} {path} has changed")
        else:
            return path
    raise InputError(f"--model-fn {ref}: no source with the recorded SHA-256 {sha256[:12]}... "
                     f"({'; '.join(tried)}); the run's checkpoints belong to that code")


def function_of(cfg: ModelConfig, run_dir: str = "") -> Callable:
    """The model function of ``cfg.fn``: from the source whose hash ``cfg.fn_sha256``
    records (``recorded`` first), imported as a module when the original is unchanged.

    Raises:
      InputError: a source that is missing or changed, fails to import, or has no such
        function.
    """
    target, name = parse(cfg.fn)
    path = source_with_hash(cfg.fn, cfg.fn_sha256, run_dir)
    try:
        if not is_file(target) and path == source_file(cfg.fn):
            module = importlib.import_module(target)
        else:
            module = _import_file(path, cfg.fn_sha256)
    except Exception as e:  # noqa: BLE001 - any import error is the user's file's
        raise InputError(f"--model-fn {cfg.fn}: {path} fails to import "
                         f"({type(e).__name__}: {_line(e)})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise InputError(f"--model-fn {cfg.fn}: {path} has no function {name!r}")
    return fn


def _import_file(path: str, sha256: str):
    name = f"distseg_model_fn_{sha256[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else "no detail"


def build(cfg: ModelConfig, input_shape: Sequence[int], run_dir: str = "", name: str = "model"):
    """The researcher's model for samples of spatial ``input_shape`` and
    ``cfg.in_channels`` channels, computing in ``cfg.precision``, wrapped so its output
    is float32 and named ``probs``; its output checked (``check_output``).

    Raises:
      InputError: the function cannot be found, raises, or returns no fitting model.
    """
    import keras

    fn = function_of(cfg, run_dir)
    shape = tuple(int(s) for s in input_shape) + (cfg.channels,)
    policy = "mixed_bfloat16" if cfg.precision == "bfloat16" else "float32"
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        inner = fn(shape, cfg.num_classes, **cfg.args)
    except Exception as e:  # noqa: BLE001 - the user's code: one line, agreed by the caller
        raise InputError(f"--model-fn {cfg.fn}: raised {type(e).__name__} for input shape "
                         f"{shape}, {cfg.num_classes} classes: {_line(e)}") from None
    finally:
        keras.config.set_dtype_policy(before)
    if not isinstance(inner, keras.Model):
        raise InputError(f"--model-fn {cfg.fn}: returned a {type(inner).__name__}, "
                         "expected a keras.Model")
    image = keras.Input(shape, name="image")
    probs = keras.layers.Activation("linear", dtype="float32", name="probs")(inner(image))
    model = keras.Model(image, probs, name=name)
    check_output(model, cfg, shape)
    return model


def check_output(model, cfg: ModelConfig, shape: tuple[int, ...]) -> None:
    """Refuses a model whose output is not ``(batch, *spatial, num_classes)`` softmax
    probabilities, from one forward pass of one random sample.

    Raises:
      InputError: one line with what the model gives and what the data asks for.
    """
    want = (1, *shape[:-1], cfg.num_classes)
    sample = np.random.default_rng(0).random((1, *shape), dtype=np.float32)
    try:
        out = np.asarray(model(sample, training=False))
    except Exception as e:  # noqa: BLE001 - the user's layers
        raise InputError(f"--model-fn {cfg.fn}: fails on one sample of shape {shape} "
                         f"({type(e).__name__}: {_line(e)})") from None
    if out.shape != want:
        raise InputError(f"--model-fn {cfg.fn}: output has shape {out.shape[1:]} per sample, "
                         f"expected {want[1:]} (the input's spatial shape and the data file's "
                         f"{cfg.num_classes} classes)")
    sums = out.sum(axis=-1)
    if not (np.isfinite(out).all() and out.min() >= -1e-3
            and np.allclose(sums, 1.0, atol=1e-2)):
        raise InputError(f"--model-fn {cfg.fn}: output is not softmax probabilities over the "
                         f"last axis (they sum to {float(sums.min()):.3g}..{float(sums.max()):.3g}); "
                         "end the model with a softmax over the classes")
