"""Slurm job scripts for distseg: one sbatch template per kind of node, and scaling sweeps.

``distseg-jobs render`` fills a template from ``jobs/`` with the numbers of one job
(nodes, ranks per node, threads per rank, paths, training options) and ``distseg-jobs
sweep`` writes one such script per node count plus ``submit.sh``, which submits them
chained and queues a ``distseg-report`` job behind them.

Everything that can be checked before a job waits hours in a queue is checked here, with
one line naming the option: queue limits, ranks that do not fit the cores, a data file
that does not exist or is too small for ranks x batch size, a run directory that already
holds a run, a training config that ``distseg-train`` would refuse.

This module is logic only. It imports neither TensorFlow nor Horovod (it runs on login
nodes, where importing TensorFlow can take a minute), only ``distseg.core.config``,
``distseg.parallel.distributed`` for its Horovod defaults (that module imports Horovod only when a
run starts) and, for the data check, ``distseg.data`` (h5py).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import stat
import string
from dataclasses import dataclass, field
from typing import Any, Sequence

from distseg.core import config as config_lib
from distseg.core import rundir
from distseg.core.errors import InputError, output_dir
from distseg.parallel import distributed

#: The choices of ``--launcher``: the command a job script starts its ranks with (not
#: the processes a running rank watches, ``distseg.training.stopping.WATCHED_LAUNCHERS``).
#: ``auto`` picks at run time: ``ibrun`` where it exists (TACC), else ``srun`` inside a
#: Slurm job, else ``mpirun`` (on one node outside Slurm: ``mpirun`` on localhost).
LAUNCHERS = ("auto", "ibrun", "srun", "mpirun")

#: Flags the job script sets itself; passing them as training options is an error.
SCRIPT_FLAGS = ("--data", "--run-dir", "--intra-op-threads", "--inter-op-threads")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+):(\d{2}):(\d{2})$")


#: Horovod settings only a batch job sets, on top of ``distributed.HOROVOD_DEFAULTS``:
#: a hung rank in a queued job burns the allocation until the wall-time limit with
#: nobody watching, so the job ends it after 10 minutes of stall (an interactive run has
#: a person, and the tests their own timeouts).
JOB_HOROVOD_SETTINGS = {
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "600",
}


class JobError(InputError):
    """A job that cannot be rendered; the message is one line for a person (exit 2)."""


@dataclass(frozen=True)
class Queue:
    """Limits of one Slurm partition (called a queue at TACC)."""

    name: str
    max_nodes: int
    max_minutes: int


@dataclass(frozen=True)
class Partition:
    """A kind of node and how distseg is laid out on it."""

    key: str
    """What ``--partition`` accepts."""
    title: str
    template: str
    """File in the templates folder."""
    cores_per_node: int
    """Physical cores; 0: unknown until the job runs (taken from the allocation)."""
    threads_per_core: int
    """Hardware threads per core (what Slurm counts as CPUs)."""
    sockets: int
    reserved_cores: int
    """Cores per node left to the OS, MPI progress and Horovod's background thread."""
    default_ranks_per_node: int
    default_queue: str
    """Slurm partition written into ``#SBATCH --partition``; "" leaves the cluster default."""
    queues: tuple[Queue, ...] = ()
    """Known queues and their limits (Stampede2's); other queue names are not checked."""

    def queue(self, name: str) -> Queue | None:
        return next((q for q in self.queues if q.name == name), None)


PARTITIONS = {
    "knl": Partition(
        key="knl", title="Stampede2-style KNL (Xeon Phi 7250: 68 cores x 4 threads, 16 GB MCDRAM)",
        template="knl.sbatch", cores_per_node=68, threads_per_core=4, sockets=1,
        reserved_cores=4, default_ranks_per_node=4, default_queue="normal",
        queues=(Queue("development", 16, 2 * 60), Queue("normal", 256, 48 * 60),
                Queue("large", 2048, 48 * 60), Queue("long", 32, 96 * 60),
                Queue("flat-quadrant", 24, 48 * 60))),
    "skx": Partition(
        key="skx", title="Skylake/Cascade Lake Xeon (2 sockets x 24 cores, 2 threads per core)",
        template="skx.sbatch", cores_per_node=48, threads_per_core=2, sockets=2,
        reserved_cores=0, default_ranks_per_node=2, default_queue="skx-normal",
        queues=(Queue("skx-dev", 4, 2 * 60), Queue("skx-normal", 128, 48 * 60),
                Queue("skx-large", 868, 48 * 60))),
    "generic": Partition(
        key="generic", title="any Slurm cluster (srun --mpi=pmix, or Open MPI's mpirun)",
        template="generic.sbatch", cores_per_node=0, threads_per_core=1, sockets=1,
        reserved_cores=0, default_ranks_per_node=1, default_queue=""),
}


