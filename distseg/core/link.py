"""The link between the ranks as they see it: bandwidth and latency fitted to timed
allreduces of known sizes (``distseg.parallel.distributed.time_allreduces`` times them
at a run's start; ``distseg-report`` reads the fit back from the ``run`` record).

A ring allreduce of ``n`` bytes over ``R`` ranks sends 2 (R - 1) / R x n bytes through
each rank's link in 2 (R - 1) rounds, so

    t(n) = 2 (R - 1) alpha + 2 (R - 1) / R x n / bandwidth

and a least-squares line through (2 (R - 1) / R x n, t) gives 1 / bandwidth as its
slope and the rounds' latency as its intercept. Plain Python: analysis uses it too.
"""

from __future__ import annotations

#: Allreduce sizes (bytes) timed at start-up: from one small message to a gradient's
#: worth (the demo U-Net's gradients are 8 MB, liver2d's 124 MB).
PROBE_BYTES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
#: Sizes up to this are always timed: a shaped TCP link reaches its rate only at tens
#: of MiB, so a fit to small sizes alone reads it low
#: (docs/studies/link-2026-11-26.md, "The start-up probe's sizes").
PROBE_ALWAYS = 16 << 20
#: Timed repeats of each size (the first size once more, untimed: Horovod's set-up).
PROBE_REPEATS = 3
#: Past ``PROBE_ALWAYS``, a size predicted to take longer than this (seconds, from the
#: last one's median) ends the probe.
PROBE_BUDGET_S = 0.25


#: Bytes a gradient value takes in the step's allreduce, by ``train.compression``:
#: exact float32, or Horovod's float16 (``distseg.parallel.distributed.average_gradients``).
VALUE_BYTES = {"none": 4, "fp16": 2}


def gradient_bytes(params: float, compression: str = "none") -> float:
    """Bytes of the gradients of ``params`` trainable parameters, as a step allreduces
    them (one float32 each, or one float16 under ``fp16``): what the projection, the
    memory estimate, the benchmarks and ``--compression auto`` count. (A bfloat16
    network keeps float32 weights, so its gradients are float32 too.)"""
    return VALUE_BYTES[compression] * params


def ring_rounds(ranks: int) -> int:
    """Message rounds of a ring allreduce over ``ranks``: 2 (R - 1) (a reduce-scatter
    and an all-gather of R - 1 rounds each), each paying the link's latency once."""
    return 2 * (ranks - 1)


def ring_bytes(nbytes: float, ranks: int) -> float:
    """Bytes a ring allreduce of ``nbytes`` sends through each rank's link: a 1 / R
    part of them in each of its rounds."""
    return ring_rounds(ranks) / ranks * nbytes


def fit(sizes: list[int], seconds: list[float], ranks: int) -> dict | None:
    """``{bandwidth_gbps, latency_us, ...}`` of the ring model fitted to allreduces of
    ``sizes`` bytes that took ``seconds``; None with fewer than 2 sizes or one rank.
    A fitted slope of 0 or less (sizes too small to see the bandwidth) gives no
    bandwidth (None); a negative intercept is a latency of 0."""
    if ranks < 2 or len(sizes) < 2:
        return None
    xs = [ring_bytes(n, ranks) for n in sizes]
    n = len(xs)
    mx, my = sum(xs) / n, sum(seconds) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, seconds)) / sxx if sxx else 0.0
    intercept = my - slope * mx
    rounds = ring_rounds(ranks)
    return {"bandwidth_gbps": 8 / slope / 1e9 if slope > 0 else None,
            "latency_us": max(intercept, 0.0) / rounds * 1e6,
            "ranks": ranks, "bytes": list(sizes), "seconds": list(seconds),
            "model": "ring"}


def sync_seconds(nbytes: float, ranks: int, bandwidth_gbps: float, latency_us: float,
                 rounds: float | None = None) -> float:
    """Seconds of a ring allreduce of ``nbytes`` over ``ranks`` on a link of that
    bandwidth and per-round latency (0 on one rank); ``rounds``: message rounds paid
    the latency, 2 (R - 1) for the ring unless given (a tree's 2 log2 R)."""
    if ranks < 2:
        return 0.0
    rounds = ring_rounds(ranks) if rounds is None else rounds
    return rounds * latency_us * 1e-6 + ring_bytes(nbytes, ranks) * 8 / (bandwidth_gbps * 1e9)


