"""The host discovery of an elastic run (``distseg-hosts``, ``distseg.cli.hosts``).

Horovod's elastic driver (``horovodrun --host-discovery-script CMD``) runs CMD every
second and reads one ``host:slots`` line per usable host. ``distseg-hosts`` prints the
nodes of the Slurm job it runs in, each with its task count (``SLURM_JOB_NODELIST``,
``SLURM_TASKS_PER_NODE``), or, outside Slurm, ``localhost`` with no count (Horovod then
gives it ``--slots-per-host`` slots).

Before it prints, it reads the options of the ``horovodrun`` that runs it and refuses,
in one line naming what is missing, the starts that Horovod 0.28.1 would sit on silently
for ``--elastic-timeout`` (600 s) before failing:

* one host and no ``--network-interface``: the driver waits for a second host to probe
  which interfaces the hosts share, and none comes;
* fewer slots than ``-np``: it waits for slots that a Slurm job or one machine never
  gains;
* outside Slurm, no ``--slots-per-host``: ``localhost`` would have no slot count.

A discovery script that fails its first run ends the job at once (Horovod stops the
driver), so the line is the first thing the user sees instead of a silent hang. The
hosts printed never change during a job, so a check that passed once is not run again
for that horovodrun (``passed_marker``).

Plain Python, no TensorFlow; Horovod's launcher is imported only to read horovodrun's
options with its own parser.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Mapping, NamedTuple, Sequence

from distseg.core.errors import InputError

#: Horovod's default ``--elastic-timeout`` (``HOROVOD_ELASTIC_TIMEOUT``): how long its
#: driver waits for hosts or slots before it fails.
ELASTIC_TIMEOUT = 600

_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


class Host(NamedTuple):
    """One line of the discovery script's output."""

    name: str
    slots: int | None
    """None: the line carries no count and horovodrun's ``--slots-per-host`` applies."""


def tasks_per_node(text: str) -> list[int]:
    """Slurm's ``SLURM_TASKS_PER_NODE`` (``2(x3),1``) as one count per node ([2, 2, 2, 1])."""
    counts: list[int] = []
    for item in text.split(","):
        m = _TASKS.match(item.strip())
        if not m:
            raise InputError(f"distseg-hosts: SLURM_TASKS_PER_NODE={text!r}: expected counts "
                             "like 2(x3),1")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def node_names(nodelist: str) -> list[str]:
    """Slurm's node list (``node[01-03],gpu7``) as host names, in Slurm's order.

    Slurm's own ``scontrol show hostnames`` expands ranges; a list without ranges is
    split on commas, so a machine without Slurm's tools (the tests) needs no scontrol.
    """
    if "[" not in nodelist:
        return [name for name in nodelist.split(",") if name]
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        raise InputError(f"distseg-hosts: SLURM_JOB_NODELIST={nodelist} needs `scontrol show "
                         "hostnames` to expand, and scontrol is not on PATH")
    out = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise InputError(f"distseg-hosts: scontrol show hostnames {nodelist} failed: "
                         f"{out.stderr.strip() or out.returncode}")
    return out.stdout.split()


def slurm_hosts(env: Mapping[str, str]) -> list[Host]:
    """The nodes of the Slurm job, each with the tasks Slurm gave it."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    names = node_names(nodelist)
    tasks_text = env.get("SLURM_TASKS_PER_NODE")
    if not tasks_text:
        raise InputError("distseg-hosts: SLURM_TASKS_PER_NODE is not set; give the job "
                         "--ntasks-per-node")
    counts = tasks_per_node(tasks_text)
    if len(counts) != len(names):
        raise InputError(f"distseg-hosts: SLURM_JOB_NODELIST={nodelist} names {len(names)} "
                         f"node(s) but SLURM_TASKS_PER_NODE={tasks_text} counts {len(counts)}")
    return [Host(name, n) for name, n in zip(names, counts)]


def discover(env: Mapping[str, str]) -> list[Host]:
    """The hosts of this job: the Slurm allocation, or outside Slurm this machine."""
    if env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"):
        return slurm_hosts(env)
    return [Host("localhost", None)]


def format_hosts(hosts: Sequence[Host]) -> str:
    """The lines Horovod reads: ``host:slots``, or ``host`` alone when the count is
    horovodrun's ``--slots-per-host``."""
    return "".join(f"{h.name}\n" if h.slots is None else f"{h.name}:{h.slots}\n" for h in hosts)