def templates_dir() -> str:
    """The folder holding the templates: ``$DISTSEG_JOBS_DIR``, else ``jobs/`` beside the package."""
    path = os.environ.get("DISTSEG_JOBS_DIR") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "jobs")
    if not os.path.isdir(path):
        raise JobError(f"{path}: job templates not found (set DISTSEG_JOBS_DIR to the repository's jobs/ folder)")
    return path


class _Template(string.Template):
    """``@{name}`` placeholders only, so the shell's own ``$x``, ``${x}`` and ``"$@"`` pass through."""

    delimiter = "@"
    pattern = r"""
    @(?:
      (?P<escaped>@)                      |
      \{(?P<braced>[a-z_][a-z0-9_]*)\}    |
      (?P<named>(?!))                     |
      (?P<invalid>(?!))
    )
    """


def fill(text: str, values: dict[str, object], where: str = "template") -> str:
    """Fills ``@{name}`` placeholders; a missing value is an error naming it."""
    try:
        return _Template(text).substitute({k: str(v) for k, v in values.items()})
    except KeyError as e:
        raise JobError(f"{where}: no value for placeholder @{{{e.args[0]}}}") from None


def _read_template(name: str) -> str:
    path = os.path.join(templates_dir(), name)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise JobError(f"{path}: cannot read job template ({e.strerror})") from None


@dataclass(frozen=True)
class Threads:
    """How one node's cores are shared between its ranks."""

    cores_per_rank: int
    intra_op: int
    """TensorFlow intra-op threads per rank; also ``OMP_NUM_THREADS``."""
    inter_op: int
    cpus_per_task: int
    """Logical CPUs (hardware threads) Slurm gives each rank."""
    idle_cores: int
    """Usable cores per node that no rank gets (usable cores not divisible by ranks)."""


def threads_for(cores_per_node: int, ranks_per_node: int, *, reserved_cores: int = 0,
                hw_threads: int = 1, threads_per_core: int = 1) -> Threads:
    """Splits a node's cores between its ranks.

    Each rank gets ``(cores_per_node - reserved_cores) // ranks_per_node`` whole cores
    (never a share of one: ranks on the same core evict each other's caches) and runs
    ``hw_threads`` TensorFlow threads on each. Inter-op threads follow ``distseg-train``'s
    default (``config.default_inter_op_threads``).

    Raises:
      JobError: more ranks than usable cores, or a count out of range.
    """
    if ranks_per_node < 1:
        raise JobError(f"--ranks-per-node must be >= 1, got {ranks_per_node}")
    if not 1 <= hw_threads <= threads_per_core:
        raise JobError(f"--hw-threads must be between 1 and {threads_per_core} (hardware threads "
                       f"per core), got {hw_threads}")
    usable = cores_per_node - reserved_cores
    if usable < 1:
        raise JobError(f"--cores-per-node {cores_per_node} leaves no core after the "
                       f"{reserved_cores} reserved ones")
    if ranks_per_node > usable:
        kept = f" ({cores_per_node} minus {reserved_cores} kept for the OS and MPI)" if reserved_cores else ""
        raise JobError(f"--ranks-per-node {ranks_per_node} is more than the {usable} usable cores "
                       f"per node{kept}")
    per = usable // ranks_per_node
    return Threads(cores_per_rank=per, intra_op=per * hw_threads,
                   inter_op=config_lib.default_inter_op_threads(per),
                   cpus_per_task=per * threads_per_core, idle_cores=usable - per * ranks_per_node)