def step_seconds(compute: float, sync: float, gamma: float) -> float:
    """Pollux's step time: (T_compute^gamma + T_sync^gamma)^(1/gamma); gamma 1 is no
    overlap of the two (their sum), a large gamma full overlap (their max)."""
    if sync <= 0:
        return compute
    return (compute ** gamma + sync ** gamma) ** (1 / gamma)


def compute_seconds(step: float, sync: float, gamma: float) -> float:
    """The compute time ``step_seconds`` inverted: what a step of ``step`` seconds with
    ``sync`` seconds of allreduce computed (0 where the allreduce alone takes as long)."""
    if sync <= 0:
        return step
    if step <= sync:
        return 0.0
    return (step ** gamma - sync ** gamma) ** (1 / gamma)


#: The range of gamma a fit may take (Pollux's bounds).
GAMMA_RANGE = (1.0, 10.0)
#: The gammas a fit tries, smallest first (a tie keeps the least overlap).
GAMMA_GRID = tuple(GAMMA_RANGE[0] + 0.01 * i
                   for i in range(int(round((GAMMA_RANGE[1] - GAMMA_RANGE[0]) / 0.01)) + 1))


#: Pollux's gamma of distseg's own step: it allreduces the gradients after the whole
#: backward pass, so nothing overlaps (the report's fit to runs over a shaped link found
#: 1.00-1.03, docs/studies/link-2026-11-26.md); what a prediction assumes before a run
#: has steps to fit.
NO_OVERLAP = 1.0

# --- --compression auto --------------------------------------------------------------

#: ``--compression auto`` takes fp16 where it predicts at least this many times exact
#: float32's samples/s: 10 % more, past the noise of a step and the rounding it costs.
FP16_MIN_SPEEDUP = 1.10


def exact_reason(ranks: int, one_host: bool, bandwidth_gbps: float | None) -> str | None:
    """Why ``--compression auto`` keeps exact float32 without predicting a step (one
    rank; every rank on one host, whose own path is no network to save bytes on; a probe
    that fitted no bandwidth), or None where a step must be predicted."""
    if ranks < 2:
        return "one rank: no gradient allreduce"
    if one_host:
        return "every rank on one host: its own path, not a network"
    if not bandwidth_gbps or bandwidth_gbps <= 0:
        return "the link probe fitted no bandwidth, so nothing to predict from"
    return None


def compression_choice(compute_s: float, params: float, ranks: int, bandwidth_gbps: float,
                       latency_us: float, samples_per_step: float) -> dict:
    """``--compression auto``'s prediction on a measured link: a step of ``compute_s``
    seconds of compute, then the ring allreduce of ``params`` gradients (``sync_seconds``)
    with no overlap (``NO_OVERLAP``), in float32 and in float16; fp16 where its
    samples/s are ``FP16_MIN_SPEEDUP`` times exact float32's or more. The cost of
    casting the gradients is left out (a few ms for the demo's 2 M values). Returns the
    choice, every input and the predicted numbers, and the reason in words."""
    sync = {c: sync_seconds(gradient_bytes(params, c), ranks, bandwidth_gbps, latency_us)
            for c in VALUE_BYTES}
    step = {c: step_seconds(compute_s, s, NO_OVERLAP) for c, s in sync.items()}
    rate = {c: samples_per_step / s for c, s in step.items()}
    speedup = rate["fp16"] / rate["none"]
    choice = "fp16" if speedup >= FP16_MIN_SPEEDUP else "none"
    told = (f"allreduce {sync['none'] * 1e3:.0f} ms in float32, {sync['fp16'] * 1e3:.0f} ms "
            f"in fp16, beside {compute_s:.3f} s of compute, on {bandwidth_gbps:.3g} Gbit/s")
    reason = (f"fp16 predicted {speedup:.2f}x exact float32's samples/s ({told}); "
              + (f"taken at {FP16_MIN_SPEEDUP:.2f}x or more" if choice == "fp16"
                 else f"exact float32 kept below {FP16_MIN_SPEEDUP:.2f}x"))
    return {"choice": choice, "bandwidth_gbps": bandwidth_gbps, "latency_us": latency_us,
            "ranks": ranks, "params": params,
            "gradient_bytes": {c: gradient_bytes(params, c) for c in VALUE_BYTES},
            "compute_s": compute_s, "allreduce_s": sync, "step_s": step,
            "samples_per_step": samples_per_step, "samples_per_s": rate,
            "speedup": speedup, "threshold": FP16_MIN_SPEEDUP, "gamma": NO_OVERLAP,
            "reason": reason}
