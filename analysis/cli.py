"""Command line of ``analysis``: ``distseg-report`` (parses options, calls one function)."""

from __future__ import annotations

import click


def _node_counts(ctx, param, value: str | None) -> tuple[int, ...]:
    """``--project-nodes`` through the one node-list parser (a bad list: exit 2)."""
    if not value:
        return ()
    from distseg.core.errors import InputError
    from distseg.core.schema import parse_node_counts

    try:
        return parse_node_counts(value, "--project-nodes")
    except InputError as e:
        raise click.BadParameter(str(e))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path())
@click.option("--target-loss", type=float, multiple=True,
              help="Training-loss target, repeatable (e.g. -0.75): hours until loss <= target.")
@click.option("--target-dice", type=float, multiple=True,
              help="Validation-Dice target, repeatable (e.g. 0.9): hours until Dice >= target.")
@click.option("--dice-class", default=None,
              help="Class a Dice target refers to (default: mean over foreground classes).")
@click.option("--smooth", type=int, default=0, show_default=True,
              help="Trailing mean over this many steps for the loss curve and loss targets.")
@click.option("--out", "out_dir", default="report", show_default=True, type=click.Path(),
              help="Directory for the CSVs, plots, report.md, report.html and report.json.")
@click.option("--format", "fmt", type=click.Choice(["md", "json"]), default="md",
              show_default=True, help="What to print: Markdown tables or a JSON document.")
@click.option("--project-nodes", callback=_node_counts, default=None,
              help="Project time per epoch, and predict batch, lr, throughput, samples and "
                   "hours to each target, at these node counts, e.g. 2,4,8,16,32,64.")
@click.option("--bandwidth-gbps", type=float, default=None,
              help="Projection: link bandwidth in Gbit/s (default: as a run measured it "
                   "between hosts, else 100, flagged ASSUMED).")
@click.option("--latency-us", type=float, default=None,
              help="Projection: latency per allreduce message in microseconds (default: "
                   "as a run measured it between hosts, else 2, flagged ASSUMED).")
@click.option("--latency-term", type=click.Choice(["ring", "log"]), default="ring",
              show_default=True, help="Projection: 2(R-1) (ring) or 2 log2 R message rounds.")
@click.option("--grad-bytes", type=float, default=None,
              help="Projection: gradient bytes per step (default: logged parameters x 4).")
@click.option("--ranks-per-node", type=int, default=None,
              help="Projection: ranks per node (default: as in the largest measured run).")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr (default: when stderr is a terminal).")
@click.option("--workers", type=click.IntRange(0), default=None,
              help="Processes that read the logs (0: read in this one; default: one per "
                   "core when there is enough to read).")
@click.option("--tensorboard", "tensorboard_dir", default=None, type=click.Path(file_okay=False),
              help="Also write every run's logs, all ranks, as TensorBoard event files, one "
                   "run per directory: DIR/RUN (view with tensorboard --logdir DIR).")
def report(run_dirs, target_loss, target_dice, dice_class, smooth, out_dir, fmt, project_nodes,
           bandwidth_gbps, latency_us, latency_term, grad_bytes, ranks_per_node, progress,
           workers, tensorboard_dir):
    """Scaling tables, loss versus time and hours-to-target from distseg run directories.

    RUN_DIRS are run directories (each with logs/rank-NNNNN.jsonl), e.g. runs at 1, 2
    and 4 nodes: distseg-report runs/np1 runs/np2 runs/np4 --target-loss -0.75
    --target-loss -0.76 --out report/. A directory with a cv.json (distseg-jobs cv)
    stands for every run of its plan and adds the cross-validation tables.
    """
    from analysis.report import ReportOptions, main
    from distseg.core.errors import DistsegError, fail, output_dir

    try:
        options = ReportOptions(
            target_loss=tuple(target_loss), target_dice=tuple(target_dice),
            dice_class=dice_class, smooth=smooth, project_nodes=project_nodes,
            bandwidth_gbps=bandwidth_gbps, latency_us=latency_us, latency_term=latency_term,
            grad_bytes=grad_bytes,
            ranks_per_node=ranks_per_node).validate()
    except ValueError as e:
        raise click.UsageError(str(e))
    try:
        output_dir(out_dir, "--out", keep=False)
        if tensorboard_dir:
            output_dir(tensorboard_dir, "--tensorboard", keep=False)
        main(list(run_dirs), options, out_dir=out_dir, fmt=fmt, show_progress=progress,
             processes=workers)
        if tensorboard_dir:
            from analysis.board import export
            export(list(run_dirs), tensorboard_dir)
    except DistsegError as e:
        # One line and the error's own exit code (2 for bad input), as distseg-train.
        fail(str(e), e.exit_code)
