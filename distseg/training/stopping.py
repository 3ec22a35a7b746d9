"""Asking a run to stop: signals and a vanished launcher set one flag
(``distseg.core.stopflag.StopFlag``), and the training loop stops every rank together
at the next step (the flag rides in the step's allreduce), after a checkpoint.

Raising from the signal handler instead would interrupt whatever runs at that moment,
a Horovod collective included, and leave the other ranks waiting in it.
"""

from __future__ import annotations

import os
import signal
import threading

from distseg.core.stopflag import StopFlag

#: Signals that ask for a clean stop: SIGTERM (Slurm at the time limit, ``kill``,
#: ``docker stop``) and SIGUSR1 (``sbatch --signal=USR1@...`` before the limit).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: Names of the launcher processes whose death stops the ranks (not the choices of
#: ``distseg-jobs --launcher``, which are ``distseg.cluster.jobs.LAUNCHERS``).
#: ``horovodrun`` turns itself into ``sh -c mpirun ...`` (MPI) or stays a Python parent
#: (Gloo); killed alone, it left ``mpirun`` and the ranks training on. So a rank stops
#: when the nearest of these ancestors dies or is orphaned (its parent, the killed
#: ``horovodrun`` or batch script, is gone).
WATCHED_LAUNCHERS = ("horovodrun", "mpirun", "mpiexec", "orterun")


def stop_signals(elastic: bool) -> tuple:
    """The signals that stop the whole run. In an elastic run SIGTERM keeps its default
    action, ending this rank alone: it is how Horovod's elastic driver removes the
    workers of a host that left the discovery script, and the other ranks carry on.
    SIGUSR1 still stops every rank after a checkpoint."""
    return (signal.SIGUSR1,) if elastic else STOP_SIGNALS


#: Stop signals that came before ``install`` (see ``install_early``), first first.
_EARLY: list[str] = []


def _reason(signum: int) -> str:
    return f"received signal {signum} ({signal.Signals(signum).name})"


def install_early(signals: tuple = STOP_SIGNALS) -> None:
    """Records ``signals`` from now on, for ``install`` to act on.

    ``distseg-train`` calls this first thing, before it imports TensorFlow and Horovod
    (seconds): a signal in that window (Slurm's time-limit USR1 sent early, a
    ``scancel`` of a job just started) ended both ranks of a real Slurm job by the
    signal's default action, with no log record and nothing to resume.
    Recorded here, it becomes a stop request at the first step, like a later one.
    """
    def on_signal(signum, frame):
        _EARLY.append(_reason(signum))
    for sig in signals:
        signal.signal(sig, on_signal)


def install(flag: StopFlag, resources, signals: tuple = STOP_SIGNALS) -> None:
    """Routes ``signals`` to ``flag`` until ``resources`` (an ExitStack) closes, and
    starts the launcher watchdog. A signal recorded by ``install_early`` is a stop
    request from now on."""
    def on_signal(signum, frame):
        flag.request(_reason(signum))
    for sig in signals:
        resources.callback(signal.signal, sig, signal.signal(sig, on_signal))
    if _EARLY:
        flag.request(f"{_EARLY[0]} during start-up")
        _EARLY.clear()
    launcher = find_launcher()
    if launcher is not None:
        done = threading.Event()
        resources.callback(done.set)
        threading.Thread(target=_watch, args=(launcher, _parent(launcher), flag, done),
                         daemon=True).start()


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
    """The nearest ancestor process that is one of ``WATCHED_LAUNCHERS``, or None."""
    pid = _parent(os.getpid() if pid is None else pid)
    while pid > 1:
        args = _cmdline(pid)
        if any(os.path.basename(a) in WATCHED_LAUNCHERS for a in args[:2]):
            return pid
        pid = _parent(pid)
    return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _watch(pid: int, parent: int, flag: StopFlag, done: threading.Event) -> None:
    while not done.wait(1.0):
        if not _alive(pid):
            flag.request(f"the launcher (pid {pid}) is gone")
            return
        if _parent(pid) != parent:
            flag.request(f"the launcher's parent (pid {parent}) is gone")
            return


