"""What the run-by-run benchmarks and studies share: the command line of one
distseg-train run (``train_command``) and the environment every command they start
gets (``command_env``), running one to its end (``run_train``), the data files they
make with distseg's own tools, and writing their results as a dated JSON file."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from collections.abc import Sequence

from distseg.data import lits

BIN = os.path.dirname(sys.executable)
"""This interpreter's console scripts (``distseg-train``, ``horovodrun``, ...)."""
BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The folder of the benchmark scripts, ``benchlib`` and ``peers``."""


def train_command(flags: Sequence[str], run_dir: str, *, ranks: int = 1,
                  threads: int | None = None, variant: Sequence[str] = (),
                  core: int | None = None, horovodrun_options: Sequence[str] = ()) -> list[str]:
    """The argv of one ``distseg-train`` run: ``flags`` in their order, then
    ``--run-dir RUN_DIR`` and, with ``threads``, ``--intra-op-threads THREADS
    --inter-op-threads 1`` (last, so the benchmark's own win over a flag it passes
    on from its user, and a later copy of a flag in ``flags`` wins over an earlier).

    Args:
        ranks: more than 1 runs under ``horovodrun`` (``horovodrun``), with
            ``horovodrun_options`` (``--mpi``, ``--gloo``) before the program.
        variant: ``benchlib.train_variant``'s arguments: the real distseg-train with
            local copies of some pieces swapped in (``python -m benchlib.train_variant
            VARIANT -- FLAGS``; ``command_env`` puts benchlib on the path). Empty: the
            ``distseg-train`` console script.
        core: one process pinned to this core (``taskset -c``), so two runs at once
            do not share one.

    Raises:
        ValueError: ``core`` with more than one rank (taskset would pin every rank
            to the one core).
    """
    if core is not None and ranks > 1:
        raise ValueError(f"core {core}: a run of {ranks} ranks cannot be pinned to one core")
    program = ([sys.executable, "-m", "benchlib.train_variant", *variant, "--"] if variant
               else [os.path.join(BIN, "distseg-train")])
    if ranks > 1:
        launcher = horovodrun(ranks, horovodrun_options)
    else:
        launcher = [] if core is None else ["taskset", "-c", str(core)]
    threading = [] if threads is None else ["--intra-op-threads", str(threads),
                                            "--inter-op-threads", "1"]
    return [*launcher, *program, *flags, "--run-dir", run_dir, *threading]


def horovodrun(ranks: int, options: Sequence[str] = ()) -> list[str]:
    """The launcher of ``ranks`` Horovod ranks on this machine, ``options`` after it:
    put a program and its arguments after it."""
    return [os.path.join(BIN, "horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}", *options]


def command_env(**extra: str) -> dict:
    """The environment of a command a benchmark starts, with ``extra`` set:
    TensorFlow's chatter quiet, this interpreter's scripts first on PATH (horovodrun's
    ranks and helpers are found in this venv even when it is not activated), and
    benchlib and the peers importable (``python -m benchlib.train_variant``, under
    any launcher)."""
    path = os.pathsep.join(filter(None, [BENCHMARKS, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
            "PYTHONPATH": path, **extra}


def run_train(cmd: list[str], name: str, timeout: float = 3600) -> None:
    """Runs a distseg-train command line (``train_command``) in ``command_env``;
    raises naming ``name`` with its stderr's end."""
    out = subprocess.run(cmd, env=command_env(), capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"{name} failed ({out.returncode}):\n{out.stderr[-3000:]}")


def lits_sample(path: str, ndim: int, fold: tuple[int, int] | None = None,
                ct_norm: str = lits.CT_NORM) -> str:
    """Writes LiTS case 117 (``distseg-data lits-sample``) as slices (``ndim`` 2) or
    volumes (3) to ``path``, split by ``fold`` (folds, fold; None: the default file),
    the CT normalised by ``ct_norm`` (``--ct-norm``); returns ``path``."""
    folds = ["--folds", str(fold[0]), "--fold", str(fold[1])] if fold else []
    subprocess.run([os.path.join(BIN, "distseg-data"), "lits-sample", "--ndim", str(ndim),
                    "--out", path, *folds, "--ct-norm", ct_norm], check=True,
                   capture_output=True, timeout=600)
    return path


def augment_config(kind: str, workdir: str) -> str:
    """A config file in ``workdir`` that sets ``data.augment`` to ``kind``
    (``distseg-train --config``); returns its path."""
    path = os.path.join(workdir, f"augment-{kind}.json")
    with open(path, "w") as f:
        json.dump({"data": {"augment": kind}}, f)
    return path


def invocation() -> dict:
    """When and how this benchmark was started, for its results."""
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)}


def write_result(result: dict, results_dir: str, stem: str) -> str:
    """Writes ``result`` to RESULTS_DIR/STEM-YYYY-MM-DD-HHMM.json; returns the path.
    Written beside it first, then renamed: an interrupted benchmark leaves no
    half-written file for ``make bench`` to read."""
    os.makedirs(results_dir, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    path = os.path.join(results_dir, f"{stem}-{stamp}.json")
    with open(path + ".partial", "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".partial", path)
    return path
