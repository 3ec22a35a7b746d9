"""``distseg-memory``: peak training memory of a U-Net, estimated (and measured).

Parses options, builds a ``UNetSpec``, prints ``memory.estimate`` with its
per-level breakdown, the verdict against ``--budget`` and the largest batch and input
that fit; ``--measure`` runs real steps in a fresh process (``memprobe.measure``). No
TensorFlow in this process.
"""

from __future__ import annotations

import dataclasses

import click

from distseg.core import config as config_lib
from distseg.core.errors import DistsegError, InputError, fail
from distseg.networks import memory
from distseg.networks import spec as spec_lib
from distseg.training.startup import precision as precision_lib
from distseg.training.step import memprobe

#: Base filters when --base-filters is not given: the liver2d and liver3d presets'.
DEFAULT_FILTERS = {"unet2d": config_lib.liver2d().model.base_filters,
                   "unet3d": config_lib.liver3d().model.base_filters}
_TERMS = ("parameters", "gradients", "optimizer", "activations", "workspace", "runtime")


def _shape(extents) -> str:
    return "x".join(str(e) for e in extents)


def describe(spec: spec_lib.UNetSpec, batch: int) -> list[str]:
    """The first lines: the model, its input and its parameter count."""
    params, trainable = memory.count_params(spec)
    channels = f" x {spec.in_channels} channels" if spec.in_channels > 1 else ""
    return [f"{spec.spatial_dims}D U-Net, input {_shape(spec.spatial)}{channels}, batch {batch}, "
            f"{spec.base_filters} base filters, depth {spec.depth}, {spec.norm} norm, "
            f"{spec.precision}, recompute {'on' if spec.recompute else 'off'}",
            f"parameters: {params:,} ({trainable:,} trainable)"]


def breakdown(est: memory.Estimate) -> list[str]:
    """The per-level table and the estimate by term."""
    lines = ["", f"{'level':<7}{'shape':<14}{'channels':>9}{'parameters':>13}"
                 f"{'activations kept':>19}"]
    for row in est.levels:
        name = "bottom" if row.level == est.spec.depth else str(row.level)
        lines.append(f"{name:<7}{_shape(row.shape):<14}{row.channels:>9}{row.params:>13,}"
                     f"{memory.human(row.kept_bytes * est.batch):>19}")
    lines += ["", "peak training memory (estimate):"]
    lines += [f"  {term:<13}{memory.human(est.terms[term]):>12}" for term in _TERMS]
    lines.append(f"  {'total':<13}{memory.human(est.total):>12}")
    return lines


def answers(est: memory.Estimate, budget: int) -> list[str]:
    """The verdict, and the largest batch and input that fit the budget."""
    spec = est.spec
    batch = memory.largest_batch(spec, budget)
    biggest = memory.largest_input(spec, est.batch, budget)
    return ["", f"budget {memory.human(budget)}: {memory.verdict(est, budget)}",
            f"largest batch at {_shape(spec.spatial)}: {batch}" if batch else
            f"largest batch at {_shape(spec.spatial)}: none fits",
            f"largest input at batch {est.batch}: " + (_shape(biggest) if biggest else "none fits")]


def measured(est: memory.Estimate, steps: int, threads: int) -> list[str]:
    """Runs the steps and prints the measured peak beside the estimate."""
    available = _available_memory()
    if available and est.total > available:
        raise InputError(f"--measure: the estimate ({memory.human(est.total)}) exceeds this "
                         f"machine's available memory ({memory.human(available)})")
    got = memprobe.measure(est.spec, est.batch, steps=steps, threads=threads)
    error = 100.0 * (est.total - got.peak_rss) / got.peak_rss
    times = sorted(got.step_seconds)
    return ["", f"measured peak RSS: {memory.human(got.peak_rss)} above TensorFlow's own "
                f"{memory.human(got.baseline)} (estimate {memory.human(est.total)}, {error:+.1f} %)",
            f"measured TensorFlow allocator peak: {memory.human(got.tf_peak)}; "
            f"median step {times[len(times) // 2]:.2f} s over {len(times)} steps after the first"]


