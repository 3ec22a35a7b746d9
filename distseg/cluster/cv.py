"""``distseg-jobs cv``: a cross-validation as jobs, one per recipe x node count x fold.

``write_cv`` checks every job as ``distseg-jobs render`` does (queue limits, threads,
the data file against each recipe's config with its ``--fold``), and that the data
files of recipes that bring their own (``--data`` in a recipe: a 3D recipe's volumes
beside a 2D recipe's slices) hold the same cases and fold table
(``check_same_cases``), before anything is written, then writes the CV directory
(``distseg.core.cvplan``): the plan ``cv.json``, one sbatch script per run under
``jobs/``, ``jobs/report.sbatch`` (``distseg-report`` over the whole CV) and
``submit.sh``, which submits the folds side by side and the report after all of them. Each job script resumes its run after a requeue (the
templates' own rule), so a fold killed at its time limit continues from its last
checkpoint.

``run_local`` trains the same plan on one machine without Slurm, one run after
another, each with the same ``distseg-train`` command line its job would start:
finished runs are skipped and a stopped one resumes, so calling it again continues a
CV where it stopped.

Logic only (no TensorFlow, no Horovod), as ``distseg.cluster.jobs``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from distseg.cluster import jobs as jobs_lib
from distseg.core import cvplan, rundir
from distseg.core.errors import InputError, output_dir

#: Flags a recipe may not set: the plan sets them per run.
PLAN_FLAGS = ("--fold", "--resume")


def parse_recipe(text: str) -> cvplan.Recipe:
    """``NAME=FLAGS`` (``dice='--loss dice --epochs 8'``) or ``NAME`` (the base flags
    alone) -> a Recipe. ``--data FILE`` among the flags is the recipe's own data file
    (a 3D recipe's volume file beside a 2D recipe's slices), taken out of its flags.

    Raises:
      JobError: a bad name, flags that do not split as a shell would, a flag the plan
        sets, or ``--data`` without a file or given twice.
    """
    name, _, flags = text.partition("=")
    name = name.strip()
    if not cvplan.NAME.match(name):
        raise jobs_lib.JobError(f"--recipe {text!r}: the name {name!r} must be letters, digits, "
                                f"'.', '_', '+' or '-' (it names folders and jobs)")
    try:
        args = shlex.split(flags)
    except ValueError as e:
        raise jobs_lib.JobError(f"--recipe {name}: its flags do not parse ({e})") from None
    data, args = own_data(name, args)
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in PLAN_FLAGS or flag in jobs_lib.SCRIPT_FLAGS:
            raise jobs_lib.JobError(f"--recipe {name}: {flag} is set by the plan for each run "
                                    f"(the folds come from --folds, the data from --data)")
    return cvplan.Recipe(name, tuple(args), os.path.abspath(data) if data else "")


def own_data(name: str, args: Sequence[str]) -> tuple[str, list[str]]:
    """(the file of ``--data FILE`` or ``--data=FILE`` in a recipe's flags, or "";
    the other flags)."""
    data, rest, i = "", [], 0
    while i < len(args):
        flag, eq, value = args[i].partition("=")
        if flag != "--data":
            rest.append(args[i])
            i += 1
            continue
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
            i += 1
        if not value or value.startswith("--"):
            raise jobs_lib.JobError(f"--recipe {name}: --data needs a file (--data FILE.h5)")
        if data:
            raise jobs_lib.JobError(f"--recipe {name}: --data given twice")
        data = value
        i += 1
    return data, rest


def check_same_cases(plan: cvplan.CvPlan) -> None:
    """Every data file of the plan holds the same case names and the same fold table
    (each case's role in each fold) as the plan's: the folds of a 2D and a 3D recipe
    validate the same cases, so their out-of-fold predictions can be compared and
    averaged case by case.

    Raises:
      JobError: one line naming both files and the first difference.
    """
    first, *others = plan.data_files()
    want = fold_roles(first)
    for path in others:
        got = fold_roles(path)
        if set(got) != set(want):
            extra = sorted(set(got) ^ set(want))[0]
            where = path if extra in got else first
            raise jobs_lib.JobError(f"--recipe data {path}: its cases differ from {first}'s "
                                    f"(case {extra!r} is only in {where}); a recipe's data "
                                    "file must hold the same cases")
        for case, roles in want.items():
            if got[case] != roles:
                raise jobs_lib.JobError(f"--recipe data {path}: case {case!r} has fold roles "
                                        f"{got[case]} there and {roles} in {first}; the data "
                                        "files of a CV must hold the same fold table")


def fold_roles(path: str) -> dict[str, tuple[int, ...]]:
    """Case name -> its role in each fold of the data file's table (``file_folds``'s
    refusals for a missing file or table)."""
    from distseg.data import folds  # h5py only
    file_folds(path)
    try:
        cases, table = folds.file_cases(path), folds.read_table(path)
    except InputError as e:
        raise jobs_lib.JobError(str(e)) from None
    index = {int(c): m for m, c in enumerate(table.case_ids)}
    return {name: tuple(int(r) for r in table.roles[:, index[int(c)]])
            for name, c in zip(cases.names, cases.case_ids)}


def _unique(recipes: Sequence[cvplan.Recipe]) -> None:
    names = [r.name for r in recipes]
    for n in names:
        if names.count(n) > 1:
            raise jobs_lib.JobError(f"--recipe {n}: named twice")
    if not recipes:
        raise jobs_lib.JobError("--recipe: give at least one (NAME or NAME='FLAGS')")


def file_folds(data: str) -> int:
    """The number of folds in the data file's fold table.

    Raises:
      JobError: no such file, or a file without a fold table.
    """
    from distseg.data import folds  # h5py only
    if not os.path.isfile(data):
        raise jobs_lib.JobError(f"--data {data}: no such file")
    try:
        table = folds.read_table(data)
    except InputError as e:
        raise jobs_lib.JobError(str(e)) from None
    if table is None:
        raise jobs_lib.JobError(f"--data {data}: holds no fold table; give it folds with "
                                f"distseg-data folds {data} --folds K")
    return table.k


def parse_folds(text: str) -> tuple[int, ...]:
    """``"0,2"`` -> (0, 2).

    Raises:
      JobError: not a list of fold indices.
    """
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise jobs_lib.JobError(f"--folds {text!r}: expected fold indices like 0,1,2")
    return tuple(int(p) for p in parts)


def chosen_folds(asked: Sequence[int] | None, k: int) -> tuple[int, ...]:
    """``asked`` (all of 0..k-1 when None), each checked against the file's ``k`` folds."""
    chosen = tuple(range(k)) if not asked else tuple(asked)
    for f in chosen:
        if not 0 <= f < k:
            raise jobs_lib.JobError(f"--folds: fold {f} is outside the data file's {k} folds "
                                    f"(0..{k - 1})")
    if len(set(chosen)) != len(chosen):
        raise jobs_lib.JobError(f"--folds: a fold is named twice ({','.join(map(str, chosen))})")
    return chosen


