"""Two nodes joined by a link of a set rate: samples/s of 2 ranks (one per node) against
one process, with and without fp16 gradient compression, and the same U-Net under
``tf.distribute.MultiWorkerMirroredStrategy`` over the same link, in one run.

The nodes are two network namespaces on this machine joined by a veth pair whose ends
are shaped with ``tc ... tbf`` (``benchlib.netns``); one rank per node, one thread per
rank. Variants are interleaved round by round (the machine is shared and noisy), the
first epoch of every run (tracing) is not timed, and the medians are printed with the
link each distseg run measured at its start (the ``run`` record's ``link``). Every run,
MWMS's included, computes in one precision, ``--precision`` (float32 by default, as the
link results so far): ``auto``'s trial at each run's start could choose differently from
run to run and variant to variant.

    python benchmarks/bench_link.py --rates 1gbit,10gbit,none --models demo,liver2d

Needs root (network namespaces); says why not otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from distseg.core import link, rundir, timeline  # noqa: E402

from benchlib import launch, machine, netns  # noqa: E402
from benchlib.args import add_precision, add_results_dir  # noqa: E402
from benchlib.runlogs import run_throughput  # noqa: E402

VARIANTS = ("1proc", "distseg", "fp16", "overlap", "mwms")
"""The default set; ``EXTRA_VARIANTS`` can be named with ``--variants`` too."""
STEP_VARIANTS = ("overlap", "localloss", "nocheck")
"""distseg with a train step of ``benchlib.step_variants`` (``benchlib.train_variant``):
``overlap`` one allreduce per gradient as backprop makes it; ``localloss`` each rank's
own loss, no forward allreduce of the Dice sums and no noise-scale norms (what the
global loss's mid-step synchronisation costs over the link); ``nocheck`` no BatchNorm
copy, finiteness check or norms."""
ENV_VARIANTS = {
    # Horovod's coordination cycle (distseg sets 0.5 ms): each cycle is a small
    # collective over the link, so a longer one costs fewer round trips and CPU.
    "cycle5": ("distseg", {"HOROVOD_CYCLE_TIME": "5"}),
    # One allreduce per gradient, fused in 4 MiB buffers (distseg sets 128 MiB): the
    # gradients of the last layers go over the link while backprop makes the others.
    "overlap4m": ("overlap", {"HOROVOD_FUSION_THRESHOLD": str(4 << 20)}),
    "overlap4m-cycle5": ("overlap", {"HOROVOD_FUSION_THRESHOLD": str(4 << 20),
                                     "HOROVOD_CYCLE_TIME": "5"}),
}
"""Variants that run a step (``distseg`` or one of ``STEP_VARIANTS``) with Horovod
settings of their own, given to both ranks by ``mpirun -x``."""
#: Variants of distseg's own step and their ``--compression``: ``auto`` decides from the
#: link its run measures (``distseg.training.startup.compression``; each row keeps the choice).
COMPRESSED = {"fp16": "fp16", "auto": "auto"}
EXTRA_VARIANTS = ("localloss", "nocheck", "auto", *ENV_VARIANTS)
MODELS = {
    # name: (preset, extra distseg-train flags): liver2d's 31 M parameters on 128x128
    # slices (the LiTS sample's size), so the gradients are liver2d's.
    "demo": ("demo", []),
    "liver2d": ("liver2d", ["--image-size", "128"]),
}
TAG = "dsbl"


def train_command(args, model: str, run_dir: str, compression: str, step: str) -> list[str]:
    """One rank's command (``mpirun`` starts it on each host): ``step`` one of
    ``STEP_VARIANTS`` runs under ``benchlib.train_variant``, any other distseg's own."""
    preset, extra = MODELS[model]
    batch = ["--batch-size", str(args.batch_size)] if args.batch_size else []
    flags = ["--preset", preset, *extra, "--data", args.data, "--epochs", str(args.epochs),
             *batch, "--max-steps-per-epoch", str(args.steps), "--no-validate",
             "--checkpoint-every", "0", "--compression", compression, "--precision", args.precision]
    return launch.train_command(flags, run_dir, threads=1,
                                variant=["--step", step] if step in STEP_VARIANTS else ())


def _env() -> dict:
    # This checkout's distseg first, whichever one the console scripts were installed
    # from (a second worktree measures its own code), and benchlib for the variants.
    return netns.clean_env(dict(os.environ, DISTSEG_PIN="0", OMP_NUM_THREADS="1",
                                TF_CPP_MIN_LOG_LEVEL="2",
                                PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "benchmarks")])))


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise SystemExit(f"failed ({out.returncode}): {' '.join(cmd[:12])} ...\n"
                         f"{(out.stdout + out.stderr)[-3000:]}")
    return out


