"""Peak training memory of a distseg U-Net, estimated by arithmetic and measured.

The estimate (``estimate``) is pure arithmetic on the U-Net's layer list
(``layer_list``, the tensors ``distseg.networks.unet.build`` creates from the same
``distseg.networks.spec.UNetSpec``, level by level), in
six terms:

* **parameters**: every weight in float32 (the master copy, also under bfloat16),
  BatchNorm's moving statistics included;
* **gradients**: one float32 value per trainable parameter;
* **optimizer**: Adam's two moments, 2 x the trainable parameters in float32; under
  bfloat16 also the bfloat16 copies of the weights that the layers compute with;
* **activations**: the tensors the forward pass keeps for the backward pass
  (``Tensor.kept``), from TensorFlow's gradient functions: a convolution keeps its
  input, a norm keeps its input, ReLU, softmax and max-pooling keep their output,
  pooling also its input, the loss its one-hot truth. With ``recompute`` a
  convolution unit keeps only its inputs (``distseg.networks.unet.ConvUnit``; a decoder's
  first unit also recomputes the upsampling). Plus the input batch itself (float32
  images, uint8 masks);
* **workspace**: what the backward pass holds at once on top of them (activation
  gradients and, with ``recompute``, the unit being recomputed, plus the allocator's
  slack that grows with them), modelled as ``WORKSPACE_TENSORS`` full-resolution
  float32 tensors of ``base_filters`` channels;
* **runtime**: what the process holds beyond TensorFlow's tensors once it has traced
  and run a train step (Keras objects, the traced graph, oneDNN's primitive cache):
  ``RUNTIME_BYTES``.

The last two are calibrated on one machine and TensorFlow version: the runtime is peak
RSS minus the TensorFlow allocator's own peak (``tf.config.experimental.get_memory_info``)
at small inputs, the workspace what remained of the measured peak at large ones. The
machine, the runs and the error at other sizes are in
docs/studies/memory-calibration-2026-11-23.md; ``benchmarks/bench_memory.py``
re-measures them.

What a real train step holds is measured by ``distseg.training.step.memprobe.measure``,
the planner's check against training's own step (``distseg-memory --measure``).

Plain Python: no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from distseg.core import link
from distseg.core.errors import InputError
from distseg.networks.spec import UNetSpec

ACT_BYTES = {"float32": 4, "bfloat16": 2}
"""Bytes per activation value of each precision (weights stay float32)."""

WORKSPACE_TENSORS = {("float32", False): 3.3, ("float32", True): 4.8,
                     ("bfloat16", False): 3.3, ("bfloat16", True): 4.7}
"""(precision, recompute) -> how many full-resolution ``base_filters``-channel
float32-sized tensors the backward pass holds at its peak on top of the kept
activations (calibrated: docs/studies/memory-calibration-2026-11-23.md; in bfloat16
the measured workspace does not halve, so it is counted in float32 sizes for both
precisions)."""

RUNTIME_BYTES = 166 * 2 ** 20
"""Peak RSS beyond the other terms at small inputs: Keras objects, the traced step,
oneDNN's primitive cache, and a one-rank Horovod (its libraries, background thread and
fusion buffer), since ``measure`` times training's own step. Calibrated on the step as
it is traced now (the fused Adam, no autograph), which is smaller than a step of Keras'
own Adam (docs/studies/memory-calibration-2026-11-23.md, "The runtime and workspace
constants")."""


_UNITS = {"": 1, "B": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


@dataclass(frozen=True)
class Tensor:
    """One layer's output, per sample."""

    name: str
    level: int
    """0 is full resolution; ``depth`` the bottleneck."""
    channels: int
    voxels: int
    itemsize: int
    params: int = 0
    """Trainable parameters of the layer that makes it."""
    stats: int = 0
    """Non-trainable parameters (BatchNorm's moving statistics)."""
    kept: bool = False
    """Held from the forward pass until the backward pass has used it."""

    @property
    def nbytes(self) -> int:
        return self.channels * self.voxels * self.itemsize


def _unit(spec: UNetSpec, name: str, level: int, cin: int, filters: int, i: int) -> list[Tensor]:
    """conv -> norm -> ReLU. The conv output is kept by the norm after it (not with
    ``recompute``: then only the unit's output, the next layer's input, is kept)."""
    voxels, a = _voxels(spec, level), _itemsize(spec, level)
    bias = filters if spec.has_bias() else 0
    out = [Tensor(f"{name}_conv{i}", level, filters, voxels, a, 3 ** spec.spatial_dims * cin * filters + bias,
                  kept=spec.norm != "none" and not spec.recompute)]
    if spec.norm != "none":
        out.append(Tensor(spec.norm_name(name, i), level, filters, voxels, a,
                          2 * filters, 2 * filters if spec.norm == "batch" else 0))
    out.append(Tensor(f"{name}_relu{i}", level, filters, voxels, a, kept=True))
    return out


def _itemsize(spec: UNetSpec, level: int) -> int:
    return ACT_BYTES[spec.precision_of(level)]


def _voxels(spec: UNetSpec, level: int) -> int:
    return spec.voxels(level)


def _head(spec: UNetSpec, cin: int) -> list[Tensor]:
    """The 1x1 convolution and softmax (float32 probabilities) and the loss's one-hot
    truth; in bfloat16 the convolution makes bfloat16 logits first."""
    voxels, c = _voxels(spec, 0), spec.num_classes
    params = cin * c + c
    out = []
    if spec.precision != "float32":
        out.append(Tensor("logits", 0, c, voxels, _itemsize(spec, 0), params))
        params = 0
    out.append(Tensor("probs", 0, c, voxels, 4, params, kept=True))
    out.append(Tensor("loss_onehot", 0, c, voxels, 4, kept=True))
    return out


def layer_list(spec: UNetSpec) -> list[Tensor]:
    """The U-Net's tensors in build order, as ``distseg.networks.unet.build_unet`` names them
    (the bfloat16 cast of the image, the concatenation and the units' internals have no
    Keras layer of their own)."""
    # The float32 image is the input batch; a bfloat16 copy is what the first conv keeps.
    out = [Tensor("image", 0, spec.in_channels, _voxels(spec, 0), _itemsize(spec, 0),
                  kept=_itemsize(spec, 0) != 4)]
    cin = spec.in_channels
    for level in range(spec.depth):
        width = spec.filters(level)
        out += _unit(spec, f"down{level}", level, cin, width, 1) + _unit(spec, f"down{level}", level, width, width, 2)
        out.append(Tensor(f"pool{level}", level + 1, width, _voxels(spec, level + 1),
                          _itemsize(spec, level + 1), kept=True))
        cin = width
    width = spec.filters(spec.depth)
    out += _unit(spec, "bottleneck", spec.depth, cin, width, 1) + _unit(spec, "bottleneck", spec.depth, width, width, 2)
    for level in reversed(range(spec.depth)):
        cin, width = width, spec.filters(level)
        # Not kept: the concatenation does not need it, and with recompute the first
        # decoder unit upsamples and concatenates itself.
        out.append(Tensor(f"up{level}", level, width, _voxels(spec, level), _itemsize(spec, level),
                          2 ** spec.spatial_dims * cin * width + width))
        if not spec.recompute:
            out.append(Tensor(f"skip{level}", level, 2 * width, _voxels(spec, level), _itemsize(spec, level),
                          kept=True))
        out += _unit(spec, f"dec{level}", level, 2 * width, width, 1) + _unit(spec, f"dec{level}", level, width, width, 2)
    return out + _head(spec, width)


@dataclass(frozen=True)
class Level:
    """One row of the per-level breakdown (per sample activations)."""

    level: int
    shape: tuple[int, ...]
    channels: int
    params: int
    kept_bytes: int


@dataclass(frozen=True)
class Estimate:
    """Peak training memory in bytes, by term; ``total`` is their sum."""

    spec: UNetSpec
    batch: int
    params: int
    trainable: int
    terms: dict = field(default_factory=dict)
    levels: tuple = ()

    @property
    def total(self) -> int:
        return sum(self.terms.values())

    def per_sample(self) -> int:
        """Bytes that grow with each sample of the batch."""
        return sum(self.terms[k] for k in ("activations", "workspace")) // self.batch

    def fixed(self) -> int:
        return self.total - self.per_sample() * self.batch


def count_params(spec: UNetSpec) -> tuple[int, int]:
    """(all parameters, trainable parameters), as Keras' ``count_params`` counts them."""
    tensors = layer_list(spec)
    trainable = sum(t.params for t in tensors)
    return trainable + sum(t.stats for t in tensors), trainable


def _levels(spec: UNetSpec, tensors: list[Tensor]) -> tuple[Level, ...]:
    rows = []
    for level in range(spec.depth + 1):
        mine = [t for t in tensors if t.level == level]
        rows.append(Level(level, spec.shape(level), spec.filters(level), sum(t.params + t.stats for t in mine),
                          sum(t.nbytes for t in mine if t.kept)))
    return tuple(rows)


def estimate(spec: UNetSpec, batch: int) -> Estimate:
    """Peak memory of one training step of ``spec`` at ``batch`` samples (see the module
    docstring for the terms and where the two calibrated ones come from)."""
    if batch < 1:
        raise InputError(f"batch must be >= 1, got {batch}")
    tensors = layer_list(spec)
    params, trainable = count_params(spec)
    voxels = _voxels(spec, 0)
    data = batch * voxels * (4 * spec.in_channels + 1)
    full_resolution = voxels * spec.base_filters * 4  # one sample's, float32
    terms = {
        "parameters": 4 * params,
        "gradients": link.gradient_bytes(trainable),
        "optimizer": 8 * trainable + (2 * trainable if spec.precision == "bfloat16" else 0),
        "activations": batch * sum(t.nbytes for t in tensors if t.kept) + data,
        "workspace": batch * int(WORKSPACE_TENSORS[(spec.precision, spec.recompute)] * full_resolution),
        "runtime": RUNTIME_BYTES,
    }
    return Estimate(spec, batch, params, trainable, terms, _levels(spec, tensors))


def largest_batch(spec: UNetSpec, budget: int) -> int:
    """The largest batch whose estimate fits ``budget`` bytes (0 if none does)."""
    one = estimate(spec, 1)
    return max(0, (budget - one.fixed()) // one.per_sample())


def largest_input(spec: UNetSpec, batch: int, budget: int) -> tuple[int, ...] | None:
    """The largest input of the same proportions as ``spec.spatial`` (each extent a
    multiple of 2**depth) whose estimate at ``batch`` fits ``budget``; None if none."""
    pool, smallest = 2 ** spec.depth, min(spec.spatial)
    best, k = None, 1
    while True:
        shape = tuple(max(1, round(s / smallest * k)) * pool for s in spec.spatial)
        if estimate(dataclasses.replace(spec, spatial=shape), batch).total > budget:
            return best
        best, k = shape, k + 1


def verdict(est: Estimate, budget: int) -> str:
    """One line in words: fits or does not fit, and by how much."""
    need = est.total
    if need <= budget:
        return (f"fits: needs {human(need)} of the {human(budget)} budget "
                f"({100 * need / budget:.0f} %), {human(budget - need)} to spare")
    return f"does not fit: needs {human(need)}, {human(need - budget)} more than the {human(budget)} budget"


def human(n: float) -> str:
    """Bytes in binary units: 1.5 GiB, 384 GiB, 980 MiB."""
    for unit, size in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            value = n / size
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{int(n)} B"


def parse_bytes(text: str, what: str = "--budget") -> int:
    """``384GB``, ``1.5TB``, ``192GiB``, ``500 MB``, ``2e9`` -> bytes. K/M/G/T are binary
    (JEDEC's convention for memory: a "384 GB" server has 384 GiB)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGT]?)(I?B)?\s*", text or "", re.IGNORECASE)
    if not m or (not m.group(2) and m.group(3) and m.group(3).upper() == "IB"):
        raise InputError(f"{what} {text!r}: expected a size such as 384GB, 1.5TB or 512MiB")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if not 0 < value < 2 ** 70:
        raise InputError(f"{what} {text!r}: expected a positive size below 1 ZiB")
    return int(value)


def parse_input(text: str, spatial_dims: int, what: str = "--input") -> tuple[int, ...]:
    """``D,H,W`` (or ``H,W`` in 2D); one number means that extent on every axis."""
    parts = [p.strip() for p in (text or "").replace("x", ",").split(",")]
    if not all(p.isdigit() for p in parts) or len(parts) not in (1, spatial_dims):
        shape = "D,H,W" if spatial_dims == 3 else "H,W"
        raise InputError(f"{what} {text!r}: expected {shape} (positive integers) or one size for every axis")
    extents = tuple(int(p) for p in parts) * (spatial_dims if len(parts) == 1 else 1)
    if any(e < 1 for e in extents):
        raise InputError(f"{what} {text!r}: every extent must be >= 1")
    return extents
