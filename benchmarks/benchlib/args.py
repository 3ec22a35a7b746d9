"""The command-line options that every benchmark piece shares: the workload of
``make bench`` (the demo preset on LiTS case 117, batch 8 per rank, one intra-op
thread) unless told otherwise, the precision a timed network computes in
(``add_precision``), a training config file over the preset (``add_config``) and the
folder results go to (``add_results_dir``); and what they ask for, applied: the
thread pools of ``--threads`` (``set_threads``), and the preset's config with the
classes of its data file and a precision a network can be built in
(``preset_config``)."""

from __future__ import annotations

import argparse
import dataclasses
import os

RESULTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "bench", "results")
"""Where every benchmark and study writes its results: bench/results of this checkout,
wherever it is started from."""


def workload_parser(doc: str | None, *, epochs: int | None = None, batch_size: bool = True,
                    threads: bool = True, batch_help: str = "per rank") -> argparse.ArgumentParser:
    """A parser with ``--data`` and ``--preset``, and ``--epochs`` (default ``epochs``,
    left out when None), ``--batch-size`` and ``--threads`` as asked."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/liver117.h5")
    p.add_argument("--preset", default="demo")
    if epochs is not None:
        p.add_argument("--epochs", type=int, default=epochs)
    if batch_size:
        p.add_argument("--batch-size", type=int, default=8, help=batch_help)
    if threads:
        p.add_argument("--threads", type=int, default=1, help="intra-op threads (inter-op: 1)")
    return p


def set_threads(intra: int, inter: int = 1) -> None:
    """TensorFlow's thread pools in this process (before its first op): ``--threads``
    intra-op threads and one inter-op thread, as every timed run and peer has, unless
    told otherwise."""
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)


def add_precision(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--precision float32|bfloat16`` (default float32): what the networks a tool times
    compute in. A preset's ``auto`` is no answer here: only a ``distseg-train`` run's
    start decides it (``distseg.training.startup.precision``), each run for itself, so a tool
    names one, and one compared with a run is given the precision that run chose
    (``make bench`` reads it from the run's log)."""
    from distseg.core.config import PRECISIONS
    p.add_argument("--precision", choices=PRECISIONS, default="float32",
                   help="what the network computes in (not auto: only a distseg-train run's "
                        "start decides that)")
    return p


def add_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--config FILE``: a training config file over ``--preset``, read as
    ``distseg-train --config`` reads it, so its optimizer, weight decay and clipping
    reach the optimizer a tool builds (``model_variants.model_and_optimizer``)."""
    p.add_argument("--config", default=None,
                   help="a config file over the preset (as distseg-train --config)")
    return p


def add_results_dir(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--results-dir DIR`` (default ``RESULTS_DIR``): the one spelling of the folder
    a benchmark writes its dated results file to."""
    p.add_argument("--results-dir", default=RESULTS_DIR,
                   help="folder of the JSON results (default: bench/results of this checkout)")
    return p


def preset_config(preset: str, data: str | None = None, precision: str = "float32"):
    """The ``preset``'s config with its classes filled in: the data file's where there
    is one (``feeds.with_classes``, as ``distseg-train`` does), else the liver classes
    of the LiTS sample and the phantom (``config.LIVER_CLASSES``); and ``model.precision``
    ``precision``, in place of the preset's (``auto`` builds no network)."""
    from distseg.core import config as config_lib
    if data:
        from distseg.data import feeds
        return feeds.with_classes(config_lib.resolve(
            preset, overrides={"data.path": data, "run_dir": "-", "model.precision": precision}))
    cfg = config_lib.PRESETS[preset]()
    names = config_lib.LIVER_CLASSES
    return dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, num_classes=len(names), class_names=names, precision=precision))