@dataclass(frozen=True)
class Written:
    """What ``write_cv`` wrote."""

    cv_dir: str
    plan: cvplan.CvPlan
    scripts: tuple[str, ...]
    jobs: tuple[jobs_lib.Job, ...]


def job_of(base: jobs_lib.JobSpec, plan: cvplan.CvPlan, cv_dir: str, run: cvplan.CvRun,
           parse_config: Callable[[list[str]], object]) -> jobs_lib.Job:
    """The checked job of one run of the plan: the base job's options with the run's
    nodes, name, run directory and training flags, its config parsed as distseg-train
    parses it (a bad recipe flag named in one line)."""
    args = plan.train_args(cv_dir, run)
    try:
        cfg = parse_config(args)
    except ValueError as e:
        raise jobs_lib.JobError(f"--recipe {run.recipe}: {e}") from None
    spec = dataclasses.replace(
        base, nodes=run.nodes, name=f"{run.recipe}-fold{run.fold}", data=plan.data_of(run.recipe),
        run_dir=plan.run_path(cv_dir, run), train_args=tuple(plan.run_flags(run)),
        train_config=cfg)
    try:
        return jobs_lib.resolve(spec)
    except jobs_lib.JobError as e:
        raise jobs_lib.JobError(f"--recipe {run.recipe} (fold {run.fold}, {run.nodes} node(s)): "
                                f"{e}") from None


