"""Everything that touches Horovod lives here.

Data, model and logging code take ``rank`` and ``size`` as ints and never import
Horovod, which keeps them testable without MPI. This module uses only the core ops of
``horovod.tensorflow`` (allreduce, grouped_allreduce, broadcast, allgather_object):
Horovod's Keras layer does not work with Keras 3 (its DistributedOptimizer silently
skips averaging, and its variable helpers expect TF1-style ``ref()``).

Run under ``horovodrun`` (MPI or ``--gloo``), ``mpirun``/``srun``/``ibrun``, or as a
plain process (size 1). How the ranks agree on an error over these collectives, so that
no rank fails alone, is ``distseg.parallel.agreement``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import socket
import sys
from dataclasses import dataclass

import numpy as np

from distseg.core import errors
from distseg.parallel import mpilib, threads

#: Horovod settings that scale on CPU nodes; each can be overridden from the
#: environment (compared in docs/studies/horovod-settings-2026-11-22.md).
HOROVOD_DEFAULTS = {
    # Coordination cycle in ms. A step waits on two collectives in turn (the global
    # loss's sums, then the gradients), each up to a cycle, so a long cycle slows a
    # small step; 0.5 ms takes most of what a shorter one gains and wakes the thread
    # 5 times less often than 0.1 (docs/studies/step-profile-2026-11-24.md, "The
    # Horovod cycle").
    "HOROVOD_CYCLE_TIME": "0.5",
    # Fuse the whole gradient set into one buffer (bytes): 128 MiB holds the 124 MB of
    # fp32 gradients of the 31M-parameter liver2d U-Net (the jobs/ templates agree).
    "HOROVOD_FUSION_THRESHOLD": str(128 * 1024 * 1024),
    # Response cache: the same tensors every step, so negotiation is skipped.
    "HOROVOD_CACHE_CAPACITY": "1024",
    # Warn, not hang silently, when a rank falls behind.
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "120",
    # A timeline that ``start_timeline`` can switch on for a few steps (the loop records
    # each launch's second epoch); nothing is written while it is off.
    "HOROVOD_TIMELINE": "DYNAMIC",
}

#: Open MPI settings applied when MPI is the controller: yield the core while waiting
#: in a collective instead of spinning on it.
OMPI_DEFAULTS = {
    "OMPI_MCA_mpi_yield_when_idle": "1",
}

#: Settings left at Horovod's own defaults in an elastic run: with a 10 ms cycle and a
#: 128 MiB fusion buffer together, Horovod 0.28.1 crashed (SIGSEGV) in ``hvd.init()``
#: when re-forming the ring after a host left (reproduced 4 times in 4 with a 20-line
#: script; either setting alone, or neither, re-formed cleanly). The dynamic timeline
#: was not tried across re-formations, so an elastic run records none.
ELASTIC_KEEPS_HOROVOD_DEFAULT = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_TIMELINE")

_LOCAL_RANK_VARS = ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                    "PMI_LOCAL_RANK", "SLURM_LOCALID", "MV2_COMM_WORLD_LOCAL_RANK")
_LOCAL_SIZE_VARS = ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                    "PMI_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "MV2_COMM_WORLD_LOCAL_SIZE")


def _env_int(names, default):
    for n in names:
        v = os.environ.get(n, "")
        if v.split("(")[0].isdigit():
            return int(v.split("(")[0])
    return default


def physical_cores(cpus: set[int]) -> list[list[int]]:
    """Groups logical CPUs into physical cores (hyper-thread siblings together),
    ordered by their first CPU. Falls back to one CPU per core without sysfs."""
    cores: dict[tuple, list[int]] = {}
    for cpu in sorted(cpus):
        path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
        try:
            with open(path) as f:
                key = (f.read().strip(),)
        except OSError:
            key = (str(cpu),)
        cores.setdefault(key, []).append(cpu)
    return sorted(cores.values(), key=lambda c: c[0])


def pin_to_cores(local_rank: int, local_size: int) -> list[list[int]] | None:
    """Binds this process to its share of the node's physical cores.

    Only when the launcher left us unbound (affinity = every CPU of the machine) and
    more than one rank shares the node: ranks then get disjoint core sets, so one
    rank's Horovod/MPI threads cannot steal the core another rank computes on. Must run
    before TensorFlow and Horovod start their thread pools (threads inherit affinity).
    Returns this rank's cores, or None when nothing was changed.
    """
    if os.environ.get("DISTSEG_PIN", "1") == "0" or local_size <= 1:
        return None
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return None
    if len(allowed) < (os.cpu_count() or 0):
        return None  # the launcher (srun --cpu-bind, mpirun --bind-to) already bound us
    cores = physical_cores(allowed)
    per = len(cores) // local_size
    if per < 1:
        return None  # oversubscribed: more ranks than cores, leave it to the OS
    mine = cores[local_rank * per:(local_rank + 1) * per]
    os.sched_setaffinity(0, {cpu for core in mine for cpu in core})
    return mine


@dataclass(frozen=True)
class Context:
    """Who this process is in the job."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    controller: str
    cores: int
    """Physical cores this rank may use (after pinning)."""
    pinned: bool

    def is_root(self) -> bool:
        return self.rank == 0

    def one_host(self) -> bool:
        """Whether every rank runs on this host (Horovod's local size counts the ranks
        of this host): their allreduce takes the host's own path, not a network."""
        return self.local_size == self.size


