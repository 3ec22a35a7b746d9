"""``make bench``: one table of speed ratios, each goal beside what was measured.

Every ratio is measured in this one run on this machine, the variants of a ratio
interleaved (``--rounds`` times, ``round_order``) so the load of a shared machine hits
both, and like with like: distseg trains in its default precision (``auto``: decided by
a timed trial at each run's start where the CPU has bfloat16), and each peer, A/B and
strong-scaling run in the precision its distseg run of the same round chose
(``precision.choice`` of that run's ``run`` record; ``PAIRED``). The results record what
each run trained in, and the table says it:

* distseg on 1 rank against Keras ``fit`` (``benchmarks/peers/keras_fit.py``);
* distseg on 2 Horovod ranks against 1 rank;
* distseg on 2 ranks against ``MultiWorkerMirroredStrategy`` with 2 workers
  (``benchmarks/peers/mwms.py``: same model, data, global batch and threads);
* training FLOP/s (FLOPs counted from the model, ``benchlib.flops``, times the 1-rank
  samples/s) against dense fp32 ``tf.matmul`` FLOP/s at the same thread count;
* bf16 against fp32 train-step time (``benchlib.precision``): distseg's
  ``--precision bfloat16`` and a plain Keras ``mixed_bfloat16`` policy, with the
  validation Dice of both precisions trained side by side (``--bf16-dice-epochs``);
* the input pipeline alone against what training consumes, and the share of step
  time spent waiting for data (from the runs' step records);
* allreduce bandwidth at the gradient size against memory-copy bandwidth
  (``benchlib.bandwidth``);

plus the statistical-efficiency rows of the newest ``bench/results/stateff-*.json``
(written by ``benchmarks/bench_stateff.py``). distseg runs through its own CLI
(``distseg-train``, ``horovodrun -np 2 -H localhost:2 distseg-train``) on the demo
configuration, one intra-op thread per rank; throughput counts the epochs after the
first (the precision trial runs before them). Results, with the machine description, go to
``bench/results/bench-<date>-<time>.json``.

and the fixed-global-batch study's rows: one rank's samples/s at per-rank batches 1, 2 and 4 against 8 (what
strong scaling costs per sample), and the step-time cost of the global loss's allreduce
and the noise scale's norms at 2 ranks (``distseg-2`` against ``distseg-2+localloss``,
the step before them); ``--skip strong_scaling`` leaves them out.

``--ab NAME,...`` adds distseg runs with local copies of some pieces changed
(``benchlib.train_variant``; changes in ``MODIFIERS``), e.g. ``distseg-1+kerasbn`` or
``distseg-2+nocheck+checksum+cycle1``, each with its ratio to plain distseg and to the
peer in the same run. ``--trainers`` and ``--skip`` leave parts out for a quick A/B.

    python benchmarks/bench_table.py --data data/liver117.h5
    python benchmarks/bench_table.py --trainers distseg-1,distseg-2 --skip precision,pipeline,bandwidth \
        --ab distseg-2+nocheck,distseg-2+cycle1
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from benchlib import launch, machine, table  # noqa: E402
from benchlib.args import add_config, add_results_dir  # noqa: E402
from benchlib.runlogs import rank_records, run_precision, run_throughput  # noqa: E402
from benchlib.table import Goal  # noqa: E402

#: The runs every round trains, in this order.
BASE_TRAINERS = ("distseg-1", "keras-fit", "distseg-2", "mwms-2")
#: The fixed-global-batch study's runs: what strong scaling costs per sample on this CPU (1 rank at a
#: per-rank batch of 1, 2 and 4 beside ``distseg-1``'s 8), and the step before the
#: global loss and the noise scale (``localloss``) beside ``distseg-2``.
PER_RANK_BATCHES = (1, 2, 4)
STRONG_SCALING_TRAINERS = tuple(f"distseg-1+b{b}" for b in PER_RANK_BATCHES) + ("distseg-2+localloss",)
#: Peer -> the distseg run of the same round whose precision it trains in.
PAIRED = {"keras-fit": "distseg-1", "mwms-2": "distseg-2"}

#: Changes ``--ab`` can add to a distseg run: (benchlib.train_variant arguments, env,
#: distseg-train flags). ``cycleMS`` sets HOROVOD_CYCLE_TIME to MS.
MODIFIERS = {
    "kerasbn": (["--model", "kerasbn"], {}, []),
    "kerasgn": (["--model", "kerasgn"], {}, []),
    "bf16": ([], {}, ["--precision", "bfloat16"]),
    "checksum": (["--checksum", "compiled"], {}, []),
    "nocheck": (["--step", "nocheck"], {}, []),
    "sumcheck": (["--step", "sumcheck"], {}, []),
    "bare": (["--step", "bare"], {}, []),
    "localloss": (["--step", "localloss"], {}, []),
    "nopin": ([], {"DISTSEG_PIN": "0"}, []),
    # The noise scale's statistics on the launch's first step only: what the rest of
    # distseg's loop costs against a peer's.
    "nostats": ([], {}, ["--noise-every", "1000000"]),
}

GOALS = {
    "vs_keras": Goal(">=", 1.00),
    "vs_mwms": Goal(">=", 1.05),
    "scaling": Goal(">=", 1.90),
    "flops": Goal(">=", 0.80),
    "bf16": Goal(">=", 1.30),  # and validation Dice within BF16_DICE_TOLERANCE
    "data_wait": Goal("<", 2.0, "%", "{:g}"),
    "pipeline": Goal(">=", 1.00),
    "global_loss_cost": Goal("<=", 3.0, "%", "{:.1f}"),
}

STATEFF_MEASURES = ("time to validation Dice target, 2 vs 1 ranks",
                    "validation Dice never falls > 0.1 between epochs",
                    "samples to target at 2, 4 and 8 ranks vs 1",
                    "predicted vs measured samples to target, 8 ranks x 8 slices")


@dataclass
class Settings:
    data: str
    preset: str
    epochs: int
    rounds: int
    batch_size: int
    threads: int
    results_dir: str
    ab: list[str]
    bf16_dice_epochs: int
    bf16_dice_seeds: str = "0"
    trainers: list[str] = field(default_factory=lambda: list(BASE_TRAINERS))
    skip: set = field(default_factory=set)
    config: str | None = None
    workdir: str = ""
    env: dict = field(default_factory=dict)


def parse_args(argv=None) -> Settings:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(REPO, "data", "liver117.h5"))
    p.add_argument("--preset", default="demo")
    p.add_argument("--epochs", type=int, default=4, help="per training run; the first is not timed")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds of every training run (the median of 3 resists one disturbed round)")
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (inter-op: 1)")
    add_config(add_results_dir(p))
    p.add_argument("--ab", default="", help="extra distseg runs, e.g. distseg-1+kerasbn,distseg-2+nocheck")
    p.add_argument("--trainers", default=",".join(BASE_TRAINERS),
                   help="the base runs of every round (a subset, for a quick A/B)")
    p.add_argument("--skip", default="",
                   help="measurements to leave out: precision, pipeline, bandwidth, strong_scaling")
    p.add_argument("--bf16-dice-epochs", type=int, default=8,
                   help="train fp32 and bf16 this many epochs and compare validation Dice (0: no)")
    p.add_argument("--bf16-dice-seeds", default="0", help="seeds to train each with (Dice: the mean)")
    a = p.parse_args(argv)
    if a.epochs < 2:
        p.error("--epochs must be >= 2 (the first epoch is not timed)")
    ab = [n for n in a.ab.split(",") if n]
    for name in ab:
        check_trainer_name(name, p.error)
    trainers = [n for n in a.trainers.split(",") if n]
    skip = {n for n in a.skip.split(",") if n}
    if not set(trainers) <= set(BASE_TRAINERS) or not skip <= set(MEASUREMENTS) | {"strong_scaling"}:
        p.error(f"--trainers takes {', '.join(BASE_TRAINERS)}; --skip takes "
                f"{', '.join(MEASUREMENTS)}, strong_scaling")
    for peer, lead in PAIRED.items():
        if peer in trainers and lead not in trainers:
            p.error(f"--trainers: {peer} trains in the precision {lead} chose; add {lead}")
    if "strong_scaling" not in skip:
        ab += [n for n in STRONG_SCALING_TRAINERS if n not in ab]
    return Settings(data=a.data, preset=a.preset, epochs=a.epochs, rounds=a.rounds,
                    batch_size=a.batch_size, threads=a.threads, results_dir=a.results_dir,
                    ab=ab, bf16_dice_epochs=a.bf16_dice_epochs, bf16_dice_seeds=a.bf16_dice_seeds,
                    trainers=trainers, skip=skip, env=launch.command_env(),
                    config=os.path.abspath(a.config) if a.config else None)


def check_trainer_name(name: str, error) -> None:
    base, *mods = name.split("+")
    if base not in ("distseg-1", "distseg-2"):
        error(f"--ab {name}: must start with distseg-1 or distseg-2")
    for m in mods:
        if m not in MODIFIERS and not re.fullmatch(r"cycle[0-9.]+|b[0-9]+", m):
            error(f"--ab {name}: unknown change {m!r} (known: {', '.join(MODIFIERS)}, cycleMS, bN)")


# --- running things --------------------------------------------------------------


def run_command(cmd: list[str], s: Settings, env: dict | None = None,
                timeout: float = 900) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``cmd``, run in its own process group so that
    everything it started (horovodrun's mpirun and ranks) ends with it: on a timeout,
    Ctrl-C or SIGTERM, the whole group is killed before the error goes on."""
    proc = subprocess.Popen(cmd, env={**s.env, **(env or {})}, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, out, err


def run_json(cmd: list[str], s: Settings, env: dict | None = None, timeout: float = 900) -> dict:
    """Runs ``cmd`` and returns the last JSON line it printed (any rank prefix cut)."""
    code, out, err = run_command(cmd, s, env, timeout)
    lines = [re.sub(r"^\[\d+,\d+\]<stdout>:", "", line) for line in out.splitlines()]
    found = [line for line in lines if line.startswith("{")]
    if code or not found:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed ({code}):\n{(err or out)[-2000:]}")
    return json.loads(found[-1])


def config_args(s: Settings) -> list[str]:
    """``--config FILE`` where the benchmark was given one: every trainer, distseg and
    peer alike, builds its model and optimizer from the preset under it."""
    return ["--config", s.config] if s.config else []


def train_args(s: Settings) -> list[str]:
    return ["--preset", s.preset, *config_args(s), "--data", s.data, "--epochs", str(s.epochs),
            "--batch-size", str(s.batch_size), "--no-validate", "--checkpoint-every", "0"]


def distseg_command(name: str, s: Settings, run_dir: str,
                    precision: str | None = None) -> tuple[list[str], dict, int]:
    """(command, extra env, ranks) of a distseg run ``distseg-N[+change...]``, in
    ``precision`` (None: distseg's default, ``auto``, or what a change names)."""
    base, *mods = name.split("+")
    ranks = int(base.split("-")[1])
    variant_args, env, flags = [], {}, []
    for m in mods:
        if m.startswith("cycle"):
            env["HOROVOD_CYCLE_TIME"] = m[len("cycle"):]
            continue
        if m[:1] == "b" and m[1:].isdigit():  # bN: N samples per rank (the last flag wins)
            flags += ["--batch-size", m[1:]]
            continue
        variant_args += MODIFIERS[m][0]
        env.update(MODIFIERS[m][1])
        flags += MODIFIERS[m][2]
    paired = ["--precision", precision] if precision else []
    # The change's flags after the base ones: where both name one (bN), the change wins.
    cmd = launch.train_command(train_args(s) + paired + flags, run_dir, ranks=ranks,
                               threads=s.threads, variant=variant_args)
    return cmd, env, ranks


def data_wait_share(run_dir: str, ranks: int) -> float:
    """Seconds waiting for data over seconds of step, all ranks, epochs after the first."""
    wait = total = 0.0
    for records in rank_records(run_dir, ranks):
        for r in records:
            if r["type"] == "step" and r["epoch"] > 0:
                wait += r["data_wait"]
                total += r["step_time"]
    return wait / total if total else float("nan")


def run_distseg(name: str, s: Settings, precision: str | None = None) -> dict:
    """One distseg run (``distseg_command``): its samples/s, data wait, and the precision
    it trained in with its ``run`` record's account of it (``precision_decision``)."""
    run_dir = tempfile.mkdtemp(dir=s.workdir, prefix=name.replace("+", "_") + "-")
    os.rmdir(run_dir)  # distseg-train wants a new directory
    cmd, env, ranks = distseg_command(name, s, run_dir, precision)
    code, _, err = run_command(cmd, s, env)
    if code:
        raise RuntimeError(f"{name} failed ({code}):\n{err[-2000:]}")
    decision = run_precision(run_dir)
    return {"samples_per_s": run_throughput(run_dir, ranks),
            "data_wait_share": data_wait_share(run_dir, ranks),
            "precision": decision["choice"], "precision_decision": decision}


def lead_of(name: str) -> str:
    """The plain distseg run whose precision ``name`` trains in (itself for one)."""
    return PAIRED.get(name, name.split("+")[0])


def paired_precision(name: str, chosen: dict[str, str]) -> str | None:
    """The precision ``name`` trains in, given what this round's distseg runs ``chosen``:
    its distseg run's choice; None for a plain distseg run (it decides), one whose
    distseg run did not run, or one whose change names its own (``bf16``)."""
    if any("--precision" in MODIFIERS[m][2] for m in name.split("+")[1:] if m in MODIFIERS):
        return None
    return chosen.get(lead_of(name))


def run_trainer(name: str, s: Settings, precision: str | None = None) -> dict:
    """One training run of ``name`` in ``precision`` (None: distseg's ``auto``; a peer
    always has one); returns its samples/s (and more), timed."""
    start, load = time.perf_counter(), machine.load_average()
    if name.startswith("distseg"):
        result = run_distseg(name, s, precision)
    else:
        peer = {"keras-fit": ["peers.keras_fit"], "mwms-2": ["peers.mwms", "--workers", "2"]}[name]
        result = run_json([sys.executable, "-m", *peer, "--data", s.data, "--preset", s.preset,
                           "--epochs", str(s.epochs), "--batch-size", str(s.batch_size),
                           "--threads", str(s.threads), "--precision", precision,
                           *config_args(s)], s, timeout=900)
    paired = {"precision_of": lead_of(name)} if precision else {}
    return {**result, **paired, "wall_s": time.perf_counter() - start, "load_before": load}


def measure_gemm(s: Settings, precision: str) -> dict:
    return run_json([sys.executable, "-m", "benchlib.flops", "--preset", s.preset, "--data", s.data,
                     "--threads", str(s.threads), "--precision", precision], s)


def measure_precision(s: Settings) -> dict:
    modes = ["float32", "bfloat16", "keras_mixed"]
    for variant in ("kerasbn", "kerasgn"):
        if any(variant in n for n in s.ab):
            modes += [f"float32:{variant}", f"bfloat16:{variant}"]
    return run_json([sys.executable, "-m", "benchlib.precision", "--data", s.data,
                     "--preset", s.preset, "--threads", str(s.threads), "--modes", ",".join(modes),
                     "--dice-epochs", str(s.bf16_dice_epochs), "--dice-modes", "float32,bfloat16",
                     "--dice-seeds", s.bf16_dice_seeds],
                    s, timeout=1200)


def measure_pipeline(s: Settings) -> dict:
    return run_json([sys.executable, "-m", "benchlib.pipeline", "--data", s.data,
                     "--preset", s.preset, "--epochs", str(s.epochs),
                     "--batch-size", str(s.batch_size)], s)


def measure_bandwidth(s: Settings) -> dict:
    reduce = run_json([*launch.horovodrun(2), sys.executable, "-m", "benchlib.bandwidth", "allreduce",
                       "--preset", s.preset, "--data", s.data, "--threads", str(s.threads)], s)
    copy = run_json([sys.executable, "-m", "benchlib.bandwidth", "memcpy",
                     "--bytes", str(reduce["bytes"])], s)
    return {**reduce, **copy}


#: The measurements after the training rounds, each one subprocess or two.
MEASUREMENTS = {"precision": measure_precision, "pipeline": measure_pipeline,
                "bandwidth": measure_bandwidth}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def round_order(names: list[str], r: int) -> list[str]:
    """The runs of round ``r`` (from 0), in groups: a plain distseg run first (it
    decides the precision the rest of its group trains in, so it runs before them),
    then its peer (right after it), then its A/B and strong-scaling runs. Every other
    round the groups, and the A/B runs within each, go in reverse order, so a load
    that grows or fades during the benchmark biases neither side of a ratio between
    groups (2 ranks / 1 rank) or between A/B runs. A peer always follows its distseg
    run, so such a load tilts that ratio slightly: the price of knowing the precision
    before the peer starts."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(lead_of(name), []).append(name)
    order = []
    for lead, members in groups.items() if r % 2 == 0 else reversed(groups.items()):
        head = [lead] * (lead in members) + [n for n in members if n in PAIRED]
        rest = [n for n in members if n not in head]
        order += head + (rest if r % 2 == 0 else rest[::-1])
    return order


def interleaved_training(s: Settings) -> dict:
    """Every training run, ``s.rounds`` times, interleaved (``round_order``), each peer,
    A/B and strong-scaling run in the precision its distseg run of the round chose; and
    the GEMM rate once per round, so it sees the same machine as the runs."""
    names = list(s.trainers) + s.ab
    runs = {n: [] for n in names}
    gemm = []
    for r in range(s.rounds):
        chosen: dict[str, str] = {}
        for name in round_order(names, r):
            got = run_trainer(name, s, paired_precision(name, chosen))
            runs[name].append(got)
            if name == lead_of(name):
                chosen[name] = got["precision"]
            log(f"round {r + 1}/{s.rounds} {name:24s} {got['samples_per_s']:7.2f} samples/s "
                f"({got['precision']})")
        gemm.append(measure_gemm(s, chosen.get("distseg-1", "float32")))
        log(f"round {r + 1}/{s.rounds} {'fp32 GEMM':24s} {gemm[-1]['gemm_flops_per_s'] / 1e9:7.1f} GFLOP/s")
    return {"runs": runs, "gemm": gemm}


# --- from measurements to rows ----------------------------------------------------


def median_of(runs: list[dict], key: str = "samples_per_s") -> float:
    return statistics.median(r[key] for r in runs)


def precision_text(runs: list[dict]) -> str | None:
    """What ``runs`` trained in: one precision, or each round's in turn; None where a
    run recorded none (results from before ``auto``)."""
    got = [r.get("precision") for r in runs]
    if not got or None in got:
        return None
    return got[0] if len(set(got)) == 1 else "/".join(got)


def ratio(results: dict, a: str, b: str) -> tuple[float | None, str]:
    """(median samples/s of ``a`` / of ``b``, the numbers behind it in words, with the
    precision each trained in); None when one of them was not run (``--trainers``)."""
    runs = results["training"]["runs"]
    if a not in runs or b not in runs:
        return None, f"{b if a in runs else a} not run"
    x, y = median_of(runs[a]), median_of(runs[b])
    per_round = ", ".join(f"{p['samples_per_s'] / q['samples_per_s']:.2f}" for p, q in zip(runs[a], runs[b]))
    pa, pb = precision_text(runs[a]), precision_text(runs[b])
    trained = f"; {pa} vs {pb}" if pa and pb else ""
    return x / y, f"{x:.1f} vs {y:.1f} samples/s (rounds: {per_round}){trained}"


def speed_rows(results: dict) -> list[table.Row]:
    """The distseg-against-peers and scaling rows."""
    rows = []
    for measure, a, b, goal in (("distseg 1 rank / Keras fit (samples/s)", "distseg-1", "keras-fit", "vs_keras"),
                                ("distseg 2 ranks / 1 rank (samples/s)", "distseg-2", "distseg-1", "scaling"),
                                ("distseg 2 ranks / MultiWorkerMirroredStrategy 2 workers", "distseg-2",
                                 "mwms-2", "vs_mwms")):
        value, detail = ratio(results, a, b)
        rows.append(table.measured_row(measure, GOALS[goal], value, detail))
    return rows


def gemm_peak(results: dict, bf16: bool = False) -> float:
    """The fastest GEMM rate seen in the run's rounds (FLOP/s)."""
    key = "gemm_bf16_flops_per_s" if bf16 else "gemm_flops_per_s"
    return max(g[key] for g in results["training"]["gemm"])


def trained_bf16(run: dict, name: str) -> bool:
    """Whether a run of ``name`` trained in bfloat16 (its recorded precision; in results
    from before ``auto``, its ``+bf16`` change)."""
    return run.get("precision", "bfloat16" if "+bf16" in name else "float32") == "bfloat16"


def flops_row(results: dict, name: str = "distseg-1") -> table.Row:
    """Training FLOP/s of the 1-rank run ``name`` over the GEMM peak of the precision it
    trained in: the median over rounds, each run against its own precision's peak."""
    gemm = results["training"]["gemm"][0]
    runs = results["training"]["runs"].get(name, [])
    kinds = sorted({trained_bf16(r, name) for r in runs} or {"+bf16" in name})
    kind = " or ".join("bf16" if bf16 else "fp32" for bf16 in kinds)
    measure = (f"training FLOP/s / {kind} GEMM FLOP/s" if name == "distseg-1"
               else f"A/B {name}: training FLOP/s / {kind} GEMM FLOP/s")
    if not runs:
        return table.measured_row(measure, GOALS["flops"], None, f"{name} not run")
    per_sample = gemm["train_flops_per_sample"]
    train = per_sample * median_of(runs)
    value = statistics.median(per_sample * r["samples_per_s"] / gemm_peak(results, trained_bf16(r, name))
                              for r in runs)
    peaks = " or ".join(f"{gemm_peak(results, bf16) / 1e9:.1f}" for bf16 in kinds)
    detail = (f"{train / 1e9:.1f} vs {peaks} GFLOP/s ({per_sample / 1e9:.2f} GFLOP per sample "
              f"x samples/s; fastest {gemm['gemm_n']}^3 {kind} matmul), "
              f"{gemm['threads']} thread")
    return table.measured_row(measure, GOALS["flops"], value, detail)


#: How far bf16's validation Dice may be from fp32's for its speed to count.
BF16_DICE_TOLERANCE = 0.01


def precision_rows(results: dict) -> list[table.Row]:
    """bf16 against fp32 step speed; the goal counts only with validation Dice within
    ``BF16_DICE_TOLERANCE`` of fp32's (trained side by side, ``--bf16-dice-epochs``)."""
    p = results.get("precision")
    if p is None:
        return [table.measured_row("bf16 / fp32 step speed", GOALS["bf16"], None, "skipped (--skip)")]
    t, dice = p["step_seconds"], p.get("val_liver_dice") or {}
    rows = []
    for fp32, bf16, label in (("float32", "bfloat16", "distseg --precision bfloat16"),
                              ("float32", "keras_mixed", "Keras mixed_bfloat16 policy"),
                              ("float32:kerasbn", "bfloat16:kerasbn", "both with Keras' BatchNormalization"),
                              ("float32:kerasgn", "bfloat16:kerasgn", "both with Keras' GroupNormalization")):
        if fp32 not in t or bf16 not in t:
            continue
        row = table.measured_row(f"bf16 / fp32 step speed ({label})", GOALS["bf16"], t[fp32] / t[bf16],
                                 f"{t[fp32] * 1e3:.0f} vs {t[bf16] * 1e3:.0f} ms per step")
        if fp32 in dice and bf16 in dice:
            close = abs(dice[bf16] - dice[fp32]) <= BF16_DICE_TOLERANCE
            row = dataclasses.replace(
                row, met=row.met and close,
                detail=f"{row.detail}; val liver Dice {dice[bf16]:.3f} vs {dice[fp32]:.3f} "
                       f"after {p['dice_epochs']} epochs, mean of {len(p.get('dice_seeds', [0]))} "
                       f"seed(s) (within {BF16_DICE_TOLERANCE}: {'yes' if close else 'NO'})")
        else:
            row = dataclasses.replace(row, met=None, detail=f"{row.detail}; Dice not compared")
        rows.append(row)
    return rows


def input_rows(results: dict) -> list[table.Row]:
    runs = results["training"]["runs"]
    shares = [median_of(runs[n], "data_wait_share") for n in ("distseg-1", "distseg-2") if n in runs]
    if not shares or "pipeline" not in results or "distseg-1" not in runs:
        return [table.measured_row("data wait share of step time", GOALS["data_wait"],
                                   100 * max(shares) if shares else None, fmt="{:.3f}"),
                table.measured_row("input pipeline alone / training consumption", GOALS["pipeline"],
                                   None, "skipped (--skip or --trainers)")]
    share = max(shares)
    consumed = median_of(runs["distseg-1"])
    supplied = results["pipeline"]["samples_per_s"]
    return [
        table.measured_row("data wait share of step time", GOALS["data_wait"], 100 * share,
                           "worst of 1 and 2 ranks, epochs after the first", fmt="{:.3f}"),
        table.measured_row("input pipeline alone / training consumption", GOALS["pipeline"],
                           supplied / consumed, f"{supplied:.0f} vs {consumed:.1f} samples/s "
                           "(reader + prefetcher thread alone, 1 rank)"),
    ]


def bandwidth_row(results: dict) -> table.Row:
    b = results.get("bandwidth")
    if b is None:
        return table.measured_row("allreduce / memcpy bandwidth at the gradient size", None, None,
                                  "skipped (--skip)")
    return table.measured_row(
        "allreduce / memcpy bandwidth at the gradient size", None,
        b["allreduce_bytes_per_s"] / b["memcpy_bytes_per_s"],
        f"{b['allreduce_bytes_per_s'] / 1e9:.2f} vs {b['memcpy_bytes_per_s'] / 1e9:.1f} GB/s, "
        f"{b['bytes'] / 1e6:.1f} MB, {b['seconds'] * 1e3:.1f} ms per allreduce "
        f"({b['controller']}, 2 ranks)", fmt="{:.3f}")


def ab_rows(results: dict) -> list[table.Row]:
    """For every ``--ab`` run: its samples/s over plain distseg's, and over the peer."""
    rows = []
    for name in results["training"]["runs"]:
        if "+" not in name or name in STRONG_SCALING_TRAINERS:
            continue
        base = name.split("+")[0]
        value, detail = ratio(results, name, base)
        rows.append(table.measured_row(f"A/B {name} / {base}", None, value, detail, fmt="{:.3f}"))
        peer, goal = ("keras-fit", "vs_keras") if base == "distseg-1" else ("mwms-2", "vs_mwms")
        value, detail = ratio(results, name, peer)
        rows.append(table.measured_row(f"A/B {name} / {peer}", GOALS[goal], value, detail))
        if base == "distseg-1":
            rows.append(flops_row(results, name))
        if base == "distseg-2" and f"distseg-1+{name.split('+', 1)[1]}" in results["training"]["runs"]:
            value, detail = ratio(results, name, f"distseg-1+{name.split('+', 1)[1]}")
            rows.append(table.measured_row(f"A/B {name} / same change on 1 rank", GOALS["scaling"],
                                           value, detail))
    return rows


def strong_scaling_rows(results: dict) -> list[table.Row]:
    """The fixed-global-batch study: per-sample speed at per-rank batches 1, 2, 4 against 8 (one rank), and
    what the global loss's allreduce and the noise scale's norms cost a 2-rank step
    (1 - distseg-2 / distseg-2+localloss, in %)."""
    rows = []
    for b in PER_RANK_BATCHES:
        value, detail = ratio(results, f"distseg-1+b{b}", "distseg-1")
        rows.append(table.measured_row(f"1 rank, per-rank batch {b} / batch 8 (samples/s)", None,
                                       value, detail))
    value, detail = ratio(results, "distseg-2", "distseg-2+localloss")
    cost = None if value is None else 100.0 * (1.0 - value)
    rows.append(table.measured_row("global Dice allreduce + noise scale: step-time cost at 2 ranks",
                                   GOALS["global_loss_cost"], cost, detail))
    return rows


def how_chosen(runs: list[dict]) -> str:
    """How the runs of one name came to their precision: the distseg run they took it
    from, the ``auto`` trial of each round (the bfloat16 step's speed-up over float32's,
    or why none ran), or the precision a change asked for."""
    leads = sorted({r["precision_of"] for r in runs if r.get("precision_of")})
    if leads:
        return f"{', '.join(leads)}'s choice"
    decisions = [r.get("precision_decision") or {} for r in runs]
    asked = sorted({d.get("requested") for d in decisions} - {"auto"})
    if asked:
        return f"--precision {'/'.join(map(str, asked))}"
    speedups = [d["speedup"] for d in decisions if d.get("speedup") is not None]
    if speedups:
        return f"auto: bfloat16 step {'/'.join(f'{x:.2f}' for x in speedups)}x float32's"
    return f"auto: {decisions[0].get('reason', 'no trial')}"


def precision_note(results: dict) -> str:
    """The line under the table: what each run trained in, and how it came to it."""
    parts = [f"{name} {precision_text(runs)} ({how_chosen(runs)})"
             for name, runs in results["training"]["runs"].items() if precision_text(runs)]
    return f"Precision: {'; '.join(parts)}." if parts else ""


def all_rows(results: dict, results_dir: str) -> list[table.Row]:
    return (speed_rows(results) + [flops_row(results)] + precision_rows(results)
            + input_rows(results) + [bandwidth_row(results)] + strong_scaling_rows(results)
            + ab_rows(results) + table.stateff_rows(results_dir, STATEFF_MEASURES))


# --- the run ----------------------------------------------------------------------


def stop_on_sigterm(signum, frame) -> None:
    """SIGTERM ends the benchmark like Ctrl-C: the running command's process group is
    killed and the work directory removed."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    s = parse_args(argv)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    if not os.path.exists(s.data):
        sys.exit(f"error: {s.data}: no such data file (make demo builds data/liver117.h5)")
    start, load_start = time.perf_counter(), machine.load_average()
    threads = {"intra_op_per_rank": s.threads, "inter_op_per_rank": 1}
    results = {"settings": {k: sorted(v) if isinstance(v, set) else v for k, v in vars(s).items()
                            if k not in ("env", "workdir")},
               "machine": machine.describe(REPO, threads), "load_average_start": load_start}
    s.workdir = tempfile.mkdtemp(prefix="distseg-bench-")  # under $TMPDIR
    try:
        results["training"] = interleaved_training(s)
        for name, measure in MEASUREMENTS.items():
            if name not in s.skip:
                results[name] = measure(s)
                log(f"{name} measured")
    finally:
        shutil.rmtree(s.workdir, ignore_errors=True)
    rows = all_rows(results, s.results_dir)
    results.update(rows=[r.to_dict() for r in rows], load_average_end=machine.load_average(),
                   wall_seconds=time.perf_counter() - start,
                   date=time.strftime("%Y-%m-%d %H:%M:%S %z"))
    path = launch.write_result(results, s.results_dir, "bench")
    print(table.format_table(rows))
    print(f"\n{precision_note(results)}")
    print(f"\n{results['machine']['cpu_model']}, {results['machine']['physical_cores']} cores; "
          f"load average {load_start[0] if load_start else '?'} at the start, "
          f"{results['load_average_end'][0] if results['load_average_end'] else '?'} at the end; "
          f"{results['wall_seconds'] / 60:.1f} min. Results: {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
