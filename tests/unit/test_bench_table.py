"""How ``make bench`` (benchmarks/bench_table.py) compares like with like in precision:
distseg runs decide (``auto``), each peer, A/B and strong-scaling run trains in the
precision its distseg run of the same round chose, read from that run's ``run``
record, and the results and the table say what every run trained in. No TensorFlow:
the runs are stand-ins that return what a run would."""

from __future__ import annotations

import json
import os
import sys

import pytest

from distseg.core import rundir

from support import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import bench_table  # noqa: E402

from benchlib import runlogs  # noqa: E402


def settings(*argv: str) -> bench_table.Settings:
    return bench_table.parse_args(["--data", "x.h5", *argv])


def test_each_round_runs_a_distseg_run_before_the_runs_that_take_its_precision():
    names = list(bench_table.BASE_TRAINERS) + settings().ab
    even, odd = bench_table.round_order(names, 0), bench_table.round_order(names, 1)
    assert even == ["distseg-1", "keras-fit", "distseg-1+b1", "distseg-1+b2", "distseg-1+b4",
                    "distseg-2", "mwms-2", "distseg-2+localloss"]
    # Every other round the groups, and the A/B runs in each, in reverse order.
    assert odd == ["distseg-2", "mwms-2", "distseg-2+localloss",
                   "distseg-1", "keras-fit", "distseg-1+b4", "distseg-1+b2", "distseg-1+b1"]
    for order in (even, odd):
        for name in names:
            assert order.index(bench_table.lead_of(name)) <= order.index(name)
    # The order --trainers gives does not put a peer before its distseg run.
    assert bench_table.round_order(["keras-fit", "distseg-1"], 0) == ["distseg-1", "keras-fit"]


def test_a_peer_cannot_run_without_the_distseg_run_it_takes_its_precision_from(capsys):
    with pytest.raises(SystemExit):
        settings("--trainers", "keras-fit,distseg-2")
    assert "keras-fit trains in the precision distseg-1 chose" in capsys.readouterr().err
    assert settings("--trainers", "distseg-2,mwms-2").trainers == ["distseg-2", "mwms-2"]


def test_the_commands_carry_the_paired_precision_and_a_change_keeps_its_own():
    s, chosen = settings(), {"distseg-1": "bfloat16", "distseg-2": "float32"}
    assert bench_table.paired_precision("distseg-1", {}) is None  # it decides: auto
    assert bench_table.paired_precision("keras-fit", chosen) == "bfloat16"
    assert bench_table.paired_precision("mwms-2", chosen) == "float32"
    assert bench_table.paired_precision("distseg-2+localloss", chosen) == "float32"
    assert bench_table.paired_precision("distseg-1+bf16", {"distseg-1": "float32"}) is None
    assert bench_table.paired_precision("distseg-2+kerasbn", {"distseg-1": "float32"}) is None
    plain = bench_table.distseg_command("distseg-1", s, "/tmp/r")[0]
    assert "--precision" not in plain
    cmd = bench_table.distseg_command("distseg-1+b2", s, "/tmp/r", "bfloat16")[0]
    assert (read_flag(cmd, "--precision"), read_flag(cmd, "--batch-size")) == ("bfloat16", "2")
    bf16 = bench_table.distseg_command("distseg-1+bf16", s, "/tmp/r")[0]
    assert read_flag(bf16, "--precision") == "bfloat16" and bf16.count("--precision") == 1


def read_flag(cmd: list[str], flag: str) -> str:
    """The value distseg-train takes for ``flag``: the last one given (argparse)."""
    return cmd[len(cmd) - cmd[::-1].index(flag)]


def write_run_record(run_dir, record: dict) -> str:
    os.makedirs(rundir.log_dir(str(run_dir)))
    with open(rundir.log_path(str(run_dir), 0), "w") as f:
        f.write(json.dumps({"type": "run", "rank": 0, **record}) + "\n")
        f.write(json.dumps({"type": "epoch", "rank": 0, "epoch": 0}) + "\n")
    return str(run_dir)


def test_the_precision_a_run_trained_in_is_its_run_records(tmp_path):
    decided = {"requested": "auto", "flags": ["avx512_bf16"], "seconds": {"float32": 0.3, "bfloat16": 0.2},
               "speedup": 1.5, "choice": "bfloat16", "trial_s": 4.0, "reason": "bfloat16 step 1.50x"}
    run = write_run_record(tmp_path / "new", {"model": {"precision": "bfloat16"}, "precision": decided})
    assert runlogs.run_precision(run) == decided
    old = write_run_record(tmp_path / "old", {"model": {"precision": "float32"}})
    assert runlogs.run_precision(old) == {"requested": "float32", "choice": "float32"}


