"""Training FLOPs counted from a Keras model, and dense fp32 GEMM FLOP/s.

The count covers the layers that do almost all the arithmetic of a U-Net:
convolutions, transposed convolutions and dense layers. One multiply-add is 2 FLOPs;
biases, normalisation, activations, pooling and the loss are left out (together well
under 1% of a convolution's work here). Per sample:

* convolution: 2 * prod(kernel) * C_in / groups * C_out * prod(output spatial size);
* transposed convolution: 2 * prod(kernel) * C_in * C_out * prod(input spatial size)
  (every input pixel is scattered through the whole kernel);
* dense: 2 * in_features * units * prod(other non-batch axes).

Training a step costs the forward pass, the gradient with respect to the weights (as
much again) and the gradient with respect to the layer's input (as much again, except
for layers fed by the model's input, whose input gradient nobody needs): about three
times the forward FLOPs.

``gemm_flops_per_s`` times ``tf.matmul`` of two square matrices (fp32, and bf16 for
the bf16 path) at the thread count TensorFlow was configured with: the
dense-arithmetic rate the training rate is compared against.

    python -m benchlib.flops --preset demo --data data/liver117.h5 --threads 1 --precision bfloat16
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

from benchlib.args import add_precision, preset_config, set_threads

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_CONV = ("Conv1D", "Conv2D", "Conv3D")
_TRANSPOSED = ("Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose")


def _shape(tensor) -> tuple:
    return tuple(tensor.shape)


def layer_forward_flops(layer) -> int:
    """Forward FLOPs of one sample through ``layer`` (0 for layers not counted)."""
    kind = type(layer).__name__
    if kind in _CONV:
        c_in = _shape(layer.input)[-1]
        out = _shape(layer.output)
        return (2 * math.prod(layer.kernel_size) * (c_in // layer.groups) * out[-1]
                * math.prod(out[1:-1]))
    if kind in _TRANSPOSED:
        inp = _shape(layer.input)
        return 2 * math.prod(layer.kernel_size) * inp[-1] * layer.filters * math.prod(inp[1:-1])
    if kind == "Dense":
        inp = _shape(layer.input)
        return 2 * inp[-1] * layer.units * math.prod(inp[1:-1])
    return 0


def _fed_by_input(layer, model) -> bool:
    """Whether ``layer`` reads the model's input directly (no input gradient needed)."""
    return any(layer.input is t for t in model.inputs)


def count_training_flops(model) -> dict:
    """FLOPs per sample of a forward pass and of a training step of ``model``.

    Returns ``{"forward": F, "backward": B, "train": F + B, "layers": {name: F}}``.
    """
    forward = backward = 0
    layers = {}
    for layer in model.layers:
        f = layer_forward_flops(layer)
        if not f:
            continue
        layers[layer.name] = f
        forward += f
        backward += f if _fed_by_input(layer, model) else 2 * f
    return {"forward": forward, "backward": backward, "train": forward + backward,
            "layers": layers}


def gemm_flops_per_s(n: int = 2048, repeats: int = 10, dtype: str = "float32") -> float:
    """Peak FLOP/s of ``tf.matmul`` on two n x n matrices of ``dtype``: the fastest of
    ``repeats`` timed products after one warm-up (2 n^3 FLOPs each). The fastest, not
    the median: on a shared machine the slower ones measure the other processes."""
    import tensorflow as tf
    a = tf.cast(tf.random.stateless_uniform((n, n), seed=(1, 2)), dtype)
    b = tf.cast(tf.random.stateless_uniform((n, n), seed=(3, 4)), dtype)
    tf.matmul(a, b).numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        tf.matmul(a, b).numpy()
        times.append(time.perf_counter() - start)
    return 2 * n ** 3 / min(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="demo")
    p.add_argument("--data", default=None, help="the data file whose classes the model has "
                   "(default: none, the liver classes)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (inter-op: 1)")
    p.add_argument("--gemm-n", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=10)
    args = add_precision(p).parse_args(argv)
    set_threads(args.threads)
    from distseg.networks import unet as model_lib
    # The classes only size the 1x1 head: a negligible share of the FLOPs. The count is
    # the same in either precision (the same layers); the rate it is set against is the
    # GEMM of the precision the run trained in (both are timed).
    model_cfg = preset_config(args.preset, args.data, args.precision).model
    counted = count_training_flops(model_lib.from_config(model_cfg))
    print(json.dumps({"precision": args.precision, "forward_flops_per_sample": counted["forward"],
                      "train_flops_per_sample": counted["train"],
                      "gemm_n": args.gemm_n, "threads": args.threads,
                      "gemm_flops_per_s": gemm_flops_per_s(args.gemm_n, args.repeats),
                      "gemm_bf16_flops_per_s": gemm_flops_per_s(args.gemm_n, args.repeats, "bfloat16")}),
          flush=True)


if __name__ == "__main__":
    main()