def parse_minutes(text: str) -> int:
    """Slurm wall time ``HH:MM:SS`` or ``D-HH:MM:SS`` (or plain minutes) in minutes, rounded up."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    m = _TIME.match(text)
    if not m or int(m.group(3)) > 59 or int(m.group(4)) > 59:
        raise JobError(f"--time {text!r} is not a Slurm wall time like 02:00:00, 1-12:00:00 or 90 (minutes)")
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
    return days * 1440 + hours * 60 + minutes + (1 if seconds else 0)


#: Seconds before the wall-time limit at which Slurm signals the job (USR1), at most.
SIGNAL_LEAD_S = 300
#: Slurm sends the signal up to this many seconds earlier than asked (its event loop
#: runs once a minute: sbatch(1), --signal).
SIGNAL_SLACK_S = 60
#: The shortest lead: time for the ranks to finish a step and write a checkpoint.
MIN_SIGNAL_LEAD_S = 60


def signal_lead(minutes: int) -> int:
    """Seconds of ``#SBATCH --signal=B:USR1@...`` for a limit of ``minutes``: a fifth
    of the limit, between ``MIN_SIGNAL_LEAD_S`` and ``SIGNAL_LEAD_S``. A fixed 300 s
    fired at the start of any job of 5 minutes or less (Slurm signals when the time
    left falls below the lead, up to a minute early).

    Raises:
      JobError: a limit too short to train at all before the earliest signal.
    """
    lead = min(SIGNAL_LEAD_S, max(MIN_SIGNAL_LEAD_S, minutes * 60 // 5))
    if minutes * 60 < lead + SIGNAL_SLACK_S + MIN_SIGNAL_LEAD_S:
        shortest = _slurm_time(-(-(lead + SIGNAL_SLACK_S + MIN_SIGNAL_LEAD_S) // 60))
        raise JobError(f"--time {_slurm_time(minutes)} leaves no training before Slurm's "
                       f"USR1 (sent {lead} s before the limit, up to {SIGNAL_SLACK_S} s "
                       f"early); give at least {shortest}")
    return lead


def _slurm_time(minutes: int) -> str:
    days, rest = divmod(minutes, 1440)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text


@dataclass(frozen=True)
class JobSpec:
    """What the user asked for; ``resolve()`` checks it and works out the rest."""

    partition: str
    nodes: int
    data: str
    ranks_per_node: int = 0
    """0: the partition's default."""
    name: str = "distseg"
    """Job name; the run directory is ``RUNS_DIR/NAME-nNODES``."""
    runs_dir: str = "runs"
    run_dir: str = ""
    """Overrides ``RUNS_DIR/NAME-nNODES``."""
    queue: str | None = None
    """Slurm partition; None: the partition's default."""
    time: str = "02:00:00"
    account: str = ""
    launcher: str = "auto"
    srun_mpi: str = "pmix"
    hw_threads: int = 1
    cores_per_node: int = 0
    """0: the partition's number (generic: taken from the allocation at run time)."""
    timeline: bool = False
    venv: str = ""
    """Virtual environment whose bin/ goes first on PATH ("" leaves PATH alone)."""
    setup: tuple[str, ...] = ()
    """Shell lines run before anything else (e.g. ``module load impi``)."""
    train_args: tuple[str, ...] = ()
    """Options passed on to ``distseg-train`` (``--preset``, ``--epochs``, ``--seed``, ...)."""
    check_data: bool = True
    """Open the data file now (h5py, metadata only) to catch a bad file before queueing."""
    train_config: Any = None
    """The resolved ``distseg.core.config.Config`` the job will train with: the data file is
    checked against it (2D or 3D) as ``distseg-train`` will; None: only that it exists."""


@dataclass(frozen=True)
class Job:
    """A checked job: everything a template needs."""

    spec: JobSpec
    part: Partition
    ranks_per_node: int
    cores_per_node: int
    threads: Threads | None
    """None when the cores are only known at run time (generic without --cores-per-node)."""
    queue: str
    minutes: int
    data: str
    run_dir: str
    venv: str

    @property
    def ntasks(self) -> int:
        return self.spec.nodes * self.ranks_per_node

    @property
    def job_name(self) -> str:
        return f"{self.spec.name}-n{self.spec.nodes}"


def _no_control_chars(label: str, text: str) -> None:
    if any(ord(c) < 32 for c in text):
        raise JobError(f"{label} {text!r} holds a newline or control character")


