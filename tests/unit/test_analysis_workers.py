"""``analysis.workers``: logs read in worker processes give the report read in one.

The pool runs the real ``summary.reduce_file`` in real worker processes (two, on any
machine: the test forces them), so these tests take a few seconds of start-up.
"""

import os

import pandas as pd
import pytest
from click.testing import CliRunner

from analysis import logs, workers
from analysis.cli import report as report_cmd
from analysis.report import ReportOptions, build
from distseg.core.errors import InputError
from tests.analysis_fixtures.runs import Launch, RunSpec, run_record, step, write_log, write_run


def test_worker_count_pays_only_for_enough_to_read_on_several_cores():
    gib, mib = 1 << 30, 1 << 20
    assert workers.worker_count(22 * gib, 86 * mib, 256, cores=2) == 2
    assert workers.worker_count(22 * gib, 86 * mib, 256, cores=64) == 4  # 2 GiB / (5 x 86 MiB)
    assert workers.worker_count(22 * gib, 10 * mib, 2560, cores=64) == workers.MAX_WORKERS
    assert workers.worker_count(22 * gib, 86 * mib, 256, cores=1) == 0
    assert workers.worker_count(10 * mib, mib, 64, cores=2) == 0       # too little to read
    assert workers.worker_count(22 * gib, 22 * gib, 1, cores=2) == 0   # one file
    # a few huge files: only as many workers as memory allows (5 x 200 MiB each, 2 GiB)
    assert workers.worker_count(4 * gib, 200 * mib, 20, cores=16) == 2
    assert workers.worker_count(4 * gib, 500 * mib, 10, cores=16) == 0


def test_ordered_map_keeps_the_order_in_either_mode():
    args = [(str(i),) for i in range(7)]
    with workers.ordered_map(int, args, 0) as serial:
        assert list(serial) == list(range(7))
    with workers.ordered_map(int, args, 2) as parallel:
        assert list(parallel) == list(range(7))


@pytest.fixture
def study(tmp_path):
    common = dict(epochs=4, train_samples=16, batch_size=2, warmup_step_time=3.0)
    return [
        write_run(str(tmp_path / "np1"), RunSpec(size=1, step_time=1.0, **common)),
        write_run(str(tmp_path / "np4"), RunSpec(size=4, step_time=[1.0, 1.2, 1.1, 1.3],
                                                 data_wait=[0.1, 0.2, 0.0, 0.4], **common)),
        write_run(str(tmp_path / "resumed"), RunSpec(
            size=2, launches=[Launch(0, 2, killed_after=1), Launch(2, 4)], **common)),
    ]


def test_the_report_read_by_workers_equals_the_report_read_serially(study):
    options = ReportOptions(target_loss=(-0.15, -0.2), target_dice=(0.6,), smooth=2)
    serial = build(study, options, processes=0)
    parallel = build(study, options, processes=2)
    for (name, _, a), (_, _, b) in zip(serial.tables.csv_frames(), parallel.tables.csv_frames()):
        pd.testing.assert_frame_equal(a, b, obj=name)
    assert serial.notes == parallel.notes
    assert [r.curve_rank for r in serial.runs] == [r.curve_rank for r in parallel.runs] == [0, 0, 0]


def test_a_newer_log_is_refused_from_a_worker_too(tmp_path):
    run_dir = str(tmp_path / "new")
    write_log(run_dir, 0, [run_record(0, 2), step(0, 0, 0, 1.0)])
    path = write_log(run_dir, 1, [run_record(1, 2, schema_version=9), step(1, 0, 0, 1.0)])
    with pytest.raises(InputError) as e:
        logs.load_runs([run_dir], show_progress=False, processes=2)
    assert str(e.value).startswith(f"{path}: schema_version 9 is newer")


def test_the_command_takes_a_number_of_workers(study, tmp_path):
    res = CliRunner().invoke(report_cmd, [study[0], "--workers", "2", "--out",
                                          str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert os.path.exists(tmp_path / "r" / "report.json")
    res = CliRunner().invoke(report_cmd, [study[0], "--workers", "-1"])
    assert res.exit_code == 2 and "--workers" in res.output