class HangWatch:
    """Ends this process when it waits in a collective for longer than ``timeout`` s.

    A rank that stalls (a stopped process, a file system hang, a cut link) leaves the
    others blocked inside Horovod, where neither a signal handler nor Horovod's own
    stall check (its coordinator waits in the same collective) can act. Around each
    collective the loop calls ``arm``/``disarm``; a thread watches the clock. On
    expiry it names the ranks whose logs stopped earliest (the run directory is on a
    shared file system), writes this rank's ``end`` record, prints one line and exits
    with code 1: the launcher then ends the other ranks.
    """

    def __init__(self, timeout: float, on_expiry):
        self.timeout = timeout
        self._on_expiry = on_expiry
        self._since: float | None = None
        self._what, self._scale = "", 1.0
        self._done = threading.Event()
        if timeout > 0:
            threading.Thread(target=self._run, daemon=True).start()

    def arm(self, what: str, patience: float = 1.0) -> None:
        """Starts the clock; ``patience`` scales the timeout (e.g. for a first step,
        which also traces the step on every rank)."""
        import time
        self._what, self._scale, self._since = what, patience, time.monotonic()

    def disarm(self) -> None:
        self._since = None

    def close(self) -> None:
        self._done.set()

    def _run(self) -> None:
        import time
        while not self._done.wait(min(1.0, self.timeout / 4)):
            since, limit = self._since, self.timeout * self._scale
            if since is not None and time.monotonic() - since > limit:
                self._on_expiry(self._what, limit)
                return


def watch_collectives(log, run_dir: str, ctx, t0: float, epochs_done, timeout: float,
                      resources) -> HangWatch:
    """Ends this rank when it waits in a collective past ``timeout`` s
    (``train.hang_timeout``): a ``HangWatch`` over every eager collective (and the train
    steps the loop arms it around), reporting through a ``HangReport`` on ``log``;
    unwatched and closed by ``resources`` (an ``ExitStack``)."""
    from distseg.core import rundir
    from distseg.parallel import distributed as dist

    report = HangReport(log, rundir.log_paths(run_dir, ctx.size), ctx.rank, t0, epochs_done)
    watch = HangWatch(timeout, report)
    resources.callback(watch.close)
    dist.watch_collectives(watch)
    resources.callback(dist.watch_collectives, None)
    return watch


def silent_ranks(log_paths: dict[int, str], me: int) -> list[int]:
    """Ranks other than ``me`` whose log does not end in a ``stalled`` or ``end``
    record: while every waiting rank has said it is stalled, these are the ranks
    that were not waiting with them (stopped, hung, or gone)."""
    return sorted(r for r, path in log_paths.items()
                  if r != me and _last_type(path) not in ("stalled", "end"))


def _last_type(path: str) -> str | None:
    import json
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line).get("type")
        except (ValueError, AttributeError):
            continue
    return None


class HangReport:
    """What a ``HangWatch`` does on expiry, on its own thread: say so in this rank's log,
    give the other waiting ranks a moment to say so too, then name the ranks that did
    not (they stopped answering), write the ``end`` record and exit with code 1 (the
    main thread is blocked inside Horovod; only the launcher can end it).

    Args:
      log: this rank's ``RunLog``.
      log_paths: every rank's log (``rundir.log_paths``).
      rank: this rank.
      t0: ``perf_counter`` at the launch's agreed start (log times count from here).
      epochs_done: returns the epochs finished so far (read when it fires).
    """

    def __init__(self, log, log_paths: dict[int, str], rank: int, t0: float, epochs_done):
        self.log, self.log_paths, self.rank, self.t0 = log, log_paths, rank, t0
        self.epochs_done = epochs_done

    def __call__(self, where: str, waited: float) -> None:
        import sys
        import time
        try:
            self.log.write("stalled", t=time.perf_counter() - self.t0, waited=waited, where=where)
            time.sleep(min(15.0, max(3.0, waited / 10)))
            silent = silent_ranks(self.log_paths, self.rank)
            who = (f"rank(s) {', '.join(map(str, silent))} stopped answering" if silent
                   else "no other rank's log shows which stopped")
            reason = f"waited {waited:.0f} s in {where}: {who} (--hang-timeout)"
            self.log.write("end", status="error", reason=reason, t=time.perf_counter() - self.t0,
                           epochs_done=self.epochs_done())
        except OSError as e:
            reason = f"waited {waited:.0f} s in {where} ({e})"
        sys.stderr.write(f"error: {reason}\n")
        sys.stderr.flush()
        os._exit(1)