def test_peers_train_in_what_their_distseg_run_chose_in_the_same_round(monkeypatch):
    """Round 1's distseg-1 chooses bfloat16, round 2's float32: keras-fit follows it round
    by round, and every run's precision lands in the results."""
    choices = {("distseg-1", 0): "bfloat16", ("distseg-1", 1): "float32",
               ("distseg-2", 0): "float32", ("distseg-2", 1): "bfloat16"}
    calls, gemm = [], []
    rounds = iter([0] * 8 + [1] * 8)

    def fake_trainer(name, s, precision=None):
        r = next(rounds)
        calls.append((r, name, precision))
        if name == bench_table.lead_of(name):
            assert precision is None
            decision = {"requested": "auto", "choice": choices[name, r], "speedup": 1.2}
            return {"samples_per_s": 10.0, "precision": choices[name, r],
                    "precision_decision": decision}
        return {"samples_per_s": 8.0, "precision": precision,
                "precision_of": bench_table.lead_of(name)}

    monkeypatch.setattr(bench_table, "run_trainer", fake_trainer)
    monkeypatch.setattr(bench_table, "measure_gemm",
                        lambda s, precision: gemm.append(precision) or {"gemm_flops_per_s": 1e9})
    training = bench_table.interleaved_training(settings("--rounds", "2"))
    for r, name, precision in calls:
        if name != bench_table.lead_of(name):
            assert precision == choices[bench_table.lead_of(name), r], (r, name)
    runs = training["runs"]
    assert [x["precision"] for x in runs["keras-fit"]] == ["bfloat16", "float32"]
    assert [x["precision"] for x in runs["mwms-2"]] == ["float32", "bfloat16"]
    assert [x["precision"] for x in runs["distseg-2+localloss"]] == ["float32", "bfloat16"]
    assert gemm == ["bfloat16", "float32"]  # the FLOP count of distseg-1's model, each round


def test_the_table_says_what_each_run_trained_in():
    runs = {"distseg-1": [{"samples_per_s": 20.0, "precision": "bfloat16",
                           "precision_decision": {"requested": "auto", "speedup": 1.5}}] * 2,
            "keras-fit": [{"samples_per_s": 10.0, "precision": "bfloat16",
                           "precision_of": "distseg-1"}] * 2,
            "distseg-2": [{"samples_per_s": 30.0, "precision": p,
                           "precision_decision": {"requested": "auto", "speedup": x}}
                          for p, x in (("bfloat16", 1.2), ("float32", 1.05))],
            "mwms-2": [{"samples_per_s": 15.0, "precision": p, "precision_of": "distseg-2"}
                       for p in ("bfloat16", "float32")]}
    gemm = [{"train_flops_per_sample": 1e9, "gemm_flops_per_s": 100e9, "gemm_bf16_flops_per_s": 200e9,
             "gemm_n": 2048, "threads": 1}]
    results = {"training": {"runs": runs, "gemm": gemm}}
    rows = bench_table.speed_rows(results)
    assert rows[0].value == 2.0 and rows[0].detail.endswith("; bfloat16 vs bfloat16")
    assert rows[2].detail.endswith("; bfloat16/float32 vs bfloat16/float32")
    # distseg-1 trained in bfloat16: its FLOP/s against the bf16 GEMM.
    flops = bench_table.flops_row(results)
    assert flops.measure == "training FLOP/s / bf16 GEMM FLOP/s"
    assert flops.value == pytest.approx(20e9 / 200e9)
    note = bench_table.precision_note(results)
    assert note == ("Precision: distseg-1 bfloat16 (auto: bfloat16 step 1.50/1.50x float32's); "
                    "keras-fit bfloat16 (distseg-1's choice); distseg-2 bfloat16/float32 "
                    "(auto: bfloat16 step 1.20/1.05x float32's); mwms-2 bfloat16/float32 "
                    "(distseg-2's choice).")


def test_runs_of_each_precision_are_set_against_their_own_gemm_peak():
    runs = {"distseg-1": [{"samples_per_s": 20.0, "precision": "bfloat16"},
                          {"samples_per_s": 10.0, "precision": "float32"},
                          {"samples_per_s": 30.0, "precision": "bfloat16"}]}
    gemm = [{"train_flops_per_sample": 1e9, "gemm_flops_per_s": 100e9, "gemm_bf16_flops_per_s": 200e9,
             "gemm_n": 2048, "threads": 1}]
    row = bench_table.flops_row({"training": {"runs": runs, "gemm": gemm}})
    assert row.measure == "training FLOP/s / fp32 or bf16 GEMM FLOP/s"
    assert row.value == pytest.approx(0.1)  # median of 0.10, 0.10, 0.15
    # Results from before auto: no recorded precision, fp32 unless the change was bf16.
    old = {"training": {"runs": {"distseg-1": [{"samples_per_s": 10.0}]}, "gemm": gemm}}
    assert bench_table.flops_row(old).measure == "training FLOP/s / fp32 GEMM FLOP/s"
    assert bench_table.precision_note(old) == ""
    assert bench_table.ratio({"training": {"runs": {"a": [{"samples_per_s": 2.0}],
                                                     "b": [{"samples_per_s": 1.0}]}}}, "a", "b")[1] \
        == "2.0 vs 1.0 samples/s (rounds: 2.00)"
