"""``--precision auto``: the precision a run trains in, decided by measuring once per
configuration.

bfloat16 pays only where the CPU has native bfloat16 arithmetic, and not always there:
it sped the demo step up on one CPU and slowed it down on another whose oneDNN also
reported bfloat16 (docs/studies/precision-auto-2026-11-26.md). So flags alone do not
decide. Where every rank's CPU reports ``avx512_bf16`` or ``amx_bf16``, the run times
``TIMED_STEPS`` steps of its own train step on its own first batch in each precision,
all ranks together; the slowest rank's median decides (a synchronous step waits for
it), and bfloat16 is kept only at ``MIN_SPEEDUP`` or more. Where any rank reports
neither flag, float32 without a trial. A resumed run keeps what its config.json holds.

The answer depends only on what ``cache_facts`` lists (the CPUs, TensorFlow and its
oneDNN, the model, the input, the per-rank batch, the threads and the ranks), so it is
kept (``precision_cache``) and a later launch of the same configuration takes it
without a trial: rank 0 reads the cache and broadcasts what it found, so every rank
takes the same decision. ``--precision-trial always`` measures again.

No rank fails alone in the trial: reading the batch, building each model and tracing
each step run inside agreement points (``agreement.agree``) before the next collective,
and a rank whose timed step fails steps once more with a blank batch and the failed
flag, so the others leave the step's allreduce and raise the same error with it.
``DISTSEG_FAIL_PRECISION_TRIAL`` (``FAIL_ENV``) is the test hook that makes one rank
fail in one of these pieces.

The trial leaves no trace: each precision's model is built from the run's own seed and
broadcast as the run's would be, its variables (weights, BatchNorm statistics, dropout
seeds), optimizer state and the step's previous-gradient memory are put back after the
timed steps, and it reads its batch with its own reader, so the data order, the noise
scale and the logs' steps are those of a run without it. The chosen precision's model,
optimizer and traced step are the run's: its first step is not traced twice.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
import statistics
import sys
import time

from distseg.core import config as config_lib
from distseg.data import feeds
from distseg.parallel import agreement
from distseg.parallel import distributed as dist
from distseg.training.progress.plan import EpochPlan
from distseg.training.startup import precision_cache, timedsteps
from distseg.training.step import factory, steps

#: /proc/cpuinfo flags of native bfloat16 arithmetic (AVX-512 BF16, AMX).
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: bfloat16 is kept when its step is at least this much faster than float32's.
MIN_SPEEDUP = 1.10
#: Steps timed per precision, after the one that traces the step.
TIMED_STEPS = 3
#: Test hook: ``RANK`` or ``RANK:PIECE`` makes that rank raise in that piece of the
#: trial (``PIECES``; ``step`` when not given), as a real failure there would.
FAIL_ENV = "DISTSEG_FAIL_PRECISION_TRIAL"
PIECES = ("batch", "build", "trace", "step")


def bf16_flags(cpuinfo: str) -> list[str]:
    """The bfloat16 flags (``BF16_FLAGS``) of the CPU that ``cpuinfo`` (the text of
    /proc/cpuinfo) describes, from its first ``flags`` line."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags") and ":" in line:
            words = set(line.split(":", 1)[1].split())
            return [f for f in BF16_FLAGS if f in words]
    return []


def cpu_model(cpuinfo: str) -> str:
    """The CPU's ``model name`` in ``cpuinfo`` ("" where it gives none)."""
    for line in cpuinfo.splitlines():
        if line.startswith("model name") and ":" in line:
            return " ".join(line.split(":", 1)[1].split())
    return ""


#: Where ``read_bf16_flags`` reads the CPU's description: /proc/cpuinfo, or another
#: machine's copy (the tests decide for a CPU without bfloat16 on one that has it).
CPUINFO_ENV = "DISTSEG_CPUINFO"


def _cpuinfo(path: str | None = None) -> str:
    path = path or os.environ.get(CPUINFO_ENV, "/proc/cpuinfo")
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def read_bf16_flags(path: str | None = None) -> list[str]:
    """``bf16_flags`` of this machine (none where its description cannot be read)."""
    return bf16_flags(_cpuinfo(path))


def read_cpu(path: str | None = None) -> dict:
    """This machine's CPU as the decision sees it: its model name and bfloat16 flags."""
    text = _cpuinfo(path)
    return {"model": cpu_model(text), "flags": bf16_flags(text)}


