"""``distseg-jobs``: Slurm scripts for distseg (parses options, builds a JobSpec, calls distseg.cluster.jobs).

No TensorFlow here: it runs on login nodes.
"""

from __future__ import annotations

import os
import shlex
import sys

import click

from distseg.cli.train import TRAIN_FLAGS, batch_overrides, lr_overrides, model_overrides
from distseg.cluster import jobs as jobs_lib
from distseg.cluster import outcome as outcome_lib
from distseg.core import config as config_lib
from distseg.core import schema
from distseg.core.errors import DistsegError, fail

#: distseg-train options a job passes on; the thread counts are the job script's own.
_PASSED_ON = {k: v for k, v in TRAIN_FLAGS.items() if k not in ("intra_op_threads", "inter_op_threads")}


def _default_venv() -> str:
    """The virtual environment running this command, if any: the job then uses the same one."""
    return sys.prefix if sys.prefix != sys.base_prefix else ""


def _job_options(fn):
    """Options shared by ``render`` and ``sweep`` (listed in the order --help shows them)."""
    options = [
        click.option("--partition", required=True, type=click.Choice(sorted(jobs_lib.PARTITIONS)),
                     help="Node type: knl (Stampede2 KNL), skx (Skylake/Cascade Lake), generic."),
        click.option("--ranks-per-node", default=0, type=click.IntRange(0),
                     help="Horovod ranks per node (0: the partition's default: knl 4, skx 2, generic 1)."),
        click.option("--data", "data_path", required=True, help="HDF5 dataset every rank reads."),
        click.option("--name", default="distseg", show_default=True,
                     help="Job name; runs go to RUNS_DIR/NAME-nNODES."),
        click.option("--runs-dir", default="runs", show_default=True, help="Folder of the run directories."),
        click.option("--queue", default=None,
                     help="Slurm partition (default: knl normal, skx skx-normal, generic the cluster's default)."),
        click.option("--time", "walltime", default="02:00:00", show_default=True, help="Wall-time limit."),
        click.option("--account", default="", help="Slurm account (allocation) to charge."),
        click.option("--launcher", default="auto", show_default=True, type=click.Choice(jobs_lib.LAUNCHERS),
                     help="auto: ibrun if present, else srun in a Slurm job, else mpirun on localhost."),
        click.option("--srun-mpi", default="pmix", show_default=True, help="srun --mpi plugin."),
        click.option("--hw-threads", default=1, show_default=True, type=click.IntRange(1),
                     help="Hardware threads per core each rank uses (knl up to 4, skx up to 2)."),
        click.option("--cores-per-node", default=0, type=click.IntRange(0),
                     help="Physical cores per node (0: knl 68, skx 48, generic from the allocation)."),
        click.option("--timeline/--no-timeline", default=False, help="Write a Horovod timeline into the run."),
        click.option("--venv", default=_default_venv, show_default="this command's virtual environment",
                     help="Virtual environment the job puts first on PATH ('' for none)."),
        click.option("--setup", multiple=True,
                     help="Shell line run first in the job, e.g. 'module load impi' (repeatable)."),
        click.option("--check-data/--no-check-data", default=True, show_default=True,
                     help="Open --data now (metadata only) to catch a bad file before queueing."),
        click.option("--preset", default="liver2d", show_default=True, type=click.Choice(sorted(config_lib.PRESETS)),
                     help="distseg-train preset."),
        click.option("--config", "config_file", default=None, type=click.Path(dir_okay=False, exists=True),
                     help="distseg-train --config JSON."),
        click.option("--resize/--no-resize", default=None, help="distseg-train --resize."),
        click.option("--validate/--no-validate", default=None, help="distseg-train --validate."),
        click.option("--model", "model_name", default=None, type=click.Choice(sorted(config_lib.MODELS)),
                     help="distseg-train --model (unet3d needs a volume file, e.g. --preset liver3d)."),
        click.option("--model-fn", default=None, metavar="FILE.py:FUNCTION",
                     help="distseg-train --model-fn (your own Keras model; the path is made absolute)."),
        click.option("--model-arg", "model_args", multiple=True, metavar="KEY=VALUE",
                     help="distseg-train --model-arg (repeatable)."),
        click.option("--recompute/--no-recompute", default=None, help="distseg-train --recompute."),
    ]
    for name, (_, kind, text) in _PASSED_ON.items():
        options.append(click.option(f"--{name.replace('_', '-')}", name, type=kind, default=None,
                                    help=f"distseg-train: {text}"))
    for option in reversed(options):
        fn = option(fn)
    return fn


