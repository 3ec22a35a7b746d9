"""Asking a run to stop: signals and a vanished launcher set one flag, and the training
loop stops every rank together at the next step (the flag rides in the step's
allreduce), after a checkpoint.

Raising from the signal handler instead would interrupt whatever runs at that moment,
a Horovod collective included, and leave the other ranks waiting in it.
"""

from __future__ import annotations

import os
import signal
import threading

#: Signals that ask for a clean stop: SIGTERM (Slurm at the time limit, ``kill``,
#: ``docker stop``) and SIGUSR1 (``sbatch --signal=USR1@...`` before the limit).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: Launchers whose death should stop the ranks: ``horovodrun`` leaves ``mpirun`` and
#: the ranks running when it is killed alone.
LAUNCHERS = ("horovodrun",)


class StopFlag:
    """Set once, from a signal handler or the watchdog thread; read by the loop."""

    def __init__(self):
        self.reason: str | None = None

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason


def install(flag: StopFlag, resources) -> None:
    """Routes ``STOP_SIGNALS`` to ``flag`` until ``resources`` (an ExitStack) closes,
    and starts the launcher watchdog."""
    def on_signal(signum, frame):
        flag.request(f"received signal {signum} ({signal.Signals(signum).name})")
    for sig in STOP_SIGNALS:
        resources.callback(signal.signal, sig, signal.signal(sig, on_signal))
    launcher = find_launcher()
    if launcher is not None:
        done = threading.Event()
        resources.callback(done.set)
        threading.Thread(target=_watch, args=(launcher, flag, done), daemon=True).start()


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def find_launcher(pid: int | None = None) -> int | None:
    """The nearest ancestor process that is one of ``LAUNCHERS``, or None."""
    pid = _parent(os.getpid() if pid is None else pid)
    while pid > 1:
        args = _cmdline(pid)
        if any(os.path.basename(a) in LAUNCHERS for a in args[:2]):
            return pid
        pid = _parent(pid)
    return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _watch(pid: int, flag: StopFlag, done: threading.Event) -> None:
    while not done.wait(1.0):
        if not _alive(pid):
            flag.request(f"the launcher (pid {pid}) is gone")
            return