def write_cv(base: jobs_lib.JobSpec, recipes: Sequence[cvplan.Recipe], nodes: Sequence[int],
             out_dir: str, parse_config: Callable[[list[str]], object], *,
             folds: Sequence[int] | None = None, target_dice: float | None = None,
             report_args: Sequence[str] = (), command: str = "") -> Written:
    """Writes the CV directory ``out_dir`` (see the module's docstring). Nothing is
    written unless every job passes its checks.

    Raises:
      JobError: one line naming the option, recipe or file.
    """
    _unique(recipes)
    if not nodes:
        raise jobs_lib.JobError("--nodes: no node counts given")
    data = os.path.abspath(base.data)
    k = file_folds(data)
    cv_dir = os.path.abspath(out_dir)
    if cvplan.is_cv_dir(cv_dir):
        raise jobs_lib.JobError(f"{cv_dir}: already holds a cross-validation ({cvplan.PLAN_FILE}); "
                                f"choose another --out, or continue it with distseg-jobs cv-run")
    rpn = base.ranks_per_node or jobs_lib.PARTITIONS[base.partition].default_ranks_per_node
    plan = cvplan.make(data, k, chosen_folds(folds, k), recipes, nodes, rpn, target_dice,
                       base_flags=base.train_args,
                       extra={"partition": base.partition, "time": base.time, "command": command})
    check_same_cases(plan)
    jobs = tuple(job_of(base, plan, cv_dir, run, parse_config) for run in plan.runs)
    try:
        output_dir(cv_dir, "--out")
    except InputError as e:
        raise jobs_lib.JobError(str(e)) from None
    os.makedirs(os.path.join(cv_dir, "jobs"), exist_ok=True)
    scripts = []
    for job in jobs:
        name = os.path.join("jobs", f"{job.job_name}.sbatch")
        jobs_lib.write_file(os.path.join(cv_dir, name), jobs_lib.render(job, command))
        scripts.append(name)
    report = os.path.join("jobs", "report.sbatch")
    report_args = [*report_args, *(("--target-dice", str(target_dice)) if target_dice else ())]
    jobs_lib.write_file(os.path.join(cv_dir, report), jobs_lib.render_report(
        jobs[0], [cv_dir], os.path.join(cv_dir, "report"), report_args))
    jobs_lib.write_file(os.path.join(cv_dir, "submit.sh"),
                        jobs_lib.render_submit(scripts, report, os.path.join(cv_dir, "runs"), chain=False),
                        executable=True)
    plan.write(cv_dir)
    return Written(cv_dir, plan, tuple(scripts), jobs)


# ---- The local runner ------------------------------------------------------------------

#: What a run directory holds, for the local runner.
FRESH, DONE, RESUME, RESTART = "fresh", "done", "resume", "restart"


def run_state(run_dir: str) -> str:
    """``fresh`` (nothing there), ``done`` (rank 0's last launch ended ``ok``),
    ``resume`` (stopped after a checkpoint) or ``restart`` (stopped before its first
    checkpoint: nothing to resume)."""
    if not rundir.existing_run(run_dir):
        return FRESH
    if _last_end_status(rundir.log_path(run_dir, 0)) == "ok":
        return DONE
    return RESUME if os.path.isfile(rundir.latest_path(run_dir)) else RESTART


def _last_end_status(log: str) -> str | None:
    """The status of the last ``end`` record of a rank's log (None: none, or killed)."""
    status = None
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            for line in f:
                if '"type":"end"' in line.replace(" ", ""):
                    try:
                        status = json.loads(line).get("status")
                    except ValueError:
                        status = None
                elif '"type":"run"' in line.replace(" ", ""):
                    status = None  # a later launch began after that end
    except OSError:
        return None
    return status


