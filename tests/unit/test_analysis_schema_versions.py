"""The report reads logs of every schema version by schema 3's names
(``distseg.core.schema.upgrade``): the same runs written with schema 2's names and with
schema 3's (``tests/analysis_fixtures/runs.py``, ``RunSpec.schema_version``) give the
same report, byte for byte, in every file it writes and in what it prints, and the same
TensorBoard scalars.

The runs use each renamed field in a way the report reads: tr(Sigma) (``noise_scale``)
drives the predicted samples to target and the goodput policy's choices per node count,
the run record's batch plan (a fixed global batch, a chosen one) the coverage check, and
the epoch records' ``goodput`` the TensorBoard export.
"""

import io
import os
import shutil

import pytest

from analysis import board
from analysis.logfile import read_rank_log
from analysis.report import ReportOptions, main
from distseg.core import rundir, schema
from tests.analysis_fixtures.runs import (
    RunSpec,
    epoch_record,
    names,
    run_record,
    write_log,
    write_run,
)

OPTIONS = ReportOptions(target_loss=(-0.3,), target_dice=(0.69,), project_nodes=(2, 8),
                        bandwidth_gbps=8.0, latency_us=0.0)


def _goodput(epoch: int) -> dict:
    """An epoch record's ``goodput``: 2 per rank, then 4 from epoch 1."""
    ran = 2 if epoch == 0 else 4
    return {"policy": "goodput", "per_rank": ran, "options": [2, 4],
            "goodput": {"2": 10.0, "4": 12.5 + epoch}, "next_per_rank": 4,
            "switched": epoch == 0, "reason": "4 predicted 1.25x the goodput of 2"}


def _write(root: str, version: int) -> list[str]:
    """Four runs in ``root`` written by log schema ``version``: 1 and 2 ranks of the
    ``goodput`` policy with a noise scale, and two hand-written launches whose run
    records say they cut global batches of 8 (``global``, ``chosen``) from 15 samples."""
    shutil.rmtree(root, ignore_errors=True)
    common = dict(epochs=3, loss=lambda k: -0.05 * k, params=100_000, consecutive=True,
                  noise_scale=lambda e: (6.0, 14.0, 30.0)[e], goodput=_goodput,
                  train_fields={"batch_policy": "goodput", "max_batch_per_rank": 8},
                  schema_version=version)
    runs = [write_run(os.path.join(root, "np1"), RunSpec(size=1, **common)),
            write_run(os.path.join(root, "np2"), RunSpec(size=2, step_time=1.1, **common))]
    for kind in ("global", "chosen"):
        run_dir = os.path.join(root, kind)
        for rank in range(2):
            write_log(run_dir, rank, [
                run_record(rank, 2, schema_version=version, dataset={"train_samples": 15},
                           batch_size=4, global_batch_size=8, steps_per_epoch=1,
                           **{names(version)["batch_plan"]: kind}),
                epoch_record(rank, 0, 1.0, samples=4)])
        runs.append(run_dir)
    return runs


def _rendered(tmp_path, version: int) -> tuple[dict[str, bytes], list]:
    """Every file the report writes and what it prints (``report.stdout``), and the
    TensorBoard scalars of the 2-rank run, from the runs written by ``version``; the
    runs and the report at the same paths whatever the version."""
    runs = _write(str(tmp_path / "runs"), version)
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    printed = io.StringIO()
    main(runs, OPTIONS, out_dir=str(out), fmt="json", stream=printed, processes=0)
    files = {name: (out / name).read_bytes() for name in sorted(os.listdir(out))}
    files["report.stdout"] = printed.getvalue().encode()
    logs = [read_rank_log(rundir.log_path(runs[1], rank), rank) for rank in (0, 1)]
    kept = {log.rank: board.kept_steps(log) for log in logs}
    scalars = [s for log in logs for s in board.step_series(log, kept[log.rank], log.rank == 0)]
    return files, scalars + board.epoch_series(logs, kept, logs[0])


def test_the_fixture_writes_each_schemas_own_names(tmp_path):
    old, new = (open(rundir.log_path(_write(str(tmp_path / f"v{v}"), v)[1], 0)).read()
                for v in (2, schema.SCHEMA_VERSION))
    for name in ('"batch_policy":"per_rank"', '"trace":', '"batch_policy":{'):
        assert name in old and name not in new
    for name in ('"batch_plan":"per_rank"', '"tr_sigma":', '"goodput":{"policy"'):
        assert name in new and name not in old


@pytest.mark.parametrize("version", [1, 2])
def test_the_report_of_older_logs_is_the_same_byte_for_byte(tmp_path, version):
    new_files, new_scalars = _rendered(tmp_path, schema.SCHEMA_VERSION)
    old_files, old_scalars = _rendered(tmp_path, version)
    assert sorted(old_files) == sorted(new_files)
    assert [n for n in new_files if old_files[n] != new_files[n]] == []
    # What the renamed fields feed is there to compare.
    for name in ("noise_prediction.csv", "noise_scale.csv", "projection_nodes.csv",
                 "coverage.csv", "report.html", "report.json", "report.md"):
        assert new_files[name]
    assert b"goodput: per-rank batch by epoch" in new_files["projection_nodes.csv"]
    assert b"global batch 8: 7 of 15 samples skipped" in new_files["coverage.csv"]
    assert old_scalars == new_scalars
    tags = {s.tag for s in new_scalars}
    assert {"noise/tr_sigma", "goodput/per_rank", "goodput/goodput/4"} <= tags
