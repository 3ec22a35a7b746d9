"""The command-line options that every benchmark piece shares: the workload of
``make bench`` (the demo preset on LiTS case 117, batch 8 per rank, one intra-op
thread) unless told otherwise, the precision a timed network computes in
(``add_precision``); and the preset's config with the classes of its data file and a
precision a network can be built in (``preset_config``)."""

from __future__ import annotations

import argparse
import dataclasses


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


def add_precision(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--precision float32|bfloat16`` (default float32): what the networks a tool times
    compute in. A preset's ``auto`` is no answer here: only a ``distseg-train`` run's
    start decides it (``distseg.training.precision``), each run for itself, so a tool
    names one, and one compared with a run is given the precision that run chose
    (``make bench`` reads it from the run's log)."""
    from distseg.core.config import PRECISIONS
    p.add_argument("--precision", choices=PRECISIONS, default="float32",
                   help="what the network computes in (not auto: only a distseg-train run's "
                        "start decides that)")
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
