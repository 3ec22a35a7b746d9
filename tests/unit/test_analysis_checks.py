"""``analysis.checks``: each warning fires on a run made to trigger it and stays silent
on a healthy one, and reaches the report's Warnings section."""

import pytest

from analysis import checks, outline
from analysis.document import Role
from analysis.report import ReportOptions, build
from tests.analysis_fixtures.runs import Launch, RunSpec, write_run


def _warnings(report):
    return [n.message for n in report.notes if n.level == "warning"]


def _warning_section(report):
    return [s for s in report.document().sections if s.role is Role.WARNINGS]


@pytest.fixture
def healthy(tmp_path):
    # 2 ranks pinned to one CPU each, Dice rising, a smooth loss: nothing to warn of.
    return write_run(str(tmp_path / "healthy"), RunSpec(
        size=2, epochs=4, threads=lambda r: {"cores": 1, "pinned": True, "affinity": [r]}))


def test_a_healthy_run_has_no_warning(healthy):
    rep = build([healthy], ReportOptions(target_loss=(-0.15,), smooth=3))
    assert _warnings(rep) == [] and _warning_section(rep) == []


def test_eight_ranks_on_two_cores_are_named(tmp_path):
    # Unpinned: every rank may run on CPUs 0 and 1 of the same host.
    run = write_run(str(tmp_path / "np8"), RunSpec(
        size=8, epochs=2, train_samples=32,
        threads=lambda r: {"cores": 1, "pinned": False, "affinity": [0, 1]}))
    rep = build([run])
    (warning,) = _warnings(rep)
    assert warning.startswith("8 ranks shared 2 CPU(s) on host node0: more ranks than cores")
    assert "measure the oversubscription, not Horovod" in warning
    (section,) = _warning_section(rep)
    assert section.items == (f"[warning] np8: {warning}",)


def test_oversubscription_counts_ranks_per_host_and_launch(tmp_path):
    # 4 ranks on 2 hosts, 2 CPUs each: not oversubscribed; a resume onto one host is.
    spec = dict(size=4, epochs=4, train_samples=32,
                threads=lambda r: {"cores": 1, "pinned": False, "affinity": [0, 1]})
    fine = write_run(str(tmp_path / "fine"), RunSpec(hosts=["a", "a", "b", "b"], **spec))
    assert checks.oversubscription(build([fine]).runs[0]) == []
    squeezed = write_run(str(tmp_path / "squeezed"), RunSpec(
        hosts=["a", "a", "b", "b"], launches=[Launch(0, 2), Launch(2, 4, hosts=["c"] * 4)],
        **spec))
    (note,) = checks.oversubscription(build([squeezed]).runs[0])
    assert note.message.startswith("4 ranks shared 2 CPU(s) on host c (launch 1)")


def test_a_run_without_affinity_in_its_logs_is_not_judged(tmp_path):
    run = write_run(str(tmp_path / "old"), RunSpec(size=8, epochs=2, train_samples=32))
    assert checks.oversubscription(build([run]).runs[0]) == []


def _dice_falls_at_epoch_2(by):
    return lambda epoch, rank, cls: 0.8 - (by if epoch == 2 else 0.0)


def test_a_fall_of_the_validation_dice_is_named(tmp_path):
    run = write_run(str(tmp_path / "np2"), RunSpec(epochs=4, val_dice=_dice_falls_at_epoch_2(0.25)))
    rep = build([run])
    (warning,) = _warnings(rep)
    assert warning.startswith("validation Dice (mean liver+lesion) fell by 0.25 from epoch 1 "
                              "(0.800) to epoch 2 (0.550): unstable training")
    liver = checks.dice_drops(rep.runs[0], "liver")[0].message
    assert liver.startswith("validation Dice (liver) fell by 0.25")


def test_a_small_fall_of_the_validation_dice_is_not_warned_of(tmp_path):
    run = write_run(str(tmp_path / "np2"), RunSpec(epochs=4, val_dice=_dice_falls_at_epoch_2(0.09)))
    assert _warnings(build([run])) == []


def _one_lucky_step(k):
    return -0.9 if k == 7 else -0.5


def test_a_target_reached_by_one_step_but_not_by_the_trailing_mean(tmp_path):
    # 2 ranks x 4 steps of 1 s per epoch: step 7 ends at 8 s.
    run = write_run(str(tmp_path / "np2"), RunSpec(epochs=3, loss=_one_lucky_step))
    rep = build([run], ReportOptions(target_loss=(-0.8, -0.4), smooth=3))
    (warning,) = _warnings(rep)
    assert warning == ("--target-loss -0.8 is reached by the raw step loss (at 8.0 s, global "
                       "step 7) but never by its trailing mean over 3 steps: single steps "
                       "dipped below the target, the trend did not")
    row = rep.tables.hours_to_target.query("target == -0.8").iloc[0]
    assert row["result"] == "not reached" and row["metric"] == "train_loss (smoothed 3)"
    # without --smooth the table has the raw crossing, and nothing to warn of
    raw = build([run], ReportOptions(target_loss=(-0.8,)))
    assert _warnings(raw) == []
    assert raw.tables.hours_to_target.iloc[0]["global_step"] == 7


def test_warnings_come_right_after_the_answer_and_the_runs(tmp_path):
    run = write_run(str(tmp_path / "np2"), RunSpec(epochs=4, val_dice=_dice_falls_at_epoch_2(0.3)))
    rep = build([run])
    titles = [s.title for s in outline.sections(rep.tables, rep.notes)]
    assert titles[:3] == [outline.ANSWER_TITLE, "Runs", "Warnings"]
