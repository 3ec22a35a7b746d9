"""Two test hosts on this machine, joined by a link whose rate can be set.

Each host is a network namespace with one end of a veth pair (10.77.0.1/24 and
10.77.0.2/24, on that private link only) and its own host name (a UTS namespace).
``mpirun`` starts in the first; Open MPI's ssh is replaced by an agent that runs the
remote daemon inside the second namespace (``ip netns exec``), keyed by the address it
is asked to reach, and Open MPI is held to the link (TCP only, no shared memory, its
TCP BTL and out-of-band channel on 10.77.0.0/24). ``shape`` gives each end's egress a
token-bucket rate (``tc ... tbf``); ``netem`` (delay, loss) is not in this kernel, so
a link's latency cannot be set, only its rate.

Used by ``tests/e2e/test_netns.py`` and ``benchmarks/bench_link.py``. Needs root (or
CAP_NET_ADMIN and CAP_SYS_ADMIN): ``why_not`` says why not, by trying.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import textwrap
from dataclasses import dataclass

SUBNET = "10.77.0.0/24"


@dataclass(frozen=True)
class Host:
    namespace: str
    device: str
    address: str
    name: str


def hosts_for(tag: str) -> tuple[Host, Host]:
    """The two hosts' names for ``tag`` (short: link names are at most 15 characters)."""
    return (Host(f"{tag}a", f"{tag}a0", "10.77.0.1", f"{tag}-host-a"),
            Host(f"{tag}b", f"{tag}b0", "10.77.0.2", f"{tag}-host-b"))


def sh(*cmd: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=check)


def why_not(tag: str) -> str | None:
    """Why namespaces cannot be used here, or None when they can (tried, not guessed)."""
    for tool in ("ip", "unshare", "mpirun", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    probe = f"{tag}probe"
    try:
        out = sh("ip", "netns", "add", probe, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"ip netns add failed: {e}"
    if out.returncode != 0:
        return f"ip netns add is not permitted here: {out.stderr.strip()}"
    try:
        out = sh("ip", "netns", "exec", probe, "unshare", "--uts", "true", check=False)
        if out.returncode != 0:
            return f"unshare --uts is not permitted here: {out.stderr.strip()}"
    finally:
        sh("ip", "netns", "del", probe, check=False)
    return None


def _kill_namespace_processes(ns: str) -> None:
    """Ends processes a failed run left in our namespace (by pid, ours only)."""
    for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _write_agent(path: str, hosts: tuple[Host, Host]) -> None:
    cases = "\n".join(f"  {h.address}) ns={h.namespace}; name={h.name} ;;" for h in hosts)
    with open(path, "w") as f:
        f.write(textwrap.dedent("""\
            #!/bin/sh
            # Stands in for ssh: "agent HOST COMMAND..." runs COMMAND on the test host that
            # owns address HOST, i.e. inside its network namespace under its host name.
            # Like ssh, the words of COMMAND are joined and parsed by a shell.
            host=$1
            shift
            case $host in
            {cases}
              *) echo "netns-ssh: no test host at $host" >&2; exit 255 ;;
            esac
            exec ip netns exec "$ns" unshare --uts sh -c "hostname $name && $*"
            """).format(cases=cases))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def create(hosts: tuple[Host, Host], agent: str) -> None:
    """Makes both namespaces, the veth pair between them and the ssh agent at ``agent``
    (``remove`` undoes it, also after a failure half-way)."""
    a, b = hosts
    for h in hosts:
        sh("ip", "netns", "add", h.namespace)
    sh("ip", "link", "add", a.device, "netns", a.namespace, "type", "veth", "peer", "name",
       b.device, "netns", b.namespace)
    for h in hosts:
        sh("ip", "-n", h.namespace, "addr", "add", f"{h.address}/24", "dev", h.device)
        sh("ip", "-n", h.namespace, "link", "set", h.device, "up")
        sh("ip", "-n", h.namespace, "link", "set", "lo", "up")
    _write_agent(agent, hosts)


def remove(hosts: tuple[Host, Host]) -> None:
    """Ends what runs in the namespaces and deletes them (each takes its veth end and
    its qdisc along)."""
    for h in hosts:
        if h.namespace in sh("ip", "netns", "list", check=False).stdout.split():
            _kill_namespace_processes(h.namespace)
            sh("ip", "netns", "del", h.namespace, check=False)


def shape(hosts: tuple[Host, Host], rate: str | None) -> None:
    """Each veth end sends at most ``rate`` (e.g. ``1gbit``; None: unshaped)."""
    for h in hosts:
        sh("ip", "netns", "exec", h.namespace, "tc", "qdisc", "del", "dev", h.device, "root",
           check=False)
        if rate:
            sh("ip", "netns", "exec", h.namespace, "tc", "qdisc", "add", "dev", h.device,
               "root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms")


def counters(hosts: tuple[Host, Host]) -> dict[str, int]:
    """tx/rx bytes of each veth end, read inside its namespace."""
    out = {}
    for h in hosts:
        for way in ("tx", "rx"):
            text = sh("ip", "netns", "exec", h.namespace, "cat",
                      f"/sys/class/net/{h.device}/statistics/{way}_bytes").stdout
            out[f"{h.device}.{way}"] = int(text)
    return out


def on_host(host: Host, command: list[str]) -> list[str]:
    """``command`` run on ``host`` (in its namespace, under its host name)."""
    return ["ip", "netns", "exec", host.namespace, "unshare", "--uts", "sh", "-c",
            f'hostname {host.name} && exec "$@"', "sh", *command]


def mpirun_command(hosts: tuple[Host, Host], agent: str, program: list[str],
                   exports: tuple[str, ...] = (), settings: dict | None = None) -> list[str]:
    """One rank on each host; mpirun itself runs on the first (``exports``: more
    variables of its environment for the ranks; ``settings``: variables and values for
    the ranks, e.g. Horovod's, which ``clean_env`` keeps out of mpirun's own)."""
    a, b = hosts
    mpirun = [
        "mpirun", "--allow-run-as-root", "-np", "2", "--host", f"{a.address}:1,{b.address}:1",
        "--mca", "plm_rsh_agent", agent, "--mca", "plm_rsh_no_tree_spawn", "1",
        # Held to the link: TCP between ranks (self for a rank to itself), no shared
        # memory, no UCX/OFI transports, and the control channel on the link too.
        "--mca", "pml", "ob1", "--mca", "btl", "self,tcp",
        "--mca", "btl_tcp_if_include", SUBNET, "--mca", "oob_tcp_if_include", SUBNET,
        "--mca", "ras", "^slurm", "--mca", "plm", "rsh",
        "--bind-to", "none", "--tag-output",
        "-x", "PATH", "-x", "TF_CPP_MIN_LOG_LEVEL", "-x", "DISTSEG_PIN", "-x", "OMP_NUM_THREADS",
        *[arg for name in exports for arg in ("-x", name)],
        *[arg for name, value in (settings or {}).items() for arg in ("-x", f"{name}={value}")],
    ]
    return on_host(a, mpirun + program)


def clean_env(env: dict) -> dict:
    """``env`` without launcher or scheduler variables: the namespaces' mpirun alone
    places the ranks."""
    return {k: v for k, v in env.items()
            if not k.startswith(("OMPI_", "PMIX_", "HOROVOD_", "SLURM_"))}
