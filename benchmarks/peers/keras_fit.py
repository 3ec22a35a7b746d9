"""Peer: the same U-Net trained with Keras ``model.fit`` in one process.

What a Keras user would write for distseg's one-rank run: the model and optimizer as
``distseg-train`` builds them from the preset (and ``--config``: Adam at the preset's
learning rate unless the config names another optimizer, weight decay or clipping;
``benchlib.model_variants.model_and_optimizer``), distseg's segmentation loss as a
``keras.losses.Loss``, the training slices in memory as numpy arrays,
``fit`` with shuffling and the same batch size, thread counts and precision
(``--precision``: ``make bench`` gives the one its distseg run chose). Prints one JSON line:
samples/s over the epochs after the first (the first traces the step), and each
epoch's seconds.

    python -m peers.keras_fit --data data/liver117.h5 --epochs 4 --precision bfloat16
"""

from __future__ import annotations

import json
import os
import sys
import time

from benchlib.args import add_config, add_precision, set_threads, workload_parser

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402 - after the log level; importing runs no TensorFlow op

from distseg import losses  # noqa: E402


class SegmentationLoss(keras.losses.Loss):
    """distseg's segmentation loss as a Keras loss. Masks come as (B, H, W, 1), so
    Keras does not expand them to the rank of the predictions by itself."""

    def __init__(self, num_classes: int, kind: str):
        super().__init__(name=f"segmentation_{kind}")
        self.num_classes, self.kind = num_classes, kind

    def call(self, y_true, y_pred):
        return losses.segmentation_loss(y_pred, y_true[..., 0], self.num_classes, self.kind)


def keras_loss(num_classes: int, kind: str) -> SegmentationLoss:
    return SegmentationLoss(num_classes, kind)


class EpochTimer(keras.callbacks.Callback):
    """Records each epoch's wall-clock seconds in ``seconds``."""

    def on_train_begin(self, logs=None):
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self._start)


def train_arrays(path: str, image_size: int):
    """(images (N,S,S,1) float32, masks (N,S,S,1) uint8) of the training split."""
    from distseg.data import slices as data
    info = data.examine(path)
    with data.SliceReader(path, image_size) as reader:
        images, masks = reader.read(info.train_indices)
    return images, masks[..., None]


def samples_per_s(seconds: list, samples_per_epoch: int) -> float:
    """Samples/s over every epoch but the first (tracing, warm-up)."""
    timed = seconds[1:]
    return samples_per_epoch * len(timed) / sum(timed)


def run(args) -> dict:
    set_threads(args.threads)
    from distseg.core import config as config_lib
    from distseg.data import feeds

    from benchlib import model_variants
    cfg = config_lib.resolve(args.preset, args.config,
                             overrides={"data.path": args.data, "run_dir": "-",
                                        "model.precision": args.precision})
    cfg = feeds.with_classes(cfg)  # the data file decides the class count
    if args.policy:
        keras.mixed_precision.set_global_policy(args.policy)
    images, masks = train_arrays(args.data, cfg.model.image_size)
    model, optimizer = model_variants.model_and_optimizer(cfg, (cfg.model.image_size,) * 2, cfg.train.seed)
    model.compile(optimizer=optimizer, loss=keras_loss(cfg.model.num_classes, cfg.train.loss))
    timer = EpochTimer()
    model.fit(images, masks, batch_size=args.batch_size, epochs=args.epochs, shuffle=True,
              verbose=0, callbacks=[timer])
    return {"peer": "keras_fit", "samples_per_s": samples_per_s(timer.seconds, len(images)),
            "epoch_seconds": timer.seconds, "samples_per_epoch": len(images),
            "threads": args.threads, "precision": args.precision,
            "policy": args.policy or "float32"}


def main(argv=None):
    p = workload_parser(__doc__, epochs=4)
    p.add_argument("--policy", default=None, help="Keras dtype policy, e.g. mixed_bfloat16")
    args = add_config(add_precision(p)).parse_args(argv)
    if args.epochs < 2:
        sys.exit("error: --epochs must be >= 2 (the first epoch is not timed)")
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