def median_step(run_dir: str) -> float:
    """Rank 0's median step seconds after the first epoch (tracing)."""
    from distseg.core import schema
    records = schema.read_log(rundir.log_path(run_dir, 0))[0]
    return statistics.median(r["step_time"] for r in records
                             if r.get("type") == "step" and r["epoch"] > 0)


def distseg_run(args, hosts, agent: str, model: str, variant: str, work: str) -> dict:
    """One distseg run: one process on host a, or one rank on each host."""
    run_dir = tempfile.mkdtemp(dir=work)
    os.rmdir(run_dir)
    step, settings = ENV_VARIANTS.get(variant, (variant, {}))
    train = train_command(args, model, run_dir, COMPRESSED.get(variant, "none"), step)
    ranks = 1 if variant == "1proc" else 2
    timeline_file = os.path.join(work, os.path.basename(run_dir) + "-timeline.json")
    if args.timeline:
        settings = {**settings, "HOROVOD_TIMELINE": timeline_file}
    cmd = (netns.on_host(hosts[0], train) if ranks == 1
           else netns.mpirun_command(hosts, agent, train, exports=("PYTHONPATH",),
                                     settings=settings))
    before = machine.cpu_counters()
    _run(cmd, args.timeout)
    steal = machine.steal_fraction(before, machine.cpu_counters())
    parts = (timeline.breakdown(timeline_file) if ranks > 1 and os.path.exists(timeline_file)
             else {})
    with open(rundir.log_path(run_dir, 0)) as f:
        record = json.loads(f.readline())
    return {"samples_per_s": run_throughput(run_dir, ranks), "link": record.get("link"),
            "compression": (record.get("compression_decision") or {}).get("choice"),
            "ranks": ranks, "run_dir": run_dir,
            "grad_bytes": link.gradient_bytes(record["model"]["params"]),
            "steal": steal, "step_s": median_step(run_dir), **parts}


