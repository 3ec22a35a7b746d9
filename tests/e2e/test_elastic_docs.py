"""The elastic commands of docs/training.md ("Elastic runs"), run as a user runs them:
the fenced blocks are read from the docs and run by bash, with only the training
options (``--data liver.h5 --run-dir runs/elastic --preset liver2d``) swapped for the
tiny data set and the smoke preset. The one-machine block on this machine; the Slurm
block with the variables Slurm sets in a batch job, its two "nodes" being ``localhost``
and ``127.0.0.1``. And ``distseg-hosts``, the discovery script both name: what it prints,
and the one line that replaces Horovod's silent 600 s wait when an option is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import time

import pytest

from distseg.cluster import elastic
from distseg.data import slices as data

from proc_group import run_group
from support import BIN, REPO, command_env, slurm_env
from support import log_records as records

pytestmark = pytest.mark.timeout(600)
DOCUMENTED = "--data liver.h5 --run-dir runs/elastic --preset liver2d"
#: A missing option must end the launch this fast, not after Horovod's 600 s.
PROMPT = 30


def _documented_blocks() -> dict[str, str]:
    """The fenced ``horovodrun`` blocks of the section: ``one machine`` and ``slurm``."""
    with open(os.path.join(REPO, "docs", "training.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("### Elastic runs", 1)[1].split("\n### ", 1)[0]
    blocks = [b for b in re.findall(r"```\n(.*?)```", section, re.S) if "horovodrun" in b]
    found = {("slurm" if "#SBATCH" in b else "one machine"): b for b in blocks}
    assert sorted(found) == ["one machine", "slurm"], blocks
    return found


def _with_tiny(block: str, tiny: str, run_dir: str) -> str:
    assert DOCUMENTED in block, block
    return block.replace(DOCUMENTED, f"--data {tiny} --run-dir {run_dir} --preset smoke "
                                     "--epochs 1 --intra-op-threads 1 --inter-op-threads 1")


def _two_nodes() -> dict[str, str]:
    """A batch job of 2 nodes x 1 task, as Slurm would describe it."""
    env = slurm_env(nodes=2, tasks=2, per_node=1, cpus=1)
    env.update(SLURM_JOB_NODELIST="localhost,127.0.0.1", SLURM_NODELIST="localhost,127.0.0.1",
               SLURM_TASKS_PER_NODE="1(x2)")
    return env


def _bash(script: str, env: dict, cwd, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    out = run_group(["bash", "-c", script], env=env, cwd=str(cwd), timeout=timeout,
                    merge_stderr=True)
    return out, time.monotonic() - start


def _assert_trained(run_dir: str, tiny: str, hosts: list[str]) -> None:
    """Both ranks finished the epoch under the elastic driver, over ``lo``, on ``hosts``,
    and their samples add up to the training split."""
    runs, epochs = [], []
    for rank in (0, 1):
        recs = records(run_dir, rank)
        assert recs[-1]["type"] == "end" and recs[-1]["status"] == "ok", recs[-1]
        runs += [r for r in recs if r["type"] == "run"]
        epochs += [r for r in recs if r["type"] == "epoch"]
    assert [r["size"] for r in runs] == [2, 2]
    assert {r["horovod_env"]["HOROVOD_ELASTIC"] for r in runs} == {"1"}
    assert {r["horovod_env"]["HOROVOD_GLOO_IFACE"] for r in runs} == {"lo"}
    assert sorted(r["horovod_env"]["HOROVOD_HOSTNAME"] for r in runs) == sorted(hosts)
    assert sum(r["samples"] for r in epochs) == len(data.examine(tiny).train_indices)


def test_the_one_machine_command_trains(tiny, tmp_path):
    run_dir = str(tmp_path / "run")
    script = _with_tiny(_documented_blocks()["one machine"], tiny, run_dir)
    out, _ = _bash(script, command_env(), tmp_path, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:]
    _assert_trained(run_dir, tiny, ["localhost", "localhost"])


def test_the_slurm_job_trains_on_the_nodes_of_the_allocation(tiny, tmp_path):
    run_dir = str(tmp_path / "run")
    script = _with_tiny(_documented_blocks()["slurm"], tiny, run_dir)
    out, _ = _bash(script, _two_nodes(), tmp_path, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:]
    _assert_trained(run_dir, tiny, ["localhost", "127.0.0.1"])


def _refused(out: subprocess.CompletedProcess, seconds: float, run_dir: str) -> str:
    """The one line distseg-hosts wrote; the launch ended at once and trained nothing."""
    assert out.returncode != 0, out.stdout[-3000:]
    assert seconds < PROMPT, (seconds, out.stdout[-3000:])
    lines = [line for line in out.stdout.splitlines() if "distseg-hosts:" in line]
    assert len(lines) == 1, out.stdout[-3000:]
    assert lines[0].startswith("error: distseg-hosts: "), lines
    assert not os.path.exists(run_dir)
    return lines[0]


@pytest.mark.parametrize("remove, add, expected", [
    # What the docs showed before: Horovod waited 600 s for a second host.
    ("--network-interface lo", "", "one host (localhost) and no --network-interface: "
     "Horovod's elastic driver would wait 600 s for a second host to probe network "
     "interfaces with, then fail; add --network-interface lo"),
    (" -np 2 ", " -np 4 ", "2 slot(s) (localhost:2) for horovodrun -np 4: Horovod's elastic "
     "driver would wait 600 s for more slots, then fail; lower -np to 2"),
    ("--slots-per-host 2", "", "outside a Slurm job it prints localhost without a slot "
     "count; give horovodrun --slots-per-host 2"),
])
def test_a_missing_option_is_one_line_at_once(tiny, tmp_path, remove, add, expected):
    run_dir = str(tmp_path / "run")
    block = _with_tiny(_documented_blocks()["one machine"], tiny, run_dir)
    assert remove in block
    out, seconds = _bash(block.replace(remove, add), command_env(), tmp_path, timeout=120)
    assert _refused(out, seconds, run_dir) == f"error: distseg-hosts: {expected}"


def test_a_one_node_slurm_job_is_told_to_name_lo(tiny, tmp_path):
    run_dir = str(tmp_path / "run")
    block = _with_tiny(_documented_blocks()["slurm"], tiny, run_dir)
    env = slurm_env(nodes=1, tasks=2, per_node=2, cpus=2)
    out, seconds = _bash(block, env, tmp_path, timeout=120)
    assert _refused(out, seconds, run_dir).endswith("add --network-interface lo")


# distseg-hosts run by hand: what Horovod reads.

def _hosts(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([f"{BIN}/distseg-hosts"], env=env, capture_output=True, text=True,
                          timeout=60)


def _slurm(nodelist: str, tasks: str, path: str | None = None) -> dict[str, str]:
    env = slurm_env(nodes=1, tasks=1, per_node=1, cpus=1)
    env.update(SLURM_JOB_NODELIST=nodelist, SLURM_NODELIST=nodelist, SLURM_TASKS_PER_NODE=tasks)
    if path is not None:
        env["PATH"] = path
    return env


def test_outside_slurm_it_prints_localhost_for_slots_per_host():
    env = {k: v for k, v in command_env().items() if not k.startswith("SLURM_")}
    out = _hosts(env)
    assert (out.returncode, out.stdout, out.stderr) == (0, "localhost\n", "")


@pytest.mark.parametrize("nodelist, tasks, lines", [
    ("localhost", "2", "localhost:2\n"),
    ("localhost,127.0.0.1", "1(x2)", "localhost:1\n127.0.0.1:1\n"),
    ("a,b,c", "2(x2),1", "a:2\nb:2\nc:1\n"),
])
def test_in_slurm_it_prints_each_node_with_its_tasks(nodelist, tasks, lines):
    out = _hosts(_slurm(nodelist, tasks))
    assert (out.returncode, out.stdout, out.stderr) == (0, lines, "")


def test_node_ranges_are_expanded_by_scontrol(tmp_path):
    # A stand-in for Slurm's scontrol that answers only the one question asked.
    fake = tmp_path / "scontrol"
    fake.write_text('#!/bin/sh\n[ "$*" = "show hostnames node[01-02]" ] || exit 1\n'
                    'printf "node01\\nnode02\\n"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out = _hosts(_slurm("node[01-02]", "4(x2)", path=f"{tmp_path}:{BIN}:/usr/bin:/bin"))
    assert (out.returncode, out.stdout) == (0, "node01:4\nnode02:4\n"), out.stderr


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="Slurm's scontrol is not installed")
def test_node_ranges_with_the_real_scontrol(tmp_path):
    # scontrol reads a slurm.conf even to expand names; a job's node has one, this
    # machine perhaps not: a minimal one.
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\n"
                    "PartitionName=p Nodes=localhost\n")
    env = dict(_slurm("node[01-02],gpu7", "4(x2),1", path=os.environ["PATH"]), SLURM_CONF=str(conf))
    out = _hosts(env)
    assert (out.returncode, out.stdout) == (0, "node01:4\nnode02:4\ngpu7:1\n"), out.stderr


@pytest.mark.parametrize("nodelist, tasks, expected", [
    ("node[01-02]", "4(x2)", "SLURM_JOB_NODELIST=node[01-02] needs `scontrol show hostnames` "
     "to expand, and scontrol is not on PATH"),
    ("a,b", "2", "SLURM_JOB_NODELIST=a,b names 2 node(s) but SLURM_TASKS_PER_NODE=2 counts 1"),
    ("a", "two", "SLURM_TASKS_PER_NODE='two': expected counts like 2(x3),1"),
])
def test_a_job_it_cannot_read_is_one_line(nodelist, tasks, expected):
    out = _hosts(_slurm(nodelist, tasks, path=BIN))
    assert (out.returncode, out.stdout, out.stderr) == (2, "", f"error: distseg-hosts: {expected}\n")


@pytest.mark.parametrize("text, counts", [
    ("1", [1]), ("2(x3),1", [2, 2, 2, 1]), ("1,3(x2)", [1, 3, 3]),
])
def test_tasks_per_node(text, counts):
    assert elastic.tasks_per_node(text) == counts