_hvd = None
_pinned = False


def init() -> Context:
    """Applies the default settings, pins the process and initialises Horovod.

    Call before any TensorFlow op runs (thread settings are fixed at first use).
    ``DISTSEG_HOROVOD_DEFAULTS=0`` leaves Horovod's own defaults in force (for
    comparison); ``DISTSEG_PIN=0`` disables pinning.
    """
    global _hvd, _pinned
    if os.environ.get("DISTSEG_HOROVOD_DEFAULTS", "1") != "0":
        for key, value in {**HOROVOD_DEFAULTS, **OMPI_DEFAULTS}.items():
            if not (is_elastic() and key in ELASTIC_KEEPS_HOROVOD_DEFAULT):
                os.environ.setdefault(key, value)
    local_rank = _env_int(_LOCAL_RANK_VARS, 0)
    local_size = _env_int(_LOCAL_SIZE_VARS, 1)
    _pinned = pin_to_cores(local_rank, local_size) is not None
    threads.import_tensorflow()  # before Horovod's import, which imports TensorFlow
    import horovod.tensorflow as hvd  # Horovod: the one import of it in distseg.
    lib = mpilib.loaded()  # importing Horovod loaded its MPI library (not MPI_Init yet)
    _stop_if(mpilib.before_init(lib, mpilib.read_record(), os.environ))
    hvd.init()  # Horovod: starts the background thread (inherits the affinity above).
    _hvd = hvd
    if hvd.mpi_enabled():
        _stop_if(mpilib.after_init(hvd.size(), lib, os.environ))
    return context()


def _stop_if(problem: str | None) -> None:
    """Ends this rank with ``problem`` (every rank reaches the same one on its own)."""
    if problem:
        raise errors.RunError(problem, exit_code=errors.EXIT_BAD_INPUT)


def record_mpi(path: str, expect: str | None) -> None:
    """Writes which MPI library Horovod loads to ``path`` (``scripts/install.sh``, after
    the build); exits 1 if it is not ``expect``, the MPI the build was asked to use."""
    import horovod.tensorflow  # noqa: F401 - loads Horovod's MPI library, no MPI_Init
    lib = mpilib.loaded()
    mpilib.write_record(path, lib)
    name = lib.name if lib else "no MPI library (Gloo only)"
    print(f"[install] Horovod loads {name}" + (f" ({lib.path})" if lib else ""))
    if expect and (lib is None or lib.name != expect):
        errors.fail(f"Horovod loads {name}, not the MPI it was built with: {expect}", 1)