def _spec(nodes: int, run_dir: str, p: dict) -> jobs_lib.JobSpec:
    """Builds the JobSpec, after checking the training options the way distseg-train will."""
    overrides = {path: p[name] for name, (path, _, _) in _PASSED_ON.items()}
    # The run directory itself is checked by jobs.resolve; any non-empty value passes here.
    overrides.update({"data.path": p["data_path"], "run_dir": run_dir or p["runs_dir"] or ".",
                      "data.resize": p["resize"], "train.validate": p["validate"],
                      "model.recompute": p["recompute"]})
    try:
        overrides.update(model_overrides(p["model_name"], p["model_fn"], p["model_args"],
                                         p["data_path"]))
        overrides.update(batch_overrides(p["batch_size"], p["global_batch"]))
        overrides.update(lr_overrides(p["lr"], p["lr_from"]))
        cfg = config_lib.resolve(p["preset"], p["config_file"], overrides)
    except ValueError as e:
        raise jobs_lib.JobError(str(e)) from None
    args = ["--preset", p["preset"]]
    if p["config_file"]:
        args += ["--config", os.path.abspath(p["config_file"])]
    if p["model_name"]:
        args += ["--model", p["model_name"]]
    if p["model_fn"]:
        args += ["--model-fn", cfg.model.fn]
        args += [a for arg in p["model_args"] for a in ("--model-arg", arg)]
    for flag in ("resize", "validate", "recompute"):
        if p[flag] is not None:
            args.append(f"--{'' if p[flag] else 'no-'}{flag}")
    for name in _PASSED_ON:
        if p[name] is not None:
            value = os.path.abspath(p[name]) if name == "lr_from" else p[name]
            args += [f"--{name.replace('_', '-')}", str(value)]
    if p["seed"] is None:  # written out, so every job of a sweep shows the seed it shares
        args += ["--seed", str(cfg.train.seed)]
    return jobs_lib.JobSpec(
        partition=p["partition"], nodes=nodes, data=p["data_path"], ranks_per_node=p["ranks_per_node"],
        name=p["name"], runs_dir=p["runs_dir"], run_dir=run_dir, queue=p["queue"], time=p["walltime"],
        account=p["account"], launcher=p["launcher"], srun_mpi=p["srun_mpi"], hw_threads=p["hw_threads"],
        cores_per_node=p["cores_per_node"], timeline=p["timeline"], venv=p["venv"] or "",
        setup=tuple(p["setup"]), train_args=tuple(args), check_data=p["check_data"],
        train_config=cfg)


def _command_line(sub: str) -> str:
    """How this script was rendered, for its header (when it can be told from argv)."""
    if sys.argv[1:2] == [sub]:
        return shlex.join(["distseg-jobs", *sys.argv[1:]])
    return f"distseg-jobs {sub} ..."


@click.group(context_settings={"max_content_width": 100})
def jobs():
    """Slurm job scripts for distseg: one job, or a scaling sweep with its report."""


@jobs.command()
@click.option("--nodes", required=True, type=click.IntRange(1), help="Nodes for this job.")
@click.option("--run-dir", default="", help="Run directory (default RUNS_DIR/NAME-nNODES).")
@_job_options
def render(nodes, run_dir, **p):
    """Print a ready sbatch script for one training job.

    \b
    distseg-jobs render --partition knl --nodes 16 --ranks-per-node 4 \\
        --data liver.h5 --epochs 20 --seed 1 > knl-n16.sbatch
    sbatch knl-n16.sbatch
    """
    try:
        job = jobs_lib.resolve(_spec(nodes, run_dir, p))
        script = jobs_lib.render(job, _command_line("render"))
    except DistsegError as e:
        fail(str(e), e.exit_code)
    click.echo(script, nl=False)