def auto_note(spec: spec_lib.UNetSpec, batch: int, flags: list[str]) -> list[str]:
    """With ``--precision auto``: the plan above is float32's (the larger); what
    bfloat16 would take, and whether this CPU lets distseg-train try it."""
    bf16 = memory.estimate(dataclasses.replace(spec, precision="bfloat16"), batch)
    cpu = (f"this CPU reports {', '.join(flags)}: distseg-train times both and keeps "
           "bfloat16 at 10 % faster or more" if flags else
           "this CPU reports no bfloat16 flag: distseg-train takes float32 here")
    return ["", f"--precision auto: planned in float32 (the larger); in bfloat16 the total "
                f"is {memory.human(bf16.total)} ({cpu})"]


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@click.command(context_settings={"max_content_width": 100})
@click.option("--model", "kind", required=True, type=click.Choice(sorted(DEFAULT_FILTERS)),
              help="unet2d (slices) or unet3d (volumes).")
@click.option("--input", "input_text", required=True, metavar="D,H,W",
              help="Input extents (H,W for unet2d), or one size for every axis; multiples of 2**depth.")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1), help="Samples per step (per rank).")
@click.option("--budget", "budget_text", required=True, metavar="SIZE",
              help="Memory to fit in, e.g. 384GB, 1.5TB, 512MiB (binary units).")
@click.option("--base-filters", default=None, type=click.IntRange(1),
              help="Filters of the first level (default: 64 for unet2d, 16 for unet3d).")
@click.option("--depth", default=4, show_default=True, type=click.IntRange(1), help="Poolings.")
@click.option("--classes", default=3, show_default=True, type=click.IntRange(2), help="Output classes.")
@click.option("--channels", default=1, show_default=True, type=click.IntRange(1),
              help="Input channels (CT: 1; BraTS: 4).")
@click.option("--norm", default="batch", show_default=True, type=click.Choice(config_lib.NORMS))
@click.option("--recompute/--no-recompute", default=False, help="Gradient checkpointing of every convolution unit.")
@click.option("--precision", default=config_lib.AUTO, show_default=True,
              type=click.Choice(config_lib.PRECISION_CHOICES),
              help="auto (distseg-train's default): float32's plan, with bfloat16's total beside it.")
@click.option("--measure", is_flag=True, help="Also run real train steps in a fresh process and print the measured peak RSS.")
@click.option("--steps", default=3, show_default=True, type=click.IntRange(2), help="Steps --measure runs (the first traces).")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(1), help="TensorFlow intra-op threads for --measure.")
def main(kind, input_text, batch, budget_text, base_filters, depth, classes, channels, norm,
         recompute, precision, measure, steps, threads):
    """Estimate the peak memory of training a distseg U-Net: parameters, gradients, Adam's
    state, activations kept for the backward pass, workspace. Prints the parameter count,
    a per-level breakdown, whether it fits --budget, and the largest batch and input that do.
    It plans distseg's own U-Nets only: for a model of your own (--model-fn), run a few
    steps of it and read the rank's peak memory instead."""
    try:
        dims = 3 if kind == "unet3d" else 2
        built = config_lib.PRECISIONS[0] if precision == config_lib.AUTO else precision
        spec = spec_lib.UNetSpec(memory.parse_input(input_text, dims), depth=depth,
                               base_filters=base_filters or DEFAULT_FILTERS[kind], num_classes=classes,
                               in_channels=channels,
                               norm=norm, recompute=recompute, precision=built)
        budget = memory.parse_bytes(budget_text)
        est = memory.estimate(spec, batch)
        lines = describe(spec, batch) + breakdown(est) + answers(est, budget)
        if precision == config_lib.AUTO:
            lines += auto_note(spec, batch, precision_lib.read_bf16_flags())
        click.echo("\n".join(lines))
        if measure:
            click.echo("\n".join(measured(est, steps, threads)))
    except DistsegError as e:
        fail(str(e), e.exit_code)
