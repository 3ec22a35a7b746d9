"""The memory planner's measuring probe: a few real train steps of a U-Net in a fresh
Python process, and the peak memory they held (``distseg-memory --measure``).

The process reads its peak RSS (``VmHWM`` of /proc/self/status, reset after TensorFlow
is imported) minus its RSS at that point, so what TensorFlow's libraries hold before
any model exists is not counted (docs/studies/memory-calibration-2026-11-23.md); the
step is training's own (``steps.make_train_step``), so what is measured is what a
training rank holds. The arithmetic it checks is ``distseg.networks.memory``.

Plain Python in the caller: TensorFlow is imported only inside the measuring process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass

from distseg.core.errors import RunError
from distseg.networks.spec import UNetSpec


@dataclass(frozen=True)
class Measured:
    """A measured run of ``steps`` train steps (the first traces the step)."""

    peak_rss: int
    """Peak RSS minus the RSS after importing TensorFlow (bytes)."""
    tf_peak: int
    """Peak of TensorFlow's CPU allocator over the steps after the first (bytes)."""
    step_seconds: tuple
    """Wall time of each step after the first."""
    baseline: int
    """RSS of the process with TensorFlow imported and nothing built (bytes)."""
    step_cpu_seconds: tuple = ()
    """CPU time of the process in each step after the first: steadier than wall time
    on a shared machine (the steps run on ``threads`` intra-op threads)."""


def measure(spec: UNetSpec, batch: int, steps: int = 3, threads: int = 1,
            timeout: float = 1800.0) -> Measured:
    """Runs ``steps`` train steps of ``spec`` at ``batch`` in a fresh Python process
    (``python -m distseg.training.step.memprobe``) and returns what it measured. A fresh process, so the
    baseline is TensorFlow alone and no earlier allocation hides the peak."""
    request = {"spec": {**dataclasses.asdict(spec), "spatial": list(spec.spatial)},
               "batch": batch, "steps": steps, "threads": threads}
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    try:
        done = subprocess.run([sys.executable, "-m", "distseg.training.step.memprobe", json.dumps(request)],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise RunError(f"measuring took more than {timeout:.0f} s") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RunError(f"measuring failed (exit {done.returncode}): {tail}")
    out = json.loads(lines[-1])
    return Measured(out["peak_rss"], out["tf_peak"], tuple(out["step_seconds"]), out["baseline"],
                    tuple(out["step_cpu_seconds"]))


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RunError(f"/proc/self/status has no {key}")


def _reset_peak_rss() -> None:
    """Sets VmHWM to the current RSS (Linux >= 4.0); without it the peak since start
    counts, which at worst is TensorFlow's import."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _probe(request: dict) -> dict:
    """The measuring process: build, then time ``steps`` train steps on random data.
    The step is training's own (``steps.make_train_step``: forward, the segmentation
    loss, backward, the allreduce of a one-rank Horovod, Adam), so what is measured is
    what a training rank holds; Horovod starts before the baseline is read."""
    import time

    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(request["threads"])
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    from distseg.networks import unet
    from distseg.parallel import distributed as dist
    from distseg.training.step import steps
    dist.init()
    spec = UNetSpec(**{**request["spec"], "spatial": tuple(request["spec"]["spatial"])})
    batch = request["batch"]
    float(tf.reduce_sum(tf.constant([1.0, 2.0])))  # TensorFlow's runtime is up
    baseline = _status_bytes("VmRSS")
    _reset_peak_rss()
    model = unet.build(spec)
    step = steps.make_train_step(model, keras.optimizers.Adam(1e-3), spec.spatial,
                                 spec.num_classes, "dice")
    rng = np.random.default_rng(0)
    images = rng.normal(size=(batch, *spec.spatial, spec.in_channels)).astype(np.float32)
    masks = rng.integers(0, spec.num_classes, size=(batch, *spec.spatial)).astype(np.uint8)
    flags = np.zeros(2, np.float32)
    step(images, masks, flags).loss_local.numpy()
    tf.config.experimental.reset_memory_stats("CPU:0")
    seconds, cpu = [], []
    for _ in range(max(1, request["steps"] - 1)):
        started, started_cpu = time.perf_counter(), time.process_time()
        step(images, masks, flags).loss_local.numpy()
        seconds.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    dist.shutdown()
    return {"peak_rss": _status_bytes("VmHWM") - baseline, "baseline": baseline,
            "tf_peak": tf.config.experimental.get_memory_info("CPU:0")["peak"],
            "step_seconds": seconds, "step_cpu_seconds": cpu}


if __name__ == "__main__":
    print(json.dumps(_probe(json.loads(sys.argv[1]))))
