"""``distseg.core.schema``: the one rule for reading a log line, and its three readers
(``schema.read_log``, the report's ``analysis.logfile``, ``distseg-jobs outcome``'s
``outcome.last_record``) agreeing on the same damaged log; the upgrade of older logs'
field names to schema 3's that every reader gets from it."""

import json

import pytest

from analysis import logfile
from distseg.cluster import outcome as outcome_lib
from distseg.core import schema
from tests.analysis_fixtures.runs import end_record, epoch_record, run_record, step, write_log

STEP = json.dumps(step(0, 0, 0, 1.0), separators=(",", ":")).encode()
CUT = b'{"type":"step","rank":0,"ep'  # a write cut off by a kill


@pytest.mark.parametrize("raw, terminated, damage, kept", [
    (STEP, True, "", True),                       # a whole record
    (STEP, False, "", True),                      # a file that only lacks its last newline
    (b"  \r\n", True, "", False),                 # blank: skipped silently
    (CUT, False, schema.TRUNCATED, False),        # the last line, cut off: skipped
    (CUT + b"\n", True, schema.DAMAGED, False),   # the same in the middle: corrupt
    (CUT + STEP + b"\n", True, schema.SALVAGED, True),  # killed, then resumed on that line
    (CUT + STEP, False, schema.TRUNCATED, False),  # a last line is never repaired
    (b"[1, 2]\n", True, schema.DAMAGED, False),   # JSON, but no record
    (b'{"type": 3}\n', True, schema.DAMAGED, False),  # a type that is no name
])
def test_parse_line_follows_the_one_rule(raw, terminated, damage, kept):
    line = schema.parse_line(raw, terminated)
    assert line.damage == damage and (line.record is not None) == kept
    if kept:
        assert line.record == json.loads(STEP)
    assert bool(line.problem) == bool(damage)


def test_the_problem_of_a_truncated_line_names_its_size():
    assert schema.parse_line(CUT, terminated=False).problem == (
        f"truncated last line ({len(CUT)} bytes; job killed or still running)")


def test_last_line_does_not_pass_over_a_truncated_write():
    end = json.dumps(end_record(0, 2.0)).encode()
    assert schema.last_line(end + b"\n\n").record["type"] == "end"
    assert schema.last_line(end + b"\n" + CUT).damage == schema.TRUNCATED
    assert schema.last_line(b"").record is None and schema.last_line(b"\n \n").damage == ""


def _damaged_log(tmp_path, truncated: bool) -> str:
    """run, step, a corrupt line (3), a salvaged step (4), an end record, and maybe a
    truncated last line (6): a run that ended, was resumed and killed mid-write."""
    lines = [run_record(0, 1), step(0, 0, 0, 1.0), CUT.decode() + "\n",
             CUT.decode() + json.dumps(step(0, 0, 1, 2.0)) + "\n", end_record(0, 3.0)]
    return write_log(str(tmp_path / "run"), 0, lines + ([CUT.decode()] if truncated else []))


@pytest.mark.parametrize("truncated", [False, True])
def test_the_three_readers_agree_on_a_damaged_log(tmp_path, truncated):
    path = _damaged_log(tmp_path, truncated)
    records, problems = schema.read_log(path)
    log = logfile.read_rank_log(path, 0)
    # The same records: the corrupt line 3 and the truncated line 6 skipped, line 4 kept.
    assert [r["type"] for r in records] == ["run", "step", "step", "end"]
    assert (len(log.runs), list(log.steps["t"]), len(log.ends)) == (1, [1.0, 2.0], 1)
    # The same lines named, with the same words.
    salvaged = "a truncated record followed by another on the same line (resumed after a kill); kept the latter"
    cut = f"truncated last line ({len(CUT)} bytes; job killed or still running)"
    assert problems == [f"{path}:3: not a log record (not a valid JSON object with a type)",
                        f"{path}:4: {salvaged}"] + ([f"{path}:6: {cut}"] if truncated else [])
    assert [n.message for n in log.notes if n.level == "skipped"] == (
        [f"line 6: {cut}"] if truncated else []) + [f"line 4: {salvaged}"] + [
        "1 line(s) that are not log records (not valid JSON objects with a type): line 3"]
    # distseg-jobs outcome: the log ends in the end record, unless a truncated write
    # follows it (the resumed launch was killed): then it ends in no record at all.
    assert outcome_lib.last_record(path) == (None if truncated else records[-1])


