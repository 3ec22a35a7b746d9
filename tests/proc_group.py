"""Launch a command tree under a deadline; on timeout kill the whole tree.

`subprocess.run(timeout=...)` kills only the direct child: the ranks that
`horovodrun`/`mpirun` started would outlive it and keep CI's two cores busy.
Here the command gets its own process group, and the group is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest


def run_group(cmd, *, env=None, timeout: float, cwd=None,
              merge_stderr: bool = False) -> subprocess.CompletedProcess:
    """Run `cmd`; return its CompletedProcess, or fail the test after `timeout` s."""
    proc = subprocess.Popen(
        [str(c) for c in cmd], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        text=True, env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(map(str, cmd))} did not finish in {timeout} s:\n"
                    f"{(out or '')[-3000:]}\n{(err or '')[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err or "")
