"""In-process A/B of the per-epoch weight checksum (``steps.weight_checksum``) against
its former form, which summed the squares through a float64 copy of each variable.

Builds the preset's U-Net and Adam (built, so its moments exist), then times both
forms on the weights and optimizer state every rank checksums at every epoch's end
(``factory.State.synced``), interleaved, and prints each one's median milliseconds and
the two results.

    cd benchmarks && python -m benchlib.checksum_ab --data ../data/liver117.h5 --calls 40
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from benchlib.args import add_precision, preset_config, set_threads, workload_parser

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def copied_checksum(variables) -> list[float]:
    """The checksum as it was before 2026-11-28: the squares of a float64 copy."""
    total = np.zeros(2)
    for v in variables:
        values = np.asarray(v).ravel()
        total += (values.sum(dtype=np.float64), np.square(values, dtype=np.float64).sum())
    return [float(x) for x in total]


def main(argv=None) -> None:
    p = workload_parser(__doc__, batch_size=False)
    p.add_argument("--calls", type=int, default=40, help="timed calls of each form")
    args = add_precision(p).parse_args(argv)
    set_threads(args.threads)
    import keras

    from distseg.networks import unet
    from distseg.training import steps
    cfg = preset_config(args.preset, args.data, args.precision)
    model = unet.from_config(cfg.model)
    optimizer = keras.optimizers.Adam(cfg.train.lr)
    optimizer.build(model.trainable_variables)
    synced = model.weights + optimizer.variables
    forms = {"distseg": steps.weight_checksum, "float64 copy": copied_checksum}
    times: dict = {name: [] for name in forms}
    results = {name: fn(synced) for name, fn in forms.items()}  # and warm up
    for _ in range(args.calls):
        for name, fn in forms.items():
            start = time.perf_counter()
            fn(synced)
            times[name].append(time.perf_counter() - start)
    values = sum(int(np.prod(v.shape)) for v in synced)
    print(f"{len(synced)} variables, {values} values")
    for name in forms:
        print(f"{name:13s} {1e3 * statistics.median(times[name]):7.2f} ms  {results[name]}")


if __name__ == "__main__":
    main()