# A schema-2 run record and epoch record, as the trainer wrote them (field order kept),
# and the same by schema 3's names.
RUN_2 = run_record(0, 2, schema_version=2, batch_policy="chosen", loss_scope="global_batch")
NOISE_2 = {"b_simple": 4.0, "g2": 2.0, "trace": 8.0, "b_simple_raw": 1.0, "g2_raw": 0.5,
           "trace_raw": 0.5, "method": "ranks"}
POLICY = {"policy": "goodput", "per_rank": 2, "goodput": {"2": 1.0, "4": 1.5},
          "next_per_rank": 4, "switched": True}
EPOCH_2 = epoch_record(0, 1, 4.0, noise_scale=NOISE_2, batch_policy=POLICY, comm={"steps": 4})


def test_upgrade_renames_what_schema_3_renamed_and_nothing_else():
    run = schema.upgrade(RUN_2)
    assert list(run) == [("batch_plan" if k == "batch_policy" else k) for k in RUN_2]
    assert run["batch_plan"] == "chosen" and run["schema_version"] == 2  # as written
    epoch = schema.upgrade(EPOCH_2)
    assert list(epoch) == [("goodput" if k == "batch_policy" else k) for k in EPOCH_2]
    assert epoch["goodput"] == POLICY  # the policy's own fields keep their names
    assert epoch["noise_scale"] == {"b_simple": 4.0, "g2": 2.0, "tr_sigma": 8.0,
                                    "b_simple_raw": 1.0, "g2_raw": 0.5, "tr_sigma_raw": 0.5,
                                    "method": "ranks"}
    assert list(epoch["noise_scale"])[2] == "tr_sigma"  # in its place
    assert {k: v for k, v in epoch.items() if k not in ("goodput", "noise_scale")} == \
        {k: v for k, v in EPOCH_2.items() if k not in ("batch_policy", "noise_scale")}
    # The records read are new dicts: what was given is left as it was.
    assert "batch_policy" in RUN_2 and "trace" in EPOCH_2["noise_scale"]


def test_upgrade_leaves_schema_3_and_other_records_as_they_are():
    for rec in (schema.upgrade(RUN_2), schema.upgrade(EPOCH_2), step(0, 0, 0, 1.0),
                end_record(0, 2.0), step(0, 0, 0, 1.0, batch_policy="x"),
                run_record(0, 1, batch_plan="per_rank", batch_policy="x")):
        assert schema.upgrade(rec) is rec  # a step's or a newer record's fields are not ours
    # noise_scale is an epoch record's field only; null where not logged.
    odd = {"type": "end", "noise_scale": {"trace": 1.0}}
    assert schema.upgrade(odd) is odd
    assert schema.upgrade(epoch_record(0, 0, 1.0, noise_scale=None))["noise_scale"] is None


@pytest.mark.parametrize("raw", [
    json.dumps(EPOCH_2).encode(),               # a whole line
    CUT + json.dumps(EPOCH_2).encode(),          # salvaged after a cut-off record
])
def test_every_reader_sees_schema_3_names(tmp_path, raw):
    line = schema.parse_line(raw)
    assert line.record == schema.upgrade(EPOCH_2) and "goodput" in line.record
    path = write_log(str(tmp_path / "run"), 0, [RUN_2, raw.decode() + "\n", end_record(0, 5.0)])
    records, _ = schema.read_log(path)
    assert records[:2] == [schema.upgrade(RUN_2), schema.upgrade(EPOCH_2)]
    log = logfile.read_rank_log(path, 0)
    assert log.runs[0]["batch_plan"] == "chosen" and log.epochs[0]["goodput"] == POLICY
    assert log.epochs[0]["noise_scale"]["tr_sigma"] == 8.0 and not log.unknown_fields
