"""The command-line options that every benchmark piece shares: the workload of
``make bench`` (the demo preset on LiTS case 117, batch 8 per rank, one intra-op
thread) unless told otherwise; and the preset's config with the classes of its data
file (``preset_config``)."""

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


def preset_config(preset: str, data: str | None = None):
    """The ``preset``'s config with its classes filled in: the data file's where there
    is one (``feeds.with_classes``, as ``distseg-train`` does), else the liver classes
    of the LiTS sample and the phantom (``config.LIVER_CLASSES``)."""
    from distseg.core import config as config_lib
    if data:
        from distseg.data import feeds
        return feeds.with_classes(config_lib.resolve(preset, overrides={"data.path": data,
                                                                        "run_dir": "-"}))
    cfg = config_lib.PRESETS[preset]()
    names = config_lib.LIVER_CLASSES
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, num_classes=len(names),
                                                              class_names=names))