def choose(seconds: dict[str, float]) -> str:
    """bfloat16 when its step (``seconds``: precision -> a step's seconds) is at least
    ``MIN_SPEEDUP`` times faster than float32's, else float32."""
    return "bfloat16" if seconds["float32"] >= MIN_SPEEDUP * seconds["bfloat16"] else "float32"


def slowest_rank(mine: dict[str, float]) -> dict[str, float]:
    """Collective: per precision, the slowest rank's seconds of a step (a synchronous
    step lasts as long as its slowest rank): the same on every rank."""
    # Horovod: every rank's timings.
    everyone = dist.allgather_object(mine)
    return {p: max(r[p] for r in everyone) for p in mine}


@dataclasses.dataclass
class Decision:
    """What a run's start decided: the config with the precision to train in, the run
    record's ``precision`` field (None: the config named one) and, after a trial, the
    chosen precision's state and the train step it traced (static batch -> step), for
    the run to keep (None and {}: nothing was built)."""

    cfg: config_lib.Config
    record: dict | None
    state: factory.State | None = None
    traced: dict = dataclasses.field(default_factory=dict)


def _with_precision(cfg: config_lib.Config, precision: str) -> config_lib.Config:
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, precision=precision))


# --- what decides: the cache's key ---------------------------------------------------

#: The train fields that change what the step computes (and so its speed).
STEP_FIELDS = ("loss", "optimizer", "weight_decay", "clip_norm", "compression")
#: Model fields that change nothing the step computes.
MODEL_IGNORED = ("precision", "class_names", "fn")
#: What a ``--model-fn`` model is, for the key: its source's hash and arguments (the
#: U-Net's own fields are unused with it).
MODEL_FN_FIELDS = ("fn_sha256", "args", "spatial_dims", "in_channels", "num_classes")


def model_facts(model: config_lib.ModelConfig) -> dict:
    """The model's config as the key holds it: the ``model`` section without the
    precision (what is decided) and the class names; for ``--model-fn``, its source's
    SHA-256 and arguments, not the path it was loaded from."""
    fields = dataclasses.asdict(model)
    if model.fn:
        return {k: fields[k] for k in MODEL_FN_FIELDS}
    return {k: v for k, v in fields.items() if k not in MODEL_IGNORED + MODEL_FN_FIELDS[:2]}


def software() -> dict:
    """The versions the step's speed depends on. TensorFlow bundles its oneDNN, so its
    version and build name oneDNN's; whether oneDNN is on is ``steps.onednn_enabled``."""
    import keras
    import tensorflow as tf
    try:
        distseg_version = importlib.metadata.version("distseg")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        distseg_version = "source"
    return {"tensorflow": tf.__version__, "tensorflow_build": tf.__git_version__,
            "onednn": steps.onednn_enabled(), "keras": keras.__version__,
            "distseg": distseg_version}


def threads_in_force() -> list[int]:
    """TensorFlow's (intra-op, inter-op) threads of this rank, as start-up set them."""
    import tensorflow as tf
    return [tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads()]


def cache_facts(cfg: config_lib.Config, ctx: dist.Context, input_shape, plan: EpochPlan,
                static: int | None, cpus: list[dict], versions: dict, threads: list[int]) -> dict:
    """Everything the trial's answer depends on, the cache's key: every rank's CPU
    (model name and bfloat16 flags, each kind once), the software, the model, the
    step's loss and optimizer, the input shape, the per-rank batch (and whether the
    step is traced for it), the threads per rank, the ranks and ranks per node."""
    cpu_kinds = sorted({(c["model"], tuple(c["flags"])) for c in cpus})
    return {"cpus": [{"model": m, "flags": list(f)} for m, f in cpu_kinds],
            "software": versions, "model": model_facts(cfg.model),
            "step": {k: getattr(cfg.train, k, None) for k in STEP_FIELDS},
            "input_shape": [int(n) for n in input_shape],
            "batch_per_rank": plan.batch.per_rank, "static_batch": static,
            "threads": threads, "ranks": ctx.size, "ranks_per_node": ctx.local_size}


# --- the trial, piece by agreed piece -----------------------------------------------


def _injected(ctx: dist.Context, piece: str) -> None:
    """Raises where ``FAIL_ENV`` asks this rank to fail in ``piece`` (a test hook)."""
    spec = os.environ.get(FAIL_ENV, "")
    rank, _, where = spec.partition(":")
    if spec and rank.strip() == str(ctx.rank) and (where.strip() or "step") == piece:
        # Said as it happens, so a test can time how fast every rank learns of it.
        sys.stderr.write(f"{FAIL_ENV}: rank {ctx.rank} fails in the trial's {piece} piece\n")
        sys.stderr.flush()
        raise RuntimeError(f"failure injected in the {piece} piece ({FAIL_ENV}={spec})")