def resolve(spec: JobSpec) -> Job:
    """Checks ``spec`` and works out threads, paths and queue.

    Relative paths are made absolute against the current directory, so the script
    can be submitted from anywhere.

    Raises:
      JobError: one line naming the option and what was expected.
    """
    part = PARTITIONS.get(spec.partition)
    if part is None:
        raise JobError(f"--partition {spec.partition!r} is unknown (known: {', '.join(PARTITIONS)})")
    if spec.nodes < 1:
        raise JobError(f"--nodes must be >= 1, got {spec.nodes}")
    if not _NAME.match(spec.name):
        raise JobError(f"--name {spec.name!r}: use letters, digits, '.', '_' and '-' (it names files and jobs)")
    if spec.launcher not in LAUNCHERS:
        raise JobError(f"--launcher {spec.launcher!r} is unknown (known: {', '.join(LAUNCHERS)})")
    if not re.match(r"^[A-Za-z0-9_]+$", spec.srun_mpi):
        raise JobError(f"--srun-mpi {spec.srun_mpi!r} is not an MPI plugin name like pmix or pmi2")
    if spec.account and not re.match(r"^[A-Za-z0-9_.-]+$", spec.account):
        raise JobError(f"--account {spec.account!r} is not a Slurm account name")
    rpn = spec.ranks_per_node or part.default_ranks_per_node
    if rpn < 1:
        raise JobError(f"--ranks-per-node must be >= 1, got {rpn}")
    if part.sockets > 1 and rpn > 1 and rpn % part.sockets:
        raise JobError(f"--ranks-per-node {rpn} on {part.key}: ranks would straddle the {part.sockets} "
                       f"sockets (slow remote memory); use 1 or a multiple of {part.sockets}")
    cores = spec.cores_per_node or part.cores_per_node
    if spec.cores_per_node < 0:
        raise JobError(f"--cores-per-node must be >= 0, got {spec.cores_per_node}")
    threads = None
    if cores:
        threads = threads_for(cores, rpn, reserved_cores=part.reserved_cores,
                              hw_threads=spec.hw_threads, threads_per_core=part.threads_per_core)
    elif not 1 <= spec.hw_threads <= part.threads_per_core:
        raise JobError(f"--hw-threads must be between 1 and {part.threads_per_core} on {part.key}, "
                       f"got {spec.hw_threads}")

    queue = part.default_queue if spec.queue is None else spec.queue
    if queue and not re.match(r"^[A-Za-z0-9_.-]+$", queue):
        raise JobError(f"--queue {queue!r} is not a Slurm partition name")
    minutes = parse_minutes(spec.time)
    if minutes < 1:
        raise JobError(f"--time {spec.time!r} must be at least one minute")
    limits = part.queue(queue)
    if limits and spec.nodes > limits.max_nodes:
        raise JobError(f"--nodes {spec.nodes} is more than the {limits.max_nodes} nodes the {queue} "
                       f"queue allows on {part.key} (pick another --queue)")
    if limits and minutes > limits.max_minutes:
        raise JobError(f"--time {spec.time} is longer than the {_slurm_time(limits.max_minutes)} the "
                       f"{queue} queue allows on {part.key}")
    signal_lead(minutes)  # refuses, before anything is written, a limit it cannot serve

    for label, text in (("--data", spec.data), ("--run-dir", spec.run_dir), ("--runs-dir", spec.runs_dir),
                        ("--venv", spec.venv), *(("--setup", s) for s in spec.setup),
                        *(("training option", a) for a in spec.train_args)):
        _no_control_chars(label, text)
    for arg in spec.train_args:
        flag = arg.split("=", 1)[0]
        if flag in SCRIPT_FLAGS:
            raise JobError(f"training option {flag} is set by the job script itself "
                           "(use --data/--run-dir of distseg-jobs; threads follow --ranks-per-node and --hw-threads)")
    if not spec.data:
        raise JobError("--data is required (the HDF5 file every rank reads)")
    data = os.path.abspath(spec.data)
    run_dir = os.path.abspath(spec.run_dir or os.path.join(spec.runs_dir, f"{spec.name}-n{spec.nodes}"))
    found = rundir.existing_run(run_dir)
    if found:
        raise JobError(f"{run_dir}: already holds a run ({found} exists); choose another --name or --run-dir")
    venv = os.path.abspath(spec.venv) if spec.venv else ""
    if venv and not os.path.isdir(os.path.join(venv, "bin")):
        raise JobError(f"--venv {spec.venv}: no bin/ folder there (expected a virtual environment)")
    if spec.check_data:
        _check_data(data, spec.nodes * rpn, spec.train_config)
    return Job(spec=spec, part=part, ranks_per_node=rpn, cores_per_node=cores, threads=threads,
               queue=queue, minutes=minutes, data=data, run_dir=run_dir, venv=venv)


