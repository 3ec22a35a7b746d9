"""Allreduce bandwidth at the gradient size, against memory-copy bandwidth.

``allreduce`` (run under ``horovodrun -np 2``) times distseg's own gradient
allreduce, ``distseg.parallel.distributed.average_gradients`` inside a ``tf.function``, on
tensors of exactly the shapes of the demo U-Net's gradients, and reports the
gradient bytes divided by the seconds per allreduce (the bandwidth a training step
sees). ``memcpy`` times ``numpy.copyto`` of a buffer of the same size in one
process. On one machine an allreduce of 2 ranks is a few memory copies plus the
coordination, so its bandwidth is bounded by the copy's.

    horovodrun -np 2 -H localhost:2 python -m benchlib.bandwidth allreduce
    python -m benchlib.bandwidth memcpy --bytes 7800000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

from distseg.core import link

from benchlib.args import set_threads

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def gradient_shapes(preset: str, data: str | None = None) -> list[tuple]:
    """Shapes of the trainable variables (so of the gradients) of the preset's U-Net,
    with the classes of ``data`` (``args.preset_config``)."""
    from distseg.networks import unet as model_lib

    from benchlib.args import preset_config
    # Built in float32 whatever the preset's precision (auto included): bfloat16 keeps
    # float32 variables, so the gradients' shapes and bytes are the same in either.
    model = model_lib.from_config(preset_config(preset, data, "float32").model)
    return [tuple(v.shape) for v in model.trainable_variables]


def memcpy_bytes_per_s(nbytes: int, repeats: int = 20) -> float:
    """Bytes/s of ``numpy.copyto`` between two buffers of ``nbytes`` (median)."""
    import numpy as np
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return src.nbytes / statistics.median(times)


def allreduce_seconds(shapes: list[tuple], repeats: int = 30) -> tuple[float, int]:
    """(median seconds per grouped allreduce of float32 tensors of ``shapes``, bytes)."""
    import tensorflow as tf

    from distseg.parallel import distributed as dist
    tensors = [tf.ones(s, tf.float32) for s in shapes]
    reduce = tf.function(dist.average_gradients)
    for _ in range(3):
        [t.numpy() for t in reduce(tensors)[0][:1]]
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        reduce(tensors)[0][0].numpy()
        times.append(time.perf_counter() - start)
    nbytes = link.gradient_bytes(sum(math.prod(s) for s in shapes))
    # Every rank waits for the slowest: take the largest median.
    return max(dist.allgather_object(statistics.median(times))), nbytes


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["allreduce", "memcpy"])
    p.add_argument("--preset", default="demo")
    p.add_argument("--data", default=None, help="the data file whose classes the model has "
                   "(default: none, the liver classes)")
    p.add_argument("--bytes", type=int, default=0, help="memcpy size (0: the preset's gradients)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (inter-op: 1)")
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args(argv)
    if args.mode == "memcpy":
        nbytes = args.bytes or link.gradient_bytes(
            sum(math.prod(s) for s in gradient_shapes(args.preset, args.data)))
        print(json.dumps({"bytes": nbytes, "memcpy_bytes_per_s": memcpy_bytes_per_s(nbytes)}), flush=True)
        return
    from distseg.parallel import distributed as dist
    ctx = dist.init()
    set_threads(args.threads)
    seconds, nbytes = allreduce_seconds(gradient_shapes(args.preset, args.data), args.repeats)
    if ctx.is_root():
        print(json.dumps({"ranks": ctx.size, "bytes": nbytes, "seconds": seconds,
                          "allreduce_bytes_per_s": nbytes / seconds,
                          "controller": ctx.controller}), flush=True)
    dist.shutdown()


if __name__ == "__main__":
    main()