#: How the trial's errors name it.
LABEL = "--precision auto's trial"


def _agreed(what: str, fn, *args):
    """Collective: ``fn(*args)`` on every rank; a failure on any raises the same
    ``RunError`` on every rank, naming the piece ``what`` and the rank."""
    return timedsteps.agreed(LABEL, what, fn, *args)


def _first_batch(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed):
    """This rank's first batch of the run and the static batch (``timedsteps.first_batch``)."""
    _injected(ctx, "batch")
    return timedsteps.first_batch(cfg, ctx, feed)


def _build(cfg: config_lib.Config, ctx: dist.Context, input_shape) -> factory.State:
    """This rank's model and optimizer as the run builds them, not yet broadcast."""
    _injected(ctx, "build")
    return factory.build_state(cfg, ctx, input_shape, broadcast=False)


def _trace(cfg: config_lib.Config, ctx: dist.Context, state, input_shape, static):
    """``state``'s train step, traced (no step runs: tracing needs no other rank)."""
    _injected(ctx, "trace")
    step = factory.train_step(cfg, state, input_shape, ctx.size, static)
    step.get_concrete_function()
    return step


def _prepare(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed, batch):
    """Collective: ``cfg``'s state, built as the run builds it, and its step, traced on
    ``batch`` and run once; each piece agreed before the next collective."""
    p = cfg.model.precision
    state = _agreed(f"building the {p} model", _build, cfg, ctx, feed.input_shape)
    # Horovod: every rank starts from rank 0's weights and optimizer state, as the run's.
    dist.broadcast_variables(state.synced, root=0)
    kept = [v.numpy() for v in steps.trial_variables(state.model, state.optimizer)]
    step = _agreed(f"tracing the {p} step", _trace, cfg, ctx, state, feed.input_shape, batch[2])
    candidate = timedsteps.Candidate(state, step, kept, timedsteps.usual_noise_mode(cfg))
    _step(candidate, batch, ctx, f"the first {p} step")
    return candidate


def _step(candidate: timedsteps.Candidate, batch, ctx: dist.Context, what: str) -> float:
    """Collective: one timed step of ``candidate`` (``timedsteps.timed_step``), where
    ``FAIL_ENV`` may make this rank fail."""
    return timedsteps.timed_step(candidate, batch, LABEL, what, functools.partial(_injected, ctx, "step"))


def _trial(cfg, ctx, feed, flags: list) -> Decision:
    """Collective: both precisions timed on every rank, in alternation (a drift of a
    shared machine's speed then touches both alike); the slowest rank's decide."""
    start = time.perf_counter()
    batch = _agreed("reading its first batch", _first_batch, cfg, ctx, feed)
    candidates = {p: _prepare(_with_precision(cfg, p), ctx, feed, batch)
                  for p in config_lib.PRECISIONS}
    for i in range(TIMED_STEPS):
        for p, candidate in candidates.items():
            candidate.seconds.append(_step(candidate, batch, ctx, f"{p} timed step {i + 1}"))
    slowest = slowest_rank({p: statistics.median(c.seconds) for p, c in candidates.items()})
    choice = choose(slowest)
    chosen = candidates[choice]
    timedsteps.put_back(chosen)
    speedup = slowest["float32"] / slowest["bfloat16"]
    trial_s = time.perf_counter() - start
    record = {"requested": config_lib.AUTO, "flags": flags, "seconds": slowest,
              "speedup": speedup, "choice": choice, "steps": TIMED_STEPS,
              "trial_s": trial_s, "decision_s": trial_s, "source": "trial",
              "reason": f"bfloat16 step {speedup:.2f}x float32's "
                        f"(kept at {MIN_SPEEDUP:.2f}x or more)"}
    static = batch[2]
    return Decision(_with_precision(cfg, choice), record, chosen.state, {static: chosen.step})


# --- the decision ---------------------------------------------------------------------


def without_trial(cfg: config_lib.Config) -> config_lib.Config:
    """``cfg`` where no trial can run (an elastic run, whose ranks build their state
    before they may talk): ``auto`` means float32 there."""
    return _with_precision(cfg, "float32") if cfg.model.precision == config_lib.AUTO else cfg