@jobs.command()
@click.option("--nodes", "node_list", required=True, help="Node counts, e.g. 1,2,4,8,16,32.")
@click.option("--out", "out_dir", default=".", show_default=True, help="Folder for the scripts and submit.sh.")
@click.option("--chain/--no-chain", default=True, show_default=True,
              help="Run the jobs one after another (each waits for the previous one).")
@click.option("--target-loss", type=float, multiple=True, help="distseg-report --target-loss (repeatable).")
@click.option("--target-dice", type=float, multiple=True, help="distseg-report --target-dice (repeatable).")
@_job_options
def sweep(node_list, out_dir, chain, target_loss, target_dice, **p):
    """Write one sbatch script per node count, report.sbatch and submit.sh.

    Every job gets the same training options and seed; only the nodes differ.
    Then `bash OUT/submit.sh` submits them all and a distseg-report job after them.

    \b
    distseg-jobs sweep --partition knl --nodes 1,2,4,8,16,32 --data liver.h5 \\
        --epochs 20 --seed 1 --target-loss -0.75 --out sweep-knl
    bash sweep-knl/submit.sh
    """
    report_args = [a for t in target_loss for a in ("--target-loss", str(t))]
    report_args += [a for t in target_dice for a in ("--target-dice", str(t))]
    try:
        nodes = schema.parse_node_counts(node_list, "--nodes")
        written = jobs_lib.write_sweep(_spec(nodes[0], "", p), nodes, out_dir, chain=chain,
                                       report_args=report_args, command=_command_line("sweep"))
    except DistsegError as e:
        fail(str(e), e.exit_code)
    for name, job in zip(written.scripts, written.jobs):
        t = job.threads
        layout = f"{t.cores_per_rank} cores/rank" if t else "cores from the allocation"
        click.echo(f"wrote {os.path.join(written.out_dir, name)}: {job.spec.nodes} node(s) x "
                   f"{job.ranks_per_node} ranks, {layout} -> {job.run_dir}")
    click.echo(f"wrote {os.path.join(written.out_dir, written.report)}: distseg-report -> {written.report_dir}")
    click.echo(f"wrote {os.path.join(written.out_dir, written.submit)}")
    click.echo(f"next: bash {shlex.quote(os.path.join(written.out_dir, written.submit))}")


@jobs.command()
@click.option("--recipe", "recipe_texts", multiple=True, required=True, metavar="NAME[=FLAGS]",
              help="A recipe: a name and the distseg-train flags that make it, over the common "
                   "options (e.g. dice='--loss dice'); repeatable. The plan adds --fold. "
                   "--data FILE among them: the recipe's own data file (e.g. a 3D recipe's "
                   "volumes), holding the same cases and folds as --data.")
@click.option("--nodes", "node_list", default="1", show_default=True,
              help="Node counts each recipe's folds train at, e.g. 1,2.")
@click.option("--folds", "fold_list", default=None,
              help="The folds to run, e.g. 0,1 (default: every fold of the data file's table).")
@click.option("--out", "out_dir", required=True, help="The CV directory: cv.json, runs/, jobs/, submit.sh.")
@click.option("--target-dice", type=float, default=None,
              help="Mean foreground validation Dice the report counts hours to.")
