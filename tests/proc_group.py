"""Launch a command tree under a deadline; on timeout kill the whole tree.

`subprocess.run(timeout=...)` kills only the direct child: the ranks that
`horovodrun`/`mpirun` started would outlive it and keep CI's two cores busy.
Here the command gets its own process group (``support.background``), and the group
is killed.
"""

from __future__ import annotations

import os
import subprocess


def run_group(cmd, *, env=None, timeout: float, cwd=None,
              merge_stderr: bool = False) -> subprocess.CompletedProcess:
    """Run `cmd`; return its CompletedProcess, or fail the test after `timeout` s."""
    from support import background, finish

    stderr = subprocess.STDOUT if merge_stderr else subprocess.PIPE
    with background(cmd, env=env, cwd=cwd, stderr=stderr) as proc:
        out, err = finish(proc, timeout, f"{' '.join(map(str, cmd))} did not finish in {timeout} s")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


#: What ``horovodrun -np N -H localhost:N [--mpi]`` hands to Open MPI on one host
#: (horovod/runner/mpi_run.py): the ranks unbound, TCP held to the loopback, every line
#: tagged with its rank. Before that, horovodrun checks its MPI build in a child process
#: that imports TensorFlow (``horovod.common.util.mpi_built``), seconds of CPU before any
#: rank starts; the tests launch 2 ranks some hundred times, so they start that mpirun
#: themselves unless the launcher is what a test is about.
HOROVODRUN_MPIRUN = ("mpirun", "--allow-run-as-root", "--tag-output", "-bind-to", "none",
                     "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib",
                     "-mca", "btl_tcp_if_include", "lo")


def horovodrun_cmd(*command, ranks: int = 2, controller: str | None = None,
                   launcher_args=(), local_hosts: bool = True,
                   launcher: str = "mpirun") -> list[str]:
    """The one way tests spell a multi-rank launch on this machine: N ranks of COMMAND
    under MPI as ``horovodrun -np N -H localhost:N`` starts them (``HOROVODRUN_MPIRUN``),
    with this venv's console scripts; a bare command name (``distseg-train``) is resolved
    in this venv's bin folder. ``horovodrun`` itself runs it for Gloo, for elastic runs
    (``local_hosts=False``: the hosts come from a discovery script), with horovodrun's
    own ``launcher_args``, or where the test is about the launcher
    (``launcher="horovodrun"``)."""
    from support import BIN

    head, *rest = [str(c) for c in command]
    if os.sep not in head:
        head = os.path.join(BIN, head)
    if (launcher == "mpirun" and controller in (None, "mpi") and local_hosts
            and not launcher_args):
        return [*HOROVODRUN_MPIRUN, "-np", str(ranks), "-H", f"localhost:{ranks}", head, *rest]
    cmd = [f"{BIN}/horovodrun", "-np", str(ranks)]
    if local_hosts:
        cmd += ["-H", f"localhost:{ranks}"]
    if controller:
        cmd.append(f"--{controller}")
    return cmd + [str(a) for a in launcher_args] + [head, *rest]


def horovodrun(*command, ranks: int = 2, controller: str | None = None, timeout: float,
               launcher_args=(), launcher: str = "mpirun") -> subprocess.CompletedProcess:
    """``horovodrun_cmd`` run to the end under ``run_group`` (its own process group,
    killed at ``timeout``), in ``support.command_env()``."""
    from support import command_env

    return run_group(horovodrun_cmd(*command, ranks=ranks, controller=controller,
                                    launcher_args=launcher_args, launcher=launcher),
                     timeout=timeout, env=command_env())


def train(*args, ranks: int = 1, timeout: float = 300) -> subprocess.CompletedProcess:
    """``distseg-train ARGS`` as one process or under ``horovodrun -np ranks``, in
    ``support.command_env()``; fails the test unless it exits 0 (its output's tail
    in the message)."""
    from support import BIN, command_env

    cmd = ([f"{BIN}/distseg-train", *args] if ranks == 1
           else horovodrun_cmd("distseg-train", *args, ranks=ranks))
    out = run_group(cmd, env=command_env(), timeout=timeout)
    assert out.returncode == 0, (out.stdout or "")[-3000:] + (out.stderr or "")[-3000:]
    return out