def mwms_run(args, hosts, model: str) -> dict:
    """The MWMS peer's two workers, one on each host, over the link."""
    preset = MODELS[model][0]
    port = 23456
    cluster = {"worker": [f"{h.address}:{port}" for h in hosts]}
    procs, before = [], machine.cpu_counters()
    for i, host in enumerate(hosts):
        cmd = [sys.executable, "-m", "peers.mwms", "--worker", "--data", args.data,
               "--preset", preset, "--epochs", str(args.epochs), "--batch-size", "8",
               "--threads", "1", "--max-steps", str(args.steps), "--precision", args.precision]
        env = dict(_env(), TF_CONFIG=json.dumps({"cluster": cluster,
                                                  "task": {"type": "worker", "index": i}}))
        procs.append(subprocess.Popen(netns.on_host(host, cmd), env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    from peers import mwms
    got = mwms.collect(procs, args.timeout)["samples_per_s"]
    return {"samples_per_s": got, "link": None, "ranks": 2,
            "steal": machine.steal_fraction(before, machine.cpu_counters())}


def one_round(args, hosts, agent: str, work: str) -> list[dict]:
    """Every rate x model x variant once."""
    rows = []
    for rate in args.rates:
        netns.shape(hosts, None if rate == "none" else rate)
        for model in args.models:
            for variant in args.variants:
                if variant == "mwms" and model != "demo":
                    continue  # the peer runs the demo preset's image size only
                got = (mwms_run(args, hosts, model) if variant == "mwms"
                       else distseg_run(args, hosts, agent, model, variant, work))
                rows.append({"rate": rate, "model": model, "variant": variant, **got})
                steal = "-" if got["steal"] is None else f"{100 * got['steal']:.0f} %"
                print(f"  {rate:>7} {model:8} {variant:16} {got['samples_per_s']:.2f} samples/s, "
                      f"steal {steal}", flush=True)
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Median samples/s per rate, model and variant; ratios to one process and to MWMS."""
    keys = sorted({(r["rate"], r["model"], r["variant"]) for r in rows})
    med = {k: statistics.median(r["samples_per_s"] for r in rows
                                if (r["rate"], r["model"], r["variant"]) == k) for k in keys}
    out = []
    for rate, model, variant in keys:
        base, peer = med.get((rate, model, "1proc")), med.get((rate, model, "mwms"))
        links = [r["link"] for r in rows if (r["rate"], r["model"], r["variant"]) == (rate, model, variant)
                 and r["link"]]
        out.append({"rate": rate, "model": model, "variant": variant,
                    "samples_per_s": med[(rate, model, variant)],
                    "vs_1proc": med[(rate, model, variant)] / base if base else None,
                    "vs_mwms": med[(rate, model, variant)] / peer if peer and variant != "mwms" else None,
                    "link_gbps": statistics.median(m["bandwidth_gbps"] for m in links
                                                   if m.get("bandwidth_gbps"))
                    if any(m.get("bandwidth_gbps") for m in links) else None,
                    "steal": _median_steal(rows, (rate, model, variant)),
                    "compression": ",".join(sorted({r["compression"] for r in rows if r.get("compression")
                                                    and (r["rate"], r["model"], r["variant"]) == (rate, model, variant)})),
                    "runs": sum(1 for r in rows if (r["rate"], r["model"], r["variant"]) == (rate, model, variant))})
    return out


def _median_steal(rows: list[dict], key: tuple) -> float | None:
    """The median CPU steal of the runs of (rate, model, variant) ``key``."""
    steals = [r["steal"] for r in rows if (r["rate"], r["model"], r["variant"]) == key
              and r.get("steal") is not None]
    return statistics.median(steals) if steals else None


def _median_rate(rows: list[dict], model: str, variant: str, rate: str | None = None) -> float:
    """The median samples/s of the model's runs of ``variant`` (at ``rate``: any)."""
    return statistics.median(r["samples_per_s"] for r in rows
                             if (r["model"], r["variant"]) == (model, variant)
                             and rate in (None, r["rate"]))


def _points(runs: list) -> list:
    """The report's fit points (``analysis.stepmodel.fit_points``) of loaded runs."""
    from analysis import stepmodel, tables
    return stepmodel.fit_points(runs, tables.time_per_epoch(runs))


def _fitted_step(fit_runs: list, grad_bytes: float, fabric) -> tuple[float, float]:
    """(predicted 2-rank step seconds, gamma) of the report's model (``analysis.stepmodel``:
    compute line and overlap fitted to ``fit_runs``, each on its own measured link) on
    the link ``fabric``."""
    from analysis import stepmodel
    model = stepmodel.fit(_points(fit_runs), grad_bytes, fabric)
    return model.step(2), model.gamma


def validate_projection(rows: list[dict], models: list[str]) -> list[dict]:
    """The report's projection checked on a link it was not fitted on: per model and per
    rate left out, the model (``analysis.stepmodel``) fitted to the 2-rank distseg runs
    at the other rates, each on the link it measured, predicts the 2-rank step on the
    link the left-out runs measured; beside it their measured step. (One process's runs
    are left out of the fit: here the two "nodes" share one VM's cores and memory, so a
    lone process computes faster than each of two ranks, which real nodes would not.)"""
    from analysis import logs
    from analysis.stepmodel import Fabric
    out = []
    for model in models:
        ours = [r for r in rows if (r["model"], r["variant"]) == (model, "distseg")
                and r.get("run_dir") and (r["link"] or {}).get("bandwidth_gbps")]
        if len({r["rate"] for r in ours}) < 3:
            continue
        loaded = {r["run_dir"]: logs.load_run(r["run_dir"]) for r in ours}
        for left_out in sorted({r["rate"] for r in ours}):
            held = [r for r in ours if r["rate"] == left_out]
            fitted = [loaded[r["run_dir"]] for r in ours if r["rate"] != left_out]
            fabric = Fabric(statistics.median(r["link"]["bandwidth_gbps"] for r in held),
                            statistics.median(r["link"]["latency_us"] for r in held), "ring")
            predicted, gamma = _fitted_step(fitted, held[0]["grad_bytes"], fabric)
            measured = statistics.median(
                p.step_s for p in _points([loaded[r["run_dir"]] for r in held]))
            out.append({"model": model, "left_out": left_out, "gamma": gamma,
                        "link_gbps": fabric.bandwidth_gbps, "predicted_s": predicted,
                        "measured_s": measured, "ratio": predicted / measured})
    return out


def _markdown(header: list[str], rows: list[list[str]]) -> None:
    """Prints a Markdown table, after a blank line."""
    print("\n| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1e3 * seconds


def print_validation(checks: list[dict]) -> None:
    _markdown(["model", "rate left out", "its measured link Gbit/s", "gamma (fitted without it)",
               "predicted step s", "measured step s", "predicted / measured"],
              [[c["model"], c["left_out"], _fmt(c["link_gbps"]), _fmt(c["gamma"]),
                _fmt(c["predicted_s"], ".3f"), _fmt(c["measured_s"], ".3f"), _fmt(c["ratio"])]
               for c in checks])


def _median_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def step_breakdown(rows: list[dict]) -> list[dict]:
    """Where a 2-rank step's time went, per rate, model and variant (medians over the
    runs; the timeline's medians over each run's later steps): the gradients' allreduce
    on the wire against what the link the run measured predicts
    (``link.sync_seconds``), the time the first rank waited for the other before the
    allreduces (``timeline``), and the rest (compute and everything else), beside one
    process's step at the same rate."""
    out = []
    keys = sorted({(r["rate"], r["model"], r["variant"]) for r in rows
                   if r.get("gradient_s") is not None})
    for rate, model, variant in keys:
        runs = [r for r in rows if (r["rate"], r["model"], r["variant"]) == (rate, model, variant)]
        single = [r for r in rows if (r["rate"], r["model"], r["variant"]) == (rate, model, "1proc")]
        step, wire = _median_of(runs, "step_s"), _median_of(runs, "gradient_s")
        wait = (_median_of(runs, "gradient_wait_s") or 0.0) + (_median_of(runs, "small_wait_s") or 0.0)
        measured = [r["link"] for r in runs if (r["link"] or {}).get("bandwidth_gbps")]
        predicted = (link.sync_seconds(runs[0]["grad_bytes"], 2,
                                       statistics.median(m["bandwidth_gbps"] for m in measured),
                                       statistics.median(m["latency_us"] for m in measured))
                     if measured else None)
        small = _median_of(runs, "small_s")
        out.append({"rate": rate, "model": model, "variant": variant, "step_s": step,
                    "one_process_step_s": _median_of(single, "step_s"),
                    "gradient_s": wire, "gradient_predicted_s": predicted, "wait_s": wait,
                    "small_s": small, "rest_s": step - wire - wait - (small or 0.0)})
    return out


def print_breakdown(parts: list[dict]) -> None:
    _markdown(["link", "model", "variant", "2-rank step s", "gradient allreduce ms (predicted "
               "from the measured link)", "waiting for the other rank ms", "rest s",
               "1-process step s"],
              [[p["rate"], p["model"], p["variant"], _fmt(p["step_s"], ".3f"),
                f"{1e3 * p['gradient_s']:.0f} ({_fmt(_ms(p['gradient_predicted_s']), '.0f')})",
                f"{1e3 * p['wait_s']:.0f}", _fmt(p["rest_s"], ".3f"),
                _fmt(p["one_process_step_s"], ".3f")] for p in parts])


def print_table(summary: list[dict]) -> None:
    _markdown(["link", "model", "variant", "samples/s", "vs 1 process", "vs MWMS",
               "link measured (Gbit/s)", "compression", "CPU stolen", "runs"],
              [[s["rate"], s["model"], s["variant"], _fmt(s["samples_per_s"]), _fmt(s["vs_1proc"]),
                _fmt(s["vs_mwms"]), _fmt(s["link_gbps"]), s.get("compression") or "-",
                _fmt(s["steal"], ".0%"), str(s["runs"])]
               for s in summary])


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(ROOT, "data", "liver117.h5"))
    p.add_argument("--rates", default="1gbit,10gbit,none", help="tc rates, or none (unshaped)")
    p.add_argument("--models", default="demo,liver2d")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, of {', '.join(VARIANTS + EXTRA_VARIANTS)}")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run (the first untimed)")
    p.add_argument("--batch-size", type=int, default=8,
                   help="per-rank batch of every run (0: the preset's own batch rule)")
    p.add_argument("--steps", type=int, default=6, help="steps per epoch")
    p.add_argument("--repeat", type=int, default=2, help="interleaved rounds")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--no-timeline", dest="timeline", action="store_false",
                   help="no Horovod timeline for the 2-rank runs (on by default: it gives "
                        "the step breakdown, at the cost of a few writes per tensor)")
    args = add_results_dir(add_precision(p)).parse_args(argv)
    args.rates, args.models = args.rates.split(","), args.models.split(",")
    args.variants = args.variants.split(",")
    unknown = sorted(set(args.variants) - set(VARIANTS + EXTRA_VARIANTS))
    if unknown:
        p.error(f"--variants: unknown {', '.join(unknown)}; known: "
                f"{', '.join(VARIANTS + EXTRA_VARIANTS)}")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    reason = netns.why_not(TAG)
    if reason:
        print(f"bench_link: cannot make the two nodes here: {reason}", file=sys.stderr)
        return 1
    hosts = netns.hosts_for(TAG)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        agent = os.path.join(work, "netns-ssh")
        try:
            netns.create(hosts, agent)
            for r in range(args.repeat):
                print(f"round {r + 1}/{args.repeat}", flush=True)
                rows += one_round(args, hosts, agent, work)
        finally:
            netns.remove(hosts)
        checks = validate_projection(rows, args.models)
    for row in rows:
        row.pop("run_dir", None)
    summary, parts = summarise(rows), step_breakdown(rows)
    print_table(summary)
    print_breakdown(parts)
    print_validation(checks)
    path = launch.write_result({"benchmark": "bench_link", "args": vars(args),
                                "machine": machine.describe(ROOT, {"intra_op": 1, "inter_op": 1}),
                                "rows": rows, "summary": summary, "breakdown": parts,
                                "projection": checks},
                               args.results_dir, f"link-{'-'.join(args.models)}")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
