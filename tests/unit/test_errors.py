"""Errors caught by type, never by their words: the schema's record errors (and the
report notes that depend on which one), and the one stop flag that training and
conversion share."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from analysis import logfile
from distseg.core import errors, schema
from distseg.core.stopflag import StopFlag
from distseg.data.convert import pipeline
from distseg.training import stopping
from tests.analysis_fixtures.runs import end_record, epoch_record, run_record, step, write_log


def _no_status(rank: int, t: float) -> dict:
    rec = end_record(rank, t)
    del rec["status"]
    return rec


@pytest.mark.parametrize("record, kind, message", [
    ({"type": "nope"}, schema.UnknownRecordType, "record type 'nope' is not one of"),
    ({"type": "end", "rank": 0, "time": 1.0}, schema.MissingFields,
     "end record lacks field(s) status, reason, t, epochs_done"),
    (_no_status(0, 3.0), schema.MissingFields, "end record lacks field(s) status"),
    (end_record(0, 3.0, status="crashed"), schema.UnknownStatus,
     "end record status 'crashed' is not one of ('ok', 'error', 'interrupted')"),
])
def test_a_broken_record_raises_the_class_that_says_how(record, kind, message):
    with pytest.raises(kind) as err:
        schema.validate_record(record)
    assert str(err.value).startswith(message)
    # One family: a RecordError is bad input (exit 2), and still a ValueError.
    assert isinstance(err.value, schema.RecordError) and isinstance(err.value, errors.InputError)
    assert isinstance(err.value, ValueError) and err.value.exit_code == errors.EXIT_BAD_INPUT
    assert len({schema.UnknownRecordType, schema.MissingFields, schema.UnknownStatus}
               & set(type(err.value).__mro__)) == 1


def test_a_valid_record_passes():
    schema.validate_record(end_record(0, 3.0))
    schema.validate_record(step(0, 0, 0, 1.0))


def test_the_report_notes_a_bad_status_as_is_and_missing_fields_as_used(tmp_path):
    """The note's words follow the error's class: an unknown status is reported as it
    is, a record lacking fields is used for what it has."""
    epoch = epoch_record(0, 0, 4.0)
    del epoch["val_dice"]
    path = write_log(str(tmp_path), 0, [run_record(0, 1), step(0, 0, 0, 1.0), epoch,
                                        end_record(0, 5.0, status="crashed"), _no_status(0, 6.0)])
    notes = [n.message for n in logfile.read_rank_log(path, 0).notes if n.level == "warning"]
    assert notes == [
        "line 3: epoch record lacks field(s) val_dice; used what is there",
        "line 4: end record status 'crashed' is not one of ('ok', 'error', 'interrupted')",
        "line 5: end record lacks field(s) status; used what is there",
    ]


def test_the_stop_flag_keeps_its_first_reason_and_raises_it():
    flag = StopFlag()
    assert not flag.requested
    flag.check()  # nothing asked: no error
    flag.request("received signal 15 (SIGTERM)")
    flag.request("the launcher (pid 1) is gone")
    assert flag.requested and flag.reason == "received signal 15 (SIGTERM)"
    with pytest.raises(errors.Interrupted, match=r"^received signal 15 \(SIGTERM\)$") as err:
        flag.check()
    assert err.value.exit_code == errors.EXIT_INTERRUPTED


def test_training_routes_a_real_signal_to_the_shared_flag():
    flag = StopFlag()
    before = signal.getsignal(signal.SIGUSR1)
    with contextlib.ExitStack() as resources:
        stopping.install(flag, resources, (signal.SIGUSR1,))
        os.kill(os.getpid(), signal.SIGUSR1)
        assert flag.reason == f"received signal {int(signal.SIGUSR1)} (SIGUSR1)"
        os.kill(os.getpid(), signal.SIGUSR1)  # a second one changes nothing, raises nothing
    assert signal.getsignal(signal.SIGUSR1) is before


def test_a_signal_before_training_starts_becomes_a_stop_request():
    # distseg-train installs these handlers before it imports TensorFlow (issue 22: an
    # early Slurm USR1 killed both ranks of a real job).
    before = signal.getsignal(signal.SIGUSR1)
    try:
        stopping.install_early((signal.SIGUSR1,))
        os.kill(os.getpid(), signal.SIGUSR1)  # recorded, the process lives on
        flag = StopFlag()
        with contextlib.ExitStack() as resources:
            stopping.install(flag, resources, (signal.SIGUSR1,))
            assert flag.reason == f"received signal {int(signal.SIGUSR1)} (SIGUSR1) during start-up"
        # Acted on once: the next training of this process starts with no request.
        later = StopFlag()
        with contextlib.ExitStack() as resources:
            stopping.install(later, resources, (signal.SIGUSR1,))
            assert not later.requested
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_conversion_stops_at_the_next_case_and_at_once_on_a_second_signal():
    flag = StopFlag()
    before = signal.getsignal(signal.SIGTERM)
    with pipeline._signals_stop(flag):
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.reason == "signal SIGTERM"
        with pytest.raises(errors.Interrupted, match=r"^signal SIGTERM$"):
            flag.check()
        with pytest.raises(errors.Interrupted, match=r"^signal SIGTERM \(second\)$"):
            os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before


def test_one_stop_flag_class():
    assert stopping.StopFlag is pipeline.StopFlag is StopFlag
