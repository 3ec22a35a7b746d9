"""A ``--nodes 2`` job script of ``distseg-jobs`` through a real Slurm of two nodes (the
``slurm2`` fixture: each slurmd in network, UTS and mount namespaces of its own, on a
bridge): ``sbatch`` places the job on both nodes, ``srun --mpi=pmix`` starts one Horovod
rank on each, and the allreduce traffic crosses the veth links."""

from __future__ import annotations

import os
import subprocess

import pytest

from support import jobs_cli as cli
from support import log_records

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(os.geteuid() != 0, reason="the two-node Slurm cluster needs root "
                       "(network namespaces, a bridge, slurmd)"),
]

#: Steps per epoch of the smoke preset on ``tiny`` at 2 ranks (128 slices, 4 per rank).
STEPS_PER_EPOCH = 16


def _link_bytes(links: list[str]) -> dict[str, int]:
    """rx/tx bytes of the veth ends on this side of the bridge."""
    out = {}
    for link in links:
        for way in ("rx", "tx"):
            with open(f"/sys/class/net/{link}/statistics/{way}_bytes") as f:
                out[f"{link}.{way}"] = int(f.read())
    return out


def test_two_node_job_runs_one_rank_per_node_through_srun(slurm2, tiny, tmp_path):
    runs = tmp_path / "runs"
    out = cli("render", "--partition", "generic", "--nodes", "2", "--ranks-per-node", "1",
              "--data", tiny, "--runs-dir", str(runs), "--name", "two", "--preset", "smoke",
              "--time", "00:05:00", "--epochs", "1", "--no-validate")
    assert out.exit_code == 0, out.output
    script = tmp_path / "two.sbatch"
    script.write_text(out.stdout)
    before = _link_bytes(slurm2.links)
    job = slurm2.sbatch(str(script), cwd=str(tmp_path))
    info = slurm2.wait(job, timeout=75)
    after = _link_bytes(slurm2.links)
    text = open(info["StdOut"]).read() if os.path.exists(info["StdOut"]) else ""
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "0"), (
        slurm2.describe(job, info))
    assert info["NumNodes"] == "2" and info["NumTasks"] == "2", info
    assert "launcher: srun" in text and "2 node(s) x 1 rank(s)" in text, text[-3000:]

    run_dir = str(runs / "two-n2")
    starts = [log_records(run_dir, rank)[0] for rank in (0, 1)]
    # One rank on each node, under that node's host name, in a world of 2.
    assert sorted(r["host"] for r in starts) == sorted(slurm2.nodes), starts
    assert {r["size"] for r in starts} == {2}
    for rank in (0, 1):
        records = log_records(run_dir, rank)
        assert records[-1]["type"] == "end" and records[-1]["status"] == "ok", records[-1]
    steps = [r["global_step"] for r in log_records(run_dir, 0) if r["type"] == "step"]
    assert steps == list(range(STEPS_PER_EPOCH))
    # Every step allreduces all gradients between the nodes: each veth carried at least
    # that much each way.
    grad_bytes = starts[0]["model"]["params"] * 4 * STEPS_PER_EPOCH
    sent = {k: after[k] - before[k] for k in after}
    for key, value in sent.items():
        assert value >= grad_bytes, (key, value, grad_bytes, sent)
    print(f"\n{grad_bytes} gradient bytes; veth bytes {sent}")
    # The links are shaped (--link-rate), and the run measured what its ranks saw: the
    # same on both, not one host's own path, and never above the rate (how far below it
    # TCP through two token buckets comes depends on the machine).
    for link in slurm2.links:
        shown = subprocess.run(["tc", "qdisc", "show", "dev", link], capture_output=True,
                               text=True, timeout=10).stdout
        assert "tbf" in shown and "rate 1Gbit" in shown, shown
    assert starts[0]["link"] == starts[1]["link"] and not starts[0]["link"]["local"]
    assert 0 < starts[0]["link"]["bandwidth_gbps"] <= 1.05, starts[0]["link"]
