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


def horovodrun_cmd(*command, ranks: int = 2, controller: str | None = None,
                   launcher_args=(), local_hosts: bool = True) -> list[str]:
    """The one way tests spell a multi-rank launch: ``horovodrun -np N -H localhost:N
    [--mpi|--gloo] LAUNCHER_ARGS COMMAND``, with this venv's console scripts. A bare
    command name (``distseg-train``) is resolved in this venv's bin folder.
    ``local_hosts=False`` leaves out ``-H`` (an elastic run's hosts come from its
    discovery script)."""
    from support import BIN

    cmd = [f"{BIN}/horovodrun", "-np", str(ranks)]
    if local_hosts:
        cmd += ["-H", f"localhost:{ranks}"]
    if controller:
        cmd.append(f"--{controller}")
    head, *rest = [str(c) for c in command]
    if os.sep not in head:
        head = os.path.join(BIN, head)
    return cmd + [str(a) for a in launcher_args] + [head, *rest]


def horovodrun(*command, ranks: int = 2, controller: str | None = None, timeout: float,
               launcher_args=()) -> subprocess.CompletedProcess:
    """``horovodrun_cmd`` run to the end under ``run_group`` (its own process group,
    killed at ``timeout``), in ``support.command_env()``."""
    from support import command_env

    return run_group(horovodrun_cmd(*command, ranks=ranks, controller=controller,
                                    launcher_args=launcher_args),
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