def tool(name: str) -> str:
    """The command ``name`` beside this Python (its virtual environment's), else from PATH."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    return here if os.access(here, os.X_OK) else name


def launcher(ranks: int) -> list[str]:
    """The local launch of ``ranks`` ranks: none for one, else ``horovodrun`` on
    localhost (as ``make demo`` starts its ranks)."""
    if ranks == 1:
        return []
    return [tool("horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}"]


def local_command(plan: cvplan.CvPlan, cv_dir: str, run: cvplan.CvRun, state: str) -> list[str]:
    """The command that trains (or resumes) ``run`` here."""
    if state == RESUME:
        args = ["--run-dir", plan.run_path(cv_dir, run), "--resume"]
    else:
        args = plan.train_args(cv_dir, run)
    return [*launcher(run.ranks), tool("distseg-train"), *args]


def set_aside(run_dir: str) -> str:
    """Renames a run that stopped before its first checkpoint to ``RUN.attempt-N`` (its
    logs kept), so the run can start again."""
    n = 1
    while os.path.exists(f"{run_dir}.attempt-{n}"):
        n += 1
    os.rename(run_dir, f"{run_dir}.attempt-{n}")
    return f"{run_dir}.attempt-{n}"


#: Signals the runner passes on to the training it waits for: Ctrl-C, ``kill``, and the
#: USR1 a batch system sends ahead of a time limit. Each stops the run after a
#: checkpoint, and the runner stops after it.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def train(command: list[str], echo: Callable[[str], None] = print) -> int:
    """Runs ``command`` and returns its exit code, passing every ``FORWARDED`` signal
    this process receives on to it, and saying so (the runner itself waits for the run
    to checkpoint and stop, and reads its exit code)."""
    proc = subprocess.Popen(command)

    def forward(signum, frame):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)
            echo(f"{signal.Signals(signum).name} passed on to the run: it checkpoints and stops")
    before = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        return proc.wait()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


@dataclass
class LocalOutcome:
    """What ``run_local`` did, run by run."""

    trained: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)


def run_local(cv_dir: str, echo: Callable[[str], None] = print,
              only: Sequence[str] = ()) -> LocalOutcome:
    """Trains every run of the plan in ``cv_dir`` that is not done, one after another.

    A run that fails is listed and the next one starts; an interrupted one (exit 130)
    stops the runner, so a second call continues from there.

    Raises:
      InputError: no plan, or ``only`` names a run the plan lacks.
      Interrupted: a run was interrupted.
    """
    from distseg.core.errors import Interrupted
    cv_dir = os.path.abspath(cv_dir)
    plan = cvplan.read(cv_dir)
    runs = [r for r in plan.runs if not only or r.label in only]
    if only and len(runs) != len(set(only)):
        raise InputError(f"{cv_dir}: --only names runs the plan lacks (it has e.g. {plan.runs[0].label})")
    outcome = LocalOutcome()
    for i, run in enumerate(runs, 1):
        path = plan.run_path(cv_dir, run)
        state = run_state(path)
        if state == DONE:
            outcome.skipped.append(run.label)
            echo(f"[{i}/{len(runs)}] {run.label}: done, skipped")
            continue
        if state == RESTART:
            echo(f"[{i}/{len(runs)}] {run.label}: stopped before its first checkpoint; "
                 f"its logs moved to {set_aside(path)}")
        command = local_command(plan, cv_dir, run, state)
        echo(f"[{i}/{len(runs)}] {run.label}: {shlex.join(command)}")
        code = train(command, echo)
        if code == Interrupted.exit_code:
            raise Interrupted(f"{run.label} was interrupted; distseg-jobs cv-run {cv_dir} resumes it")
        (outcome.trained if code == 0 else outcome.failed).append(run.label)
        if code:
            echo(f"[{i}/{len(runs)}] {run.label}: failed (exit {code}); the next run starts")
    return outcome


def report_command(cv_dir: str, plan: cvplan.CvPlan) -> list[str]:
    """``distseg-report`` over the whole CV, into ``CV/report``."""
    target = ["--target-dice", str(plan.target_dice)] if plan.target_dice else []
    return [tool("distseg-report"), cv_dir, *target,
            "--out", os.path.join(cv_dir, "report")]