def _check_data(path: str, ranks: int, cfg) -> None:
    """The checks ``distseg-train`` makes at start-up (``feeds.open_feed``), made before
    the job queues."""
    if not os.path.isfile(path):
        raise JobError(f"--data {path}: no such file (render where the data is visible, or pass --no-check-data)")
    from distseg.data import (
        feeds,
        h5format,
        volumes,  # h5py only; no TensorFlow
    )
    from distseg.data import slices as data_lib
    try:
        if cfg is None:  # no config to check against: the file itself
            examine = volumes.examine if h5format.file_layout(path) == "volumes" else data_lib.examine
            examine(path, check_labels=False)
            return
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=path))
        feeds.open_feed(cfg, ranks, check_labels=False)
    except InputError as e:  # the data file's, or a --global-batch the ranks cannot share
        raise JobError(str(e)) from None


def _q(text: str) -> str:
    return shlex.quote(text)


def job_environment() -> dict[str, str]:
    """The Horovod and Open MPI settings a job script exports, in the order it exports them.

    Taken from ``distseg.parallel.distributed`` (what ``distseg-train`` itself would set), plus
    ``JOB_HOROVOD_SETTINGS``: one definition of each value, not a copy in the template.
    """
    return {**distributed.HOROVOD_DEFAULTS, **JOB_HOROVOD_SETTINGS, **distributed.OMPI_DEFAULTS}


def _exports(settings: dict[str, str]) -> str:
    """``export NAME=${NAME:-value}`` lines: a value already in the environment wins, so
    ``HOROVOD_CYCLE_TIME=5 sbatch FILE`` overrides one without rendering again."""
    return "\n".join(f"export {name}=${{{name}:-{_q(str(value))}}}" for name, value in settings.items())


def _bash_array(args: Sequence[str]) -> str:
    return " ".join(_q(a) for a in args)


def render(job: Job, command: str = "") -> str:
    """The sbatch script for ``job``; ``command`` (how it was rendered) goes in its header."""
    spec, part, t = job.spec, job.part, job.threads
    header = [f"#SBATCH --job-name={job.job_name}"]
    if job.queue:
        header.append(f"#SBATCH --partition={job.queue}")
    header += [f"#SBATCH --nodes={spec.nodes}",
               f"#SBATCH --ntasks={job.ntasks}",
               f"#SBATCH --ntasks-per-node={job.ranks_per_node}"]
    if t:
        header.append(f"#SBATCH --cpus-per-task={t.cpus_per_task}")
    header += [f"#SBATCH --time={_slurm_time(job.minutes)}",
               # USR1 to the batch shell ahead of the limit (signal_lead): the ranks
               # checkpoint and stop, and the job requeues itself to resume.
               f"#SBATCH --signal=B:USR1@{signal_lead(job.minutes)}",
               "#SBATCH --requeue",
               "#SBATCH --exclusive",
               f"#SBATCH --output={job.job_name}-%j.out"]
    if spec.account:
        header.append(f"#SBATCH --account={spec.account}")
    idle = ""
    if t and t.idle_cores:
        idle = (f"# {t.idle_cores} usable core(s) per node stay idle: {job.cores_per_node - part.reserved_cores} "
                f"do not divide by {job.ranks_per_node} ranks.\n")
    values = {
        "sbatch_header": "\n".join(header),
        "title": part.title,
        "rendered_by": command or "distseg-jobs render",
        "nodes": spec.nodes,
        "ranks_per_node": job.ranks_per_node,
        "ntasks": job.ntasks,
        "cores_per_node": job.cores_per_node,
        "reserved_cores": part.reserved_cores,
        "cores_per_rank": t.cores_per_rank if t else 0,
        "hw_threads": spec.hw_threads,
        "threads_per_core": part.threads_per_core,
        "idle_note": idle,
        "data": _q(job.data),
        "run_dir": _q(job.run_dir),
        "venv": _q(job.venv),
        "launcher": spec.launcher,
        "srun_mpi": spec.srun_mpi,
        "timeline": int(spec.timeline),
        "mcdram": "flat" if job.queue.startswith("flat") else "cache",
        "train_args": _bash_array(spec.train_args),
        "setup": "\n".join(spec.setup) if spec.setup else "# (none: pass --setup 'module load ...' to add lines here)",
        "horovod_exports": _exports(job_environment()),
    }
    values["common"] = fill(_read_template("common.sh.in"), values, "common.sh.in")
    return fill(_read_template(part.template), values, part.template)


