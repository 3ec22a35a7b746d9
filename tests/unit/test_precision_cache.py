"""``--precision auto``'s decision kept between launches (``precision_cache``) and taken
by ``precision.decide``: the key changes with each input that decides and with nothing
else, a kept decision skips the trial, a damaged or foreign entry and an unwritable
folder cost one warning and a trial, ``always`` measures again, and the trial's test
hook fails the piece it names. No Horovod: the collectives are one rank's identity;
2 ranks through ``horovodrun``: tests/e2e/test_precision_cache.py."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from distseg.core import config as config_lib
from distseg.core.errors import InputError, RunError
from distseg.parallel import distributed as dist
from distseg.training.progress.plan import EpochPlan
from distseg.training.startup import precision, precision_cache

CPU = {"model": "AMD EPYC", "flags": ["avx512_bf16"]}
VERSIONS = {"tensorflow": "2.18.1", "tensorflow_build": "v2.18.0", "onednn": True,
            "keras": "3.8.0", "distseg": "0.1.0"}
ONE = dist.Context(rank=0, size=1, local_rank=0, local_size=1, controller="mpi", cores=2,
                   pinned=False)
OUTCOME = {"choice": "bfloat16", "seconds": {"float32": 0.3, "bfloat16": 0.2},
           "speedup": 1.5, "steps": 3, "trial_s": 5.0, "reason": "bfloat16 step 1.50x"}


def _facts(cfg=None, ctx=ONE, shape=(128, 128, 1), cpus=(CPU,), versions=VERSIONS,
           threads=(1, 1), samples=64):
    cfg = cfg or config_lib.demo()
    plan = EpochPlan.of(cfg.train, samples, ctx.size)
    return precision.cache_facts(cfg, ctx, shape, plan, plan.static_batch(samples, ctx.size),
                                 list(cpus), dict(versions), list(threads))


def _model(**fields):
    cfg = config_lib.demo()
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **fields))


def _train(**fields):
    cfg = config_lib.demo()
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **fields))


CHANGES = {
    "cpu model": dict(cpus=({**CPU, "model": "Intel Xeon Platinum 8480+"},)),
    "cpu flags": dict(cpus=({**CPU, "flags": ["avx512_bf16", "amx_bf16"]},)),
    "another rank's cpu": dict(cpus=(CPU, {**CPU, "model": "other"})),
    "tensorflow": dict(versions={**VERSIONS, "tensorflow": "2.19.0"}),
    "onednn off": dict(versions={**VERSIONS, "onednn": False}),
    "model field": dict(cfg=_model(base_filters=32)),
    "norm": dict(cfg=_model(norm="group")),
    "loss": dict(cfg=_train(loss="dice")),
    "input shape": dict(shape=(64, 64, 1)),
    "per-rank batch": dict(cfg=_train(global_batch=16)),
    "threads": dict(threads=(2, 1)),
    "ranks": dict(ctx=dataclasses.replace(ONE, size=2, local_size=2)),
    "ranks per node": dict(ctx=dataclasses.replace(ONE, size=2, local_size=1)),
}


@pytest.mark.parametrize("what", sorted(CHANGES))
def test_the_key_changes_with_each_input_that_decides(what):
    assert precision_cache.key_of(_facts(**CHANGES[what])) != precision_cache.key_of(_facts())


def test_the_key_ignores_what_does_not_decide():
    base = precision_cache.key_of(_facts())
    assert precision_cache.key_of(_facts(cfg=_model(precision="float32"))) == base
    assert precision_cache.key_of(_facts(cfg=_train(epochs=99, seed=7, lr=3e-3))) == base
    assert precision_cache.key_of(_facts(cpus=(CPU, dict(CPU)))) == base  # same CPU twice: one kind


def test_a_model_fn_is_keyed_by_its_source_and_args_not_its_path():
    def fn(path, sha="a" * 64, args=None):
        return precision_cache.key_of(_facts(cfg=_model(fn=path, fn_sha256=sha, args=args or {})))
    assert fn("/home/a/net.py:build") == fn("/home/b/copy.py:build")
    assert fn("/x.py:build") != fn("/x.py:build", sha="b" * 64)
    assert fn("/x.py:build") != fn("/x.py:build", args={"width": 8})
    assert fn("/x.py:build") != precision_cache.key_of(_facts())


def test_the_cache_folder_follows_the_override_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.delenv(precision_cache.DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert precision_cache.folder() == str(tmp_path / "xdg" / "distseg")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert precision_cache.folder() == str(tmp_path / "home" / ".cache" / "distseg")
    monkeypatch.setenv(precision_cache.DIR_ENV, str(tmp_path / "mine"))
    assert precision_cache.folder() == str(tmp_path / "mine")


def test_a_kept_outcome_is_found_for_its_facts_only(tmp_path):
    warned = []
    cache = precision_cache.Cache(str(tmp_path / "new" / "cache"), warned.append)
    assert cache.lookup(_facts()) is None  # no folder yet: a plain miss
    path = cache.store(_facts(), OUTCOME)
    assert path == cache.path(_facts()) and os.listdir(tmp_path / "new" / "cache") == [os.path.basename(path)]
    entry = cache.lookup(_facts())
    assert entry.outcome == OUTCOME and entry.path == path and entry.measured_at.startswith("20")
    assert cache.lookup(_facts(threads=(2, 1))) is None
    assert warned == []


def _damage(path, how):
    data = json.load(open(path))
    if how == "not json":
        open(path, "w").write('{"kind": "distseg precision trial", "sch')
    elif how == "another schema":
        json.dump({**data, "schema": 99}, open(path, "w"))
    elif how == "another key":
        json.dump({**data, "facts": {**data["facts"], "ranks": 64}}, open(path, "w"))
    elif how == "no choice":
        json.dump({**data, "outcome": {**data["outcome"], "choice": "float16"}}, open(path, "w"))
    elif how == "binary":
        open(path, "wb").write(b"\xff\xfe\x00junk")


@pytest.mark.parametrize("how", ["not json", "another schema", "another key", "no choice", "binary"])
def test_a_damaged_or_foreign_entry_is_ignored_with_one_warning(tmp_path, how):
    warned = []
    cache = precision_cache.Cache(str(tmp_path), warned.append)
    _damage(cache.store(_facts(), OUTCOME), how)
    assert cache.lookup(_facts()) is None and cache.lookup(_facts()) is None
    assert len(warned) == 1 and cache.path(_facts()) in warned[0] and "trial runs" in warned[0]


def test_a_folder_that_cannot_be_written_is_one_warning_and_no_entry(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    warned = []
    cache = precision_cache.Cache(str(tmp_path / "file" / "cache"), warned.append)
    assert cache.store(_facts(), OUTCOME) is None
    assert cache.store(_facts(), OUTCOME) is None
    assert len(warned) == 1 and "cannot be kept" in warned[0] and precision_cache.DIR_ENV in warned[0]


def test_the_trial_mode_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(precision_cache.TRIAL_ENV, raising=False)
    assert precision_cache.trial_mode() == "cached"
    monkeypatch.setenv(precision_cache.TRIAL_ENV, "always")
    assert precision_cache.trial_mode() == "always"
    monkeypatch.setenv(precision_cache.TRIAL_ENV, "sometimes")
    with pytest.raises(InputError, match="DISTSEG_PRECISION_TRIAL='sometimes'"):
        precision_cache.trial_mode()


# --- decide() on one rank, the trial replaced by a counted stand-in ------------------


@dataclasses.dataclass
class _Feed:
    train_ids: list = dataclasses.field(default_factory=lambda: list(range(64)))
    input_shape: tuple = (128, 128, 1)


@pytest.fixture
def one_rank(monkeypatch, tmp_path):
    """``decide`` on one rank without Horovod: collectives are the identity, the CPU has
    bfloat16, the cache is in ``tmp_path``, and the trial is a stand-in that counts."""
    monkeypatch.setattr(dist, "allgather_object", lambda obj: [obj])
    monkeypatch.setattr(dist, "broadcast_object", lambda obj, root=0: obj)
    monkeypatch.setattr(precision, "software", lambda: dict(VERSIONS))
    monkeypatch.setattr(precision, "threads_in_force", lambda: [1, 1])
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: avx2 avx512_bf16\n")
    monkeypatch.setenv(precision.CPUINFO_ENV, str(cpuinfo))
    monkeypatch.setenv(precision_cache.DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(precision_cache.TRIAL_ENV, raising=False)
    trials = []

    def trial(cfg, ctx, feed, flags):
        trials.append(cfg)
        record = {"requested": "auto", "flags": flags, **OUTCOME, "decision_s": 5.0,
                  "source": "trial"}
        return precision.Decision(precision._with_precision(cfg, "bfloat16"), record)
    monkeypatch.setattr(precision, "_trial", trial)
    return trials


def _decide():
    return precision.decide(config_lib.demo(), ONE, _Feed())


def test_the_second_launch_takes_the_kept_decision_without_a_trial(one_rank, capsys):
    first = _decide()
    assert len(one_rank) == 1 and first.record["source"] == "trial"
    second = _decide()
    assert len(one_rank) == 1, "a kept decision runs no trial"
    r = second.record
    assert second.cfg.model.precision == first.cfg.model.precision == r["choice"] == "bfloat16"
    assert r["source"] == "cache" and r["trial_s"] == 0.0 and r["seconds"] == OUTCOME["seconds"]
    assert r["reason"].startswith(f"cached, from {r['cached']['from']}")
    assert r["cached"]["trial_s"] == OUTCOME["trial_s"] and second.state is None
    err = capsys.readouterr().err
    assert "kept in" in err and f"cached, from {r['cached']['from']}" in err
    assert "warning" not in err


def test_always_measures_again_and_keeps_the_new_answer(one_rank, monkeypatch):
    _decide()
    monkeypatch.setenv(precision_cache.TRIAL_ENV, "always")
    assert _decide().record["source"] == "trial" and len(one_rank) == 2
    monkeypatch.setenv(precision_cache.TRIAL_ENV, "cached")
    assert _decide().record["source"] == "cache" and len(one_rank) == 2


def test_a_damaged_entry_is_one_warning_and_a_trial(one_rank, capsys, tmp_path):
    _decide()
    (entry,) = (tmp_path / "cache").iterdir()
    entry.write_text("{ not json")
    capsys.readouterr()
    assert _decide().record["source"] == "trial" and len(one_rank) == 2
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "not JSON" in warnings[0]
    assert _decide().record["source"] == "cache"  # the trial's answer replaced it


def test_an_unwritable_cache_is_one_warning_and_the_run_goes_on(one_rank, capsys, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(precision_cache.DIR_ENV, str(tmp_path / "file" / "cache"))
    for n in (1, 2):
        decided = _decide()
        assert decided.record["source"] == "trial" and decided.cfg.model.precision == "bfloat16"
        assert len(one_rank) == n
        warnings = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning:")]
        assert len(warnings) == 1 and str(tmp_path / "file" / "cache") in warnings[0]


def test_a_cpu_without_bfloat16_neither_reads_nor_writes_the_cache(one_rank, tmp_path, monkeypatch):
    (tmp_path / "knl").write_text("model name\t: Xeon Phi\nflags\t\t: avx2 avx512f\n")
    monkeypatch.setenv(precision.CPUINFO_ENV, str(tmp_path / "knl"))
    decided = _decide()
    assert (decided.record["source"], decided.cfg.model.precision) == ("flags", "float32")
    assert one_rank == [] and not (tmp_path / "cache").exists()


def test_a_bad_trial_mode_stops_the_decision_with_the_variable_named(one_rank, monkeypatch):
    monkeypatch.setenv(precision_cache.TRIAL_ENV, "never")
    with pytest.raises(RunError, match="DISTSEG_PRECISION_TRIAL='never'"):
        _decide()


@pytest.mark.parametrize("spec, rank, piece, fails", [
    ("1", 1, "step", True), ("1", 1, "build", False), ("1", 0, "step", False),
    ("1:build", 1, "build", True), ("1:build", 1, "step", False), (" 0 : trace ", 0, "trace", True),
    ("", 0, "step", False)])
def test_the_fault_hook_fails_the_rank_and_piece_it_names(monkeypatch, spec, rank, piece, fails):
    monkeypatch.setenv(precision.FAIL_ENV, spec)
    ctx = dataclasses.replace(ONE, rank=rank, size=2)
    if fails:
        with pytest.raises(RuntimeError, match=precision.FAIL_ENV):
            precision._injected(ctx, piece)
    else:
        precision._injected(ctx, piece)


def test_a_failed_piece_is_named_and_agreed(monkeypatch):
    monkeypatch.setattr(dist, "allgather_object", lambda obj: [obj])
    monkeypatch.setenv(precision.FAIL_ENV, "0:build")
    with pytest.raises(RunError, match="trial, building the bfloat16 model: RuntimeError: failure"):
        precision._agreed("building the bfloat16 model", precision._injected, ONE, "build")