def say(ctx: dist.Context, message: str) -> None:
    """Rank 0's line on stderr (the run's console opens after start-up)."""
    if ctx.is_root():
        sys.stderr.write(f"{message}\n")
        sys.stderr.flush()


def _no_flag(cfg: config_lib.Config, ctx: dist.Context, flags: list) -> Decision:
    record = {"requested": config_lib.AUTO, "flags": flags, "seconds": None,
              "choice": "float32", "trial_s": 0.0, "decision_s": 0.0, "source": "flags",
              "reason": "no bfloat16 flag (avx512_bf16, amx_bf16) on "
                        f"{'this machine' if ctx.size == 1 else 'some rank'}'s CPU: no trial"}
    return Decision(_with_precision(cfg, "float32"), record)


def _lookup(cache: precision_cache.Cache | None, facts: dict):
    """Rank 0's kept decision for ``facts`` (None elsewhere, on a miss, and under
    ``--precision-trial always``); raises only for a bad ``$DISTSEG_PRECISION_TRIAL``."""
    if cache is None or precision_cache.trial_mode() == "always":
        return None
    return cache.lookup(facts)


def _from_cache(cfg: config_lib.Config, ctx: dist.Context, entry, flags: list,
                start: float) -> Decision:
    """The decision a kept ``entry`` holds, for the run record and the console."""
    o = entry.outcome
    record = {"requested": config_lib.AUTO, "flags": flags, "seconds": o["seconds"],
              "speedup": o["speedup"], "choice": o["choice"], "steps": o.get("steps"),
              "trial_s": 0.0, "decision_s": time.perf_counter() - start, "source": "cache",
              "cached": {"from": entry.measured_at, "trial_s": o["trial_s"], "file": entry.path},
              "reason": f"cached, from {entry.measured_at}: {o.get('reason', '')}".rstrip(": ")}
    say(ctx, f"precision auto: {o['choice']}, cached, from {entry.measured_at} "
             f"({entry.path}; a {o['trial_s']:.1f} s trial skipped, "
             "--precision-trial always measures again)")
    return Decision(_with_precision(cfg, o["choice"]), record)


def _keep(cache: precision_cache.Cache | None, facts: dict, record: dict) -> str | None:
    """Rank 0 keeps the trial's outcome (None elsewhere, or where it cannot)."""
    if cache is None:
        return None
    outcome = {k: record[k] for k in ("choice", "seconds", "speedup", "steps", "trial_s",
                                      "reason")}
    return cache.store(facts, outcome)


def _facts(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed, cpus: list) -> dict:
    plan = EpochPlan.of(cfg.train, len(feed.train_ids), ctx.size)
    static = plan.static_batch(len(feed.train_ids), ctx.size)
    return cache_facts(cfg, ctx, feed.input_shape, plan, static, cpus, software(),
                       threads_in_force())


def decide(cfg: config_lib.Config, ctx: dist.Context, feed: feeds.Feed) -> Decision:
    """Collective: the precision a new run trains in: kept from an earlier launch of
    the same configuration, else measured (and kept); where a trial ran, the chosen
    precision's state and traced step too (nothing is built otherwise)."""
    if cfg.model.precision != config_lib.AUTO:
        return Decision(cfg, None)
    start = time.perf_counter()
    cpu = read_cpu()
    # Horovod: every rank's CPU; one rank without bfloat16 decides for all.
    cpus = dist.allgather_object(cpu)
    if not all(c["flags"] for c in cpus):
        return _no_flag(cfg, ctx, cpu["flags"])
    facts = _agreed("describing the configuration", _facts, cfg, ctx, feed, cpus)
    cache = precision_cache.Cache(warn=lambda m: say(ctx, f"warning: {m}")) if ctx.is_root() else None
    # Rank 0 reads the cache; every rank takes what it found (a hit or a miss for all).
    entry = dist.broadcast_object(agreement.agree(_lookup, cache, facts))
    if entry is not None:
        return _from_cache(cfg, ctx, entry, cpu["flags"], start)
    decided = _trial(cfg, ctx, feed, cpu["flags"])
    kept = agreement.agree(_keep, cache, facts, decided.record)
    say(ctx, f"precision auto: {decided.record['choice']} from a "
             f"{decided.record['trial_s']:.1f} s trial: {decided.record['reason']}"
             + (f"; kept in {kept}" if kept else ""))
    return decided