def render_report(job: Job, run_dirs: Sequence[str], out_dir: str, report_args: Sequence[str] = ()) -> str:
    """A one-task sbatch script that runs ``distseg-report`` on the sweep's run directories."""
    header = [f"#SBATCH --job-name={job.spec.name}-report"]
    if job.queue:
        header.append(f"#SBATCH --partition={job.queue}")
    header += ["#SBATCH --nodes=1", "#SBATCH --ntasks=1", "#SBATCH --time=00:30:00",
               f"#SBATCH --output={job.spec.name}-report-%j.out"]
    if job.spec.account:
        header.append(f"#SBATCH --account={job.spec.account}")
    values = {
        "sbatch_header": "\n".join(header),
        "venv": _q(job.venv),
        "setup": "\n".join(job.spec.setup) if job.spec.setup else "# (none)",
        "run_dirs": _bash_array(run_dirs),
        "out_dir": _q(os.path.abspath(out_dir)),
        "report_args": _bash_array(report_args),
    }
    return fill(_read_template("report.sbatch"), values, "report.sbatch")


def render_submit(scripts: Sequence[str], report_script: str, runs_dir: str, chain: bool) -> str:
    """``submit.sh``: submits ``scripts`` (chained one after another when ``chain``), then the report."""
    values = {
        "scripts": _bash_array(scripts),
        "report_script": _q(report_script),
        "runs_dir": _q(os.path.abspath(runs_dir)),
        "chain": int(chain),
    }
    return fill(_read_template("submit.sh"), values, "submit.sh")


@dataclass(frozen=True)
class Sweep:
    """What ``write_sweep`` wrote."""

    out_dir: str
    scripts: tuple[str, ...]
    report: str
    submit: str
    run_dirs: tuple[str, ...]
    report_dir: str
    jobs: tuple[Job, ...] = field(default=(), repr=False)


def write_sweep(spec: JobSpec, node_counts: Sequence[int], out_dir: str = ".", *, chain: bool = True,
                report_args: Sequence[str] = (), command: str = "") -> Sweep:
    """Writes ``NAME-nN.sbatch`` for every node count, ``report.sbatch`` and ``submit.sh``.

    Every script gets the same training options (hence the same global seed and config);
    only the node count and the run directory differ. Nothing is written unless every
    node count passes the checks.
    """
    if spec.run_dir:
        raise JobError("--run-dir names one run; a sweep names its runs RUNS_DIR/NAME-nN (use --runs-dir)")
    if not node_counts:
        raise JobError("--nodes: no node counts given")
    jobs = [resolve(dataclasses.replace(spec, nodes=n, check_data=False)) for n in node_counts]
    if spec.check_data:  # the biggest job is the one that needs the most slices
        _check_data(jobs[0].data, max(j.ntasks for j in jobs), spec.train_config)
    out = os.path.abspath(out_dir)
    try:
        output_dir(out, "--out")
    except InputError as e:
        raise JobError(str(e)) from None
    names = []
    for job in jobs:
        name = f"{job.job_name}.sbatch"
        write_file(os.path.join(out, name), render(job, command))
        names.append(name)
    report_dir = os.path.join(os.path.abspath(spec.runs_dir), f"{spec.name}-report")
    run_dirs = tuple(j.run_dir for j in jobs)
    report = "report.sbatch"
    write_file(os.path.join(out, report), render_report(jobs[0], run_dirs, report_dir, report_args))
    write_file(os.path.join(out, "submit.sh"),
           render_submit(names, report, spec.runs_dir, chain), executable=True)
    return Sweep(out_dir=out, scripts=tuple(names), report=report, submit="submit.sh",
                 run_dirs=run_dirs, report_dir=report_dir, jobs=tuple(jobs))


def write_file(path: str, text: str, executable: bool = False) -> None:
    """Writes a job file (``executable``: with the execute bits), refusing in one line."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        if executable:
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    except OSError as e:
        raise JobError(f"{path}: cannot write ({e.strerror})") from None