def _stat(pid: int) -> list[str]:
    """Fields 3.. of ``/proc/PID/stat`` (state, parent, ..., start time at [19])."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        # The name (field 2) is in parentheses and may hold spaces: split after it.
        return f.read().rsplit(")", 1)[1].split()


def launcher() -> tuple[int, list[str]] | None:
    """The pid and the options of the ``horovodrun`` that runs this process (``None`` if
    none does, e.g. a person running ``distseg-hosts`` by hand, or no ``/proc``)."""
    pid = os.getppid()
    try:
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            if any(a.startswith("--host-discovery-script") for a in argv):
                for i, a in enumerate(argv):
                    if os.path.basename(a) == "horovodrun":
                        return pid, argv[i + 1:]
                return None
            pid = int(_stat(pid)[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def passed_marker(pid: int) -> str:
    """The file that says this horovodrun's options passed ``check``: Horovod runs the
    script every second for the whole run, and the check (Horovod's parser, a host
    lookup) would take a steady share of a core that only the first run needs
    (docs/studies/horovod-settings-2026-11-22.md, "The elastic discovery script").
    Named by the pid and start time of horovodrun, so no later process can match it."""
    return os.path.join(tempfile.gettempdir(),
                        f"distseg-hosts-{os.getuid()}-{pid}-{_stat(pid)[19]}.ok")


class Launch(NamedTuple):
    """What of horovodrun's options decides whether its elastic driver can start."""

    num_proc: int
    slots_per_host: int | None
    nics: bool
    elastic_timeout: int


def parse_launch(argv: Sequence[str]) -> Launch | None:
    """horovodrun's options, read by Horovod's own parser (abbreviations, ``=`` forms
    and ``--config-file`` included); ``None`` if they do not parse."""
    from horovod.runner import launch  # Horovod's launcher only: no TensorFlow

    saved = sys.argv
    sys.argv = ["horovodrun", *argv]
    try:
        args = launch.parse_args()
    except SystemExit:
        return None
    finally:
        sys.argv = saved
    timeout = args.elastic_timeout or int(os.environ.get("HOROVOD_ELASTIC_TIMEOUT", ELASTIC_TIMEOUT))
    return Launch(args.num_proc, args.slots, bool(args.nics), timeout)


def _is_local(name: str) -> bool:
    from horovod.runner.util import network  # horovodrun's own test of which hosts are local

    return not network.filter_local_addresses([name])


def check(hosts: Sequence[Host], launch: Launch) -> None:
    """Raises ``InputError`` (one line) if Horovod's elastic driver would wait on these
    hosts for ``launch.elastic_timeout`` seconds and then fail."""
    def wait(what: str) -> str:
        return f"Horovod's elastic driver would wait {launch.elastic_timeout} s for {what}, then fail"

    if any(h.slots is None for h in hosts) and launch.slots_per_host is None:
        raise InputError("distseg-hosts: outside a Slurm job it prints localhost without a "
                         f"slot count; give horovodrun --slots-per-host {launch.num_proc}")
    slots = sum(launch.slots_per_host if h.slots is None else h.slots for h in hosts)
    if slots < launch.num_proc:
        listed = ", ".join(f"{h.name}:{launch.slots_per_host if h.slots is None else h.slots}"
                           for h in hosts)
        raise InputError(f"distseg-hosts: {slots} slot(s) ({listed}) for horovodrun -np "
                         f"{launch.num_proc}: {wait('more slots')}; lower -np to {slots}")
    if len(hosts) == 1 and not launch.nics:
        name = hosts[0].name
        fix = ("add --network-interface lo" if _is_local(name) else
               f"add --network-interface naming the interface this machine reaches {name} on")
        raise InputError(f"distseg-hosts: one host ({name}) and no --network-interface: "
                         f"{wait('a second host to probe network interfaces with')}; {fix}")


def check_once(hosts: Sequence[Host], pid: int, argv: Sequence[str]) -> None:
    """``check`` against the options of horovodrun ``pid``, unless they passed before."""
    try:
        marker = passed_marker(pid)
    except (OSError, ValueError, IndexError):
        return
    if os.path.exists(marker):
        return
    launch = parse_launch(argv)
    if launch is None:
        return
    check(hosts, launch)
    try:
        with open(marker, "w"):
            pass
    except OSError:
        pass  # the check runs again next time: slower, not wrong


def hosts_for_horovod(env: Mapping[str, str]) -> str:
    """What ``distseg-hosts`` prints: this job's hosts, after refusing (``InputError``)
    a start the ``horovodrun`` running it would wait on."""
    hosts = discover(env)
    found = launcher()
    if found is not None:
        check_once(hosts, *found)
    return format_hosts(hosts)
