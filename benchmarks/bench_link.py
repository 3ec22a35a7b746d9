"""Two nodes joined by a link of a set rate: samples/s of 2 ranks (one per node) against
one process, with and without fp16 gradient compression, and the same U-Net under
``tf.distribute.MultiWorkerMirroredStrategy`` over the same link, in one run.

The nodes are two network namespaces on this machine joined by a veth pair whose ends
are shaped with ``tc ... tbf`` (``benchlib.netns``); one rank per node, one thread per
rank. Variants are interleaved round by round (the machine is shared and noisy), the
first epoch of every run (tracing) is not timed, and the medians are printed with the
link each distseg run measured at its start (the ``run`` record's ``link``).

    python benchmarks/bench_link.py --rates 1gbit,10gbit,none --models demo,liver2d

Needs root (network namespaces); says why not otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

BIN = os.path.dirname(sys.executable)
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from distseg.core import link  # noqa: E402

from benchlib import machine, netns  # noqa: E402
from benchlib.runlogs import run_throughput  # noqa: E402

VARIANTS = ("1proc", "distseg", "fp16", "overlap", "mwms")
"""``overlap``: distseg's step with one allreduce per gradient as backprop makes it
(``benchlib.step_variants``), the rest distseg's own (``benchlib.train_variant``)."""
MODELS = {
    # name: (preset, extra distseg-train flags): liver2d's 31 M parameters on 128x128
    # slices (the LiTS sample's size), so the gradients are liver2d's.
    "demo": ("demo", []),
    "liver2d": ("liver2d", ["--image-size", "128"]),
}
TAG = "dsbl"


def train_command(args, model: str, run_dir: str, compression: str) -> list[str]:
    preset, extra = MODELS[model]
    return [f"{BIN}/distseg-train", "--preset", preset, *extra, "--data", args.data,
            "--run-dir", run_dir, "--epochs", str(args.epochs), "--batch-size", "8",
            "--max-steps-per-epoch", str(args.steps), "--intra-op-threads", "1",
            "--inter-op-threads", "1", "--no-validate", "--checkpoint-every", "0",
            "--compression", compression]


def _env() -> dict:
    return netns.clean_env(dict(os.environ, DISTSEG_PIN="0", OMP_NUM_THREADS="1",
                                TF_CPP_MIN_LOG_LEVEL="2",
                                PYTHONPATH=os.path.join(ROOT, "benchmarks")))


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise SystemExit(f"failed ({out.returncode}): {' '.join(cmd[:12])} ...\n"
                         f"{(out.stdout + out.stderr)[-3000:]}")
    return out


def distseg_run(args, hosts, agent: str, model: str, variant: str, work: str) -> dict:
    """One distseg run: one process on host a, or one rank on each host."""
    run_dir = tempfile.mkdtemp(dir=work)
    os.rmdir(run_dir)
    train = train_command(args, model, run_dir, "fp16" if variant == "fp16" else "none")
    if variant == "overlap":
        train = [sys.executable, "-m", "benchlib.train_variant", "--step", "overlap", "--",
                 *train[1:]]
    ranks = 1 if variant == "1proc" else 2
    cmd = (netns.on_host(hosts[0], train) if ranks == 1
           else netns.mpirun_command(hosts, agent, train, exports=("PYTHONPATH",)))
    _run(cmd, args.timeout)
    with open(os.path.join(run_dir, "logs", "rank-00000.jsonl")) as f:
        record = json.loads(f.readline())
    return {"samples_per_s": run_throughput(run_dir, ranks), "link": record.get("link"),
            "ranks": ranks, "grad_bytes": 4 * record["model"]["params"]}


def mwms_run(args, hosts, model: str) -> dict:
    """The MWMS peer's two workers, one on each host, over the link."""
    preset = MODELS[model][0]
    port = 23456
    cluster = {"worker": [f"{h.address}:{port}" for h in hosts]}
    procs = []
    for i, host in enumerate(hosts):
        cmd = [sys.executable, "-m", "peers.mwms", "--worker", "--data", args.data,
               "--preset", preset, "--epochs", str(args.epochs), "--batch-size", "8",
               "--threads", "1", "--max-steps", str(args.steps)]
        env = dict(_env(), TF_CONFIG=json.dumps({"cluster": cluster,
                                                  "task": {"type": "worker", "index": i}}))
        procs.append(subprocess.Popen(netns.on_host(host, cmd), env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    from peers import mwms
    return {"samples_per_s": mwms.collect(procs, args.timeout)["samples_per_s"], "link": None,
            "ranks": 2}


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
                print(f"  {rate:>7} {model:8} {variant:8} {got['samples_per_s']:.2f} samples/s",
                      flush=True)
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
                    "link_gbps": statistics.median(link["bandwidth_gbps"] for link in links
                                                   if link.get("bandwidth_gbps"))
                    if any(link.get("bandwidth_gbps") for link in links) else None,
                    "runs": sum(1 for r in rows if (r["rate"], r["model"], r["variant"]) == (rate, model, variant))})
    return out