def context() -> Context:
    """Who this process is now (after an elastic reset, rank and size may differ)."""
    hvd = _require()
    controller = "mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else "none"
    allowed = os.sched_getaffinity(0)
    cores = len(physical_cores(allowed))
    if not _pinned and len(allowed) >= (os.cpu_count() or 1):
        cores = max(1, cores // hvd.local_size())  # unbound: the node's cores are shared
    return Context(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                   local_size=hvd.local_size(), controller=controller, cores=cores,
                   pinned=_pinned)


# --- elastic runs (horovodrun --min-np/--max-np --host-discovery-script) ------------


def is_elastic() -> bool:
    """Whether this process was started by Horovod's elastic driver."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"


def _broadcast_from_root(obj):
    return _require().broadcast_object(obj, root_rank=0)  # Horovod: pickled broadcast


def _rank() -> int:
    return _require().rank()


class _Variables:
    """Mixed into Horovod's ``ObjectState`` by ``elastic_state``: the variables part.

    ``variables`` (Keras 3 or tf variables) are copied to host memory at each
    ``commit``, put back by ``restore`` and broadcast from rank 0 by ``sync``; the
    keyword attributes (epoch, size, ...) are Python values handled by ``ObjectState``.
    Horovod's own ``TensorFlowState`` does not broadcast variables on ``sync`` in eager
    mode, so a worker that joins later would keep its own initial weights.
    """

    def __init__(self, variables, **attrs):
        self.variables = list(variables)
        self._values = [np.array(v) for v in self.variables]
        super().__init__(bcast_object=_broadcast_from_root, get_rank=_rank, **attrs)

    def save(self):
        self._values = [np.array(v) for v in self.variables]
        super().save()

    def restore(self):
        for v, value in zip(self.variables, self._values):
            v.assign(value)
        super().restore()

    def sync(self):
        broadcast_variables(self.variables, root=0)  # Horovod: rank 0's committed state
        self._values = [np.array(v) for v in self.variables]
        super().sync()


_elastic_class = None


def elastic_state(variables, **attrs):
    """What an elastic run commits (per epoch) and restores after losing a rank: a
    Horovod ``ObjectState`` holding ``variables`` and the keyword attributes. (Built on
    first use, so that importing this module never imports Horovod.)"""
    global _elastic_class
    if _elastic_class is None:
        from horovod.common.elastic import ObjectState  # Horovod: elastic state machinery
        _elastic_class = type("ElasticState", (_Variables, ObjectState), {})
    return _elastic_class(variables, **attrs)


#: What Horovod 0.28 says in the error of a collective whose peer shut down, exited or
#: was killed (TensorFlow raises it as an ``UnknownError``, eager or in a tf.function).
#: Pinned by tests/e2e/test_horovod_errors.py against the real library.
HOROVOD_SHUT_DOWN = "Horovod has been shut down"
#: The ops whose ``UnknownError`` Horovod's own elastic wrapper reads as a lost peer
#: (``horovod/tensorflow/elastic.py``: other words for a broken ring, e.g. Gloo's);
#: distseg's step also runs a grouped allreduce.
_HOROVOD_OPS = ("HorovodAllreduce", "HorovodGroupedAllreduce", "HorovodAllgather", "HorovodBroadcast")


def _loaded_class(module: str, name: str):
    """``module.name`` if that module is imported already, else None: an error cannot be
    an instance of a class that was never loaded, and this module never imports
    TensorFlow or Horovod just to classify an error."""
    loaded = sys.modules.get(module)
    return getattr(loaded, name, None) if loaded is not None else None


def _is(error: BaseException, module: str, name: str) -> bool:
    cls = _loaded_class(module, name)
    return cls is not None and isinstance(error, cls)


def lost_peer(error: BaseException) -> bool:
    """Whether ``error`` means a collective failed because another rank went away.

    The one place that reads Horovod's words: Horovod's own ``HorovodInternalError``
    by type; otherwise TensorFlow's error from a Horovod op, which has only its message
    (the shut-down phrase, or an ``UnknownError`` of a Horovod op, as Horovod's elastic
    wrapper decides).
    """
    if _is(error, "horovod.common.exceptions", "HorovodInternalError"):
        return True
    text = str(error)
    if HOROVOD_SHUT_DOWN in text:
        return True
    return (_is(error, "tensorflow.python.framework.errors_impl", "UnknownError")
            and any(op in text for op in _HOROVOD_OPS))


def _recoverable(fn):
    """``fn`` with a lost peer's error turned into the ``HorovodInternalError`` that
    Horovod's elastic loop restores from."""
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    @functools.wraps(fn)
    def call(state, *args, **kwargs):
        try:
            return fn(state, *args, **kwargs)
        except (HorovodInternalError, HostsUpdatedInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - only a lost peer is turned, the rest re-raised
            if lost_peer(e):
                raise HorovodInternalError(e) from e
            raise
    return call


def _reset() -> None:
    """Horovod: leave the old ring and join the new one after a membership change."""
    _require().shutdown()
    _require().init()


def recoverable(error: BaseException) -> bool:
    """Whether an elastic run carries on after ``error``: a lost peer, or Horovod's
    notice that hosts were added or removed."""
    return _is(error, "horovod.common.exceptions", "HostsUpdatedInterrupt") or lost_peer(error)


def run_elastic(fn, state, *args, **kwargs):
    """Runs ``fn(state, ...)`` under Horovod's elastic loop: when a rank is lost, every
    other rank restores ``state`` to its last commit, re-forms the ring with the ranks
    left and calls ``fn`` again; when hosts change, the same happens at the next
    ``state.commit()`` without restoring."""
    from horovod.common.elastic import run_fn  # Horovod: the elastic loop
    return run_fn(_recoverable(fn), _reset)(state, *args, **kwargs)


_watch = None


def watch_collectives(watch) -> None:
    """Times every eager collective below with ``watch`` (a ``stopping.HangWatch``, or
    None): a rank that waits too long in one ends the run instead of hanging."""
    global _watch
    _watch = watch


def _watched(fn):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        if _watch is None:
            return fn(*args, **kwargs)
        _watch.arm(f"a collective ({fn.__name__})")
        try:
            return fn(*args, **kwargs)
        finally:
            _watch.disarm()
    return timed


def _require():
    if _hvd is None:
        raise RuntimeError("distseg.parallel.distributed.init() has not been called")
    return _hvd


def average_gradients(grads, extra=(), compression: str = "none"):
    """Averages gradients (and small ``extra`` tensors such as the flags) over ranks
    in one fused allreduce. For use inside the ``tf.function`` train step.

    ``compression`` ``fp16``: the gradients travel as float16 (Horovod's
    ``Compression.fp16``: half the bytes, rounded to 11 significant bits, values under
    6e-8 flushed to 0) in one grouped allreduce and ``extra`` uncompressed in another
    (squared norms overflow float16); Horovod fuses both in the same cycle."""
    hvd = _require()
    if compression == "fp16":
        # Horovod: the gradients compressed, the flags and norms exact.
        out = hvd.grouped_allreduce(list(grads), op=hvd.Average, compression=hvd.Compression.fp16)
        return out, hvd.grouped_allreduce(list(extra), op=hvd.Average) if extra else []
    # Horovod: one grouped allreduce per step; the loss rides along for free.
    out = hvd.grouped_allreduce(list(grads) + list(extra), op=hvd.Average)
    return out[:len(grads)], out[len(grads):]


def sum_in_step(tensor):
    """Sum of a small tensor over ranks inside the ``tf.function`` train step, in the
    forward pass (the global loss's sums). No gradient flows through it."""
    hvd = _require()
    import tensorflow as tf
    # Horovod: one small allreduce before the backward pass.
    return hvd.allreduce(tf.stop_gradient(tensor), op=hvd.Sum)


@_watched
def broadcast_variables(variables, root: int = 0) -> None:
    """Copies rank ``root``'s values into ``variables`` on every rank (Keras 3 or tf)."""
    hvd = _require()
    import tensorflow as tf
    for v in variables:
        # Horovod: broadcast the value, then assign; works on Keras 3 variables.
        v.assign(hvd.broadcast(tf.convert_to_tensor(v), root_rank=root, name=None))


@_watched
def allreduce(values, op: str = "mean") -> np.ndarray:
    """Sum or mean of a numpy array over ranks (eager; float64 kept as float64)."""
    hvd = _require()
    import tensorflow as tf
    arr = np.asarray(values, dtype=np.float64)
    # Horovod: small eager allreduce for metrics and counts.
    out = hvd.allreduce(tf.constant(arr), op=hvd.Sum if op == "sum" else hvd.Average)
    return out.numpy()


@_watched
def allreduce_many(arrays, op: str = "mean") -> list[np.ndarray]:
    """Sum or mean over ranks of several arrays in one fused collective (eager).

    One round trip instead of one per array: averaging the ~40 BatchNorm statistics
    of a U-Net one by one cost a noticeable share of a 2-rank demo epoch
    (docs/studies/horovod-settings-2026-11-22.md, "The per-epoch costs").
    """
    hvd = _require()
    import tensorflow as tf
    arrays = [np.asarray(a) for a in arrays]
    if not arrays:
        return []
    # Horovod: one grouped allreduce for the whole list.
    out = hvd.grouped_allreduce([tf.constant(a) for a in arrays],
                                op=hvd.Sum if op == "sum" else hvd.Average)
    return [o.numpy().astype(a.dtype) for o, a in zip(out, arrays)]


def time_allreduces(sizes, repeats: int, always: int, budget: float) -> tuple[list[int], list[float]]:
    """Collective: (sizes timed, the median seconds of ``repeats`` allreduces of each, on
    the slowest rank) for float32 allreduces of ``sizes`` bytes. Every size up to
    ``always`` is timed; past it, one predicted (from the last median, in proportion)
    to take longer than ``budget`` seconds ends it. The medians are every rank's
    slowest, so every rank takes the same decision."""
    hvd = _require()
    import time

    import tensorflow as tf
    hvd.allreduce(tf.zeros([sizes[0] // 4]), op=hvd.Sum)  # Horovod: untimed, its set-up
    done, medians = [], []
    for nbytes in sizes:
        if nbytes > always and medians and medians[-1] * nbytes / done[-1] > budget:
            break
        x = tf.zeros([nbytes // 4], tf.float32)
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            hvd.allreduce(x, op=hvd.Sum)  # Horovod: eager, returns when done
            runs.append(time.perf_counter() - t0)
        done.append(int(nbytes))
        medians.append(max(allgather_object(sorted(runs)[len(runs) // 2])))
    return done, medians


def start_timeline(path: str) -> bool:
    """Starts Horovod's timeline into ``path`` (written by rank 0, Horovod's coordinator,
    alone; every rank calls this, no collective). False, and nothing started, where
    ``HOROVOD_TIMELINE`` is not ``DYNAMIC``: unset (an elastic run), or a file of the
    user's own, which records the whole run and is left alone."""
    hvd = _require()
    if os.environ.get("HOROVOD_TIMELINE") != "DYNAMIC":
        return False
    hvd.start_timeline(path)  # Horovod: records from the next cycle on
    return True


def stop_timeline() -> None:
    """Stops the timeline ``start_timeline`` started and closes its file."""
    _require().stop_timeline()  # Horovod


@_watched
def allgather_object(obj) -> list:
    """Every rank's ``obj``, in rank order, on every rank."""
    hvd = _require()
    return list(hvd.allgather_object(obj))  # Horovod: pickled allgather.


@_watched
def broadcast_object(obj, root: int = 0):
    hvd = _require()
    return hvd.broadcast_object(obj, root_rank=root)  # Horovod: pickled broadcast.


def barrier() -> None:
    allreduce(np.zeros(1), op="sum")


def shutdown() -> None:
    if _hvd is not None:
        _hvd.shutdown()


def versions() -> dict:
    """Library versions for the run record."""
    import h5py
    import keras
    import tensorflow as tf
    lib = mpilib.loaded()  # the library Horovod loaded, whatever mpi4py was built with
    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "horovod": importlib.metadata.version("horovod"),
        "mpi": lib.name if lib else None,
        "numpy": np.__version__,
        "h5py": h5py.__version__,
        "host": socket.gethostname(),
    }


if __name__ == "__main__":  # python -m distseg.parallel.distributed --record-mpi PATH [NAME]
    if len(sys.argv) not in (3, 4) or sys.argv[1] != "--record-mpi":
        errors.fail("usage: python -m distseg.parallel.distributed --record-mpi PATH [MPI NAME]")
    record_mpi(sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else None)