@_job_options
def cv(recipe_texts, node_list, fold_list, out_dir, target_dice, **p):
    """Write a cross-validation as jobs: one per recipe x node count x fold, folds side by
    side, each resuming after a requeue, and a distseg-report job after all of them.

    The data file must hold folds (distseg-data folds FILE --folds K, convert --folds K,
    or lits-sample --folds K). `bash OUT/submit.sh` submits it on Slurm; `distseg-jobs
    cv-run OUT` trains the same plan on this machine, one run after another, continuing
    where it stopped (docs/cross-validation.md).

    \b
    distseg-jobs cv --partition generic --cores-per-node 2 --ranks-per-node 1 \\
        --data liver.h5 --nodes 1,2 --epochs 8 --out cv-loss \\
        --recipe dice_ce='--preset demo' --recipe dice='--preset demo --loss dice'
    bash cv-loss/submit.sh        # or: distseg-jobs cv-run cv-loss

    A 2D and a 3D recipe each train their own file (--data inside the recipe), and
    distseg-predict --cv OUT --out-of-fold scores them and their ensemble for the report.
    """
    from distseg.cli.train import parse_config
    from distseg.cluster import cv as cv_lib
    try:
        recipes = [cv_lib.parse_recipe(t) for t in recipe_texts]
        nodes = schema.parse_node_counts(node_list, "--nodes")
        folds = cv_lib.parse_folds(fold_list) if fold_list else None
        written = cv_lib.write_cv(_spec(nodes[0], "", p), recipes, nodes, out_dir, parse_config,
                                  folds=folds, target_dice=target_dice, command=_command_line("cv"))
    except DistsegError as e:
        fail(str(e), e.exit_code)
    plan = written.plan
    click.echo(f"wrote {written.cv_dir}/cv.json: {len(plan.recipes)} recipe(s) x {len(plan.nodes)} "
               f"node count(s) x {len(plan.folds)} fold(s) of {plan.k} = {len(plan.runs)} runs")
    click.echo(f"wrote {len(written.scripts)} job scripts in {written.cv_dir}/jobs, report.sbatch and submit.sh")
    click.echo(f"next: bash {shlex.quote(os.path.join(written.cv_dir, 'submit.sh'))}   "
               f"(or, without Slurm: distseg-jobs cv-run {shlex.quote(written.cv_dir)})")


@jobs.command("cv-run")
@click.argument("cv_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--report/--no-report", default=True, show_default=True,
              help="Run distseg-report over the CV after the last run (into CV_DIR/report).")
@click.option("--only", multiple=True, metavar="LABEL",
              help="Train only this run of the plan (RECIPE-nN-fold-I); repeatable.")
def cv_run(cv_dir, report, only):
    """Train a CV plan on this machine without Slurm: every run of CV_DIR/cv.json one
    after another, with the command line its job would start (several ranks through
    horovodrun on localhost). Finished runs are skipped and a stopped one resumes from
    its last checkpoint, so running it again continues the CV. Exits 1 if a run failed.
    """
    import subprocess

    from distseg.cluster import cv as cv_lib
    from distseg.core import cvplan
    try:
        outcome = cv_lib.run_local(cv_dir, echo=click.echo, only=only)
        plan = cvplan.read(cv_dir)
    except DistsegError as e:
        fail(str(e), e.exit_code)
    click.echo(f"trained {len(outcome.trained)}, already done {len(outcome.skipped)}, "
               f"failed {len(outcome.failed)}" + (f": {', '.join(outcome.failed)}" if outcome.failed else ""))
    if report:
        code = subprocess.call(cv_lib.report_command(cv_dir, plan))
        if code:
            fail(f"distseg-report over {cv_dir} failed (exit {code})", 1)
    if outcome.failed:
        raise SystemExit(1)


@jobs.command()
def partitions():
    """List the node types --partition accepts, with their layout and queues."""
    for part in jobs_lib.PARTITIONS.values():
        cores = f"{part.cores_per_node} cores" if part.cores_per_node else "cores from the allocation"
        click.echo(f"{part.key}: {part.title}")
        click.echo(f"  {cores}, {part.threads_per_core} thread(s)/core, {part.sockets} socket(s), "
                   f"{part.reserved_cores} reserved, default {part.default_ranks_per_node} rank(s)/node, "
                   f"queue {part.default_queue or '(cluster default)'}")
        for q in part.queues:
            click.echo(f"  queue {q.name}: up to {q.max_nodes} nodes, {q.max_minutes // 60} h")


@jobs.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--ranks", required=True, type=click.IntRange(1), help="Ranks the launch started.")
def outcome(run_dir, ranks):
    """Say how the last launch of a run ended, from its logs and checkpoints.

    Prints one line: `stopped` (every rank checkpointed and stopped: --resume continues
    it), `ended` (every rank wrote its end record), or `lost R...` (these ranks' logs end
    without one: killed or crashed). The job scripts call this after the launcher exits,
    to decide whether to requeue and which ranks to name.
    """
    click.echo(outcome_lib.run_outcome(run_dir, ranks).line())


if __name__ == "__main__":  # python -m distseg.cli.jobs (before the entry point is installed)
    jobs()