def _median_rate(rows: list[dict], model: str, variant: str, rate: str | None = None) -> float:
    """The median samples/s of the model's runs of ``variant`` (at ``rate``: any)."""
    return statistics.median(r["samples_per_s"] for r in rows
                             if (r["model"], r["variant"]) == (model, variant)
                             and rate in (None, r["rate"]))


def _step_points(rows: list[dict], model: str) -> dict[str, tuple[float, float, float]]:
    """Per link rate: (compute, sync, step) seconds of the model's 2-rank distseg runs:
    compute from one process's step at the same per-rank batch, sync from the link the
    runs measured (``link.sync_seconds`` of the gradient bytes), step measured."""
    compute = 8 / _median_rate(rows, model, "1proc")
    points = {}
    for rate in sorted({r["rate"] for r in rows if r["model"] == model and r["variant"] == "distseg"}):
        runs = [r for r in rows if (r["model"], r["variant"], r["rate"]) == (model, "distseg", rate)
                and r["link"] and r["link"].get("bandwidth_gbps")]
        if not runs:
            continue
        bw = statistics.median(r["link"]["bandwidth_gbps"] for r in runs)
        lat = statistics.median(r["link"]["latency_us"] for r in runs)
        sync = link.sync_seconds(runs[0]["grad_bytes"], 2, bw, lat)
        points[rate] = (compute, sync, 16 / _median_rate(rows, model, "distseg", rate))
    return points


def validate_projection(rows: list[dict], models: list[str]) -> list[dict]:
    """Pollux's step-time form fitted to two link rates, predicting the third: predicted
    and measured 2-rank step time at each rate left out."""
    out = []
    for model in models:
        points = _step_points(rows, model)
        for left_out, (compute, sync, step) in points.items():
            fitted = [p for rate, p in points.items() if rate != left_out]
            if len(fitted) < 2:
                continue
            gamma = link.fit_gamma(fitted)
            predicted = link.step_seconds(compute, sync, gamma)
            out.append({"model": model, "left_out": left_out, "gamma": gamma,
                        "compute_s": compute, "sync_s": sync, "predicted_s": predicted,
                        "measured_s": step, "ratio": predicted / step})
    return out


def print_validation(checks: list[dict]) -> None:
    print("\n| model | rate left out | gamma (fit on the others) | compute s | sync s | "
          "predicted step s | measured step s | predicted / measured |")
    print("|---|---|---|---|---|---|---|---|")
    for c in checks:
        print(f"| {c['model']} | {c['left_out']} | {c['gamma']:.2f} | {c['compute_s']:.3f} | "
              f"{c['sync_s']:.3f} | {c['predicted_s']:.3f} | {c['measured_s']:.3f} | {c['ratio']:.2f} |")


def print_table(summary: list[dict]) -> None:
    print("\n| link | model | variant | samples/s | vs 1 process | vs MWMS | link measured (Gbit/s) | runs |")
    print("|---|---|---|---|---|---|---|---|")
    for s in summary:
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        print(f"| {s['rate']} | {s['model']} | {s['variant']} | {s['samples_per_s']:.2f} | "
              f"{fmt(s['vs_1proc'])} | {fmt(s['vs_mwms'])} | {fmt(s['link_gbps'])} | {s['runs']} |")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(ROOT, "data", "liver117.h5"))
    p.add_argument("--rates", default="1gbit,10gbit,none", help="tc rates, or none (unshaped)")
    p.add_argument("--models", default="demo,liver2d")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--epochs", type=int, default=3, help="epochs per run (the first untimed)")
    p.add_argument("--steps", type=int, default=6, help="steps per epoch")
    p.add_argument("--repeat", type=int, default=2, help="interleaved rounds")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = p.parse_args(argv)
    args.rates, args.models = args.rates.split(","), args.models.split(",")
    args.variants = args.variants.split(",")
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
    summary = summarise(rows)
    print_table(summary)
    checks = validate_projection(rows, args.models) if "1proc" in args.variants else []
    print_validation(checks)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"link-{'-'.join(args.models)}-{datetime.date.today().isoformat()}.json")
    with open(path, "w") as f:
        json.dump({"benchmark": "bench_link", "args": vars(args),
                   "machine": machine.describe(ROOT, {"intra_op": 1, "inter_op": 1}),
                   "rows": rows, "summary": summary, "projection": checks}, f, indent=1)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
