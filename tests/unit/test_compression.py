"""``--compression auto`` (``distseg.training.startup.compression``) without Horovod: the default
of every preset, what a step is built with before the decision, and the decisions taken
with no collective at all (one host, one rank, a compression named by the config).
Horovod is never initialised here, so any collective would raise: a decision that
returns has measured nothing. The prediction itself is ``tests/unit/test_link.py``'s;
the decision over a shaped link between two hosts, ``tests/e2e/test_netns.py``'s."""

import pytest

from distseg.core import config as config_lib
from distseg.core.errors import InputError
from distseg.parallel import distributed as dist
from distseg.training.startup import compression
from distseg.training.step import factory

from support import write_config


def _ctx(size: int, local_size: int, rank: int = 0) -> dist.Context:
    return dist.Context(rank=rank, size=size, local_rank=rank % local_size,
                        local_size=local_size, controller="mpi", cores=1, pinned=False)


def _cfg(value: str = "auto", preset: str = "demo") -> config_lib.Config:
    return config_lib.resolve(preset, None, {"data.path": "x.h5", "run_dir": "r",
                                             "train.compression": value})


def _steps(cfg: config_lib.Config, ranks: int) -> factory.TrainSteps:
    """Steps with none built yet (a decision taken without timing builds none)."""
    return factory.TrainSteps(None, (128, 128), ranks, compression=cfg.train.compression)


def test_auto_is_every_presets_default_and_exact_until_decided():
    for name in config_lib.PRESETS:
        assert config_lib.resolve(name, None, {"data.path": "x.h5", "run_dir": "r"}
                                  ).train.compression == "auto", name
    assert compression.exact(_cfg()).train.compression == "none"
    assert compression.exact(_cfg("fp16")).train.compression == "fp16"


def test_a_compression_that_is_not_a_choice_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"^config field train\.compression must be one of \('auto', "
                                         r"'none', 'fp16'\), got 'zip'$"):
        _cfg("zip")


@pytest.mark.parametrize("size,local_size,why", [
    (2, 2, "every rank on one host"),  # 2 ranks of one host: its own path, not a network
    (8, 8, "every rank on one host"),
    (1, 1, "one rank"),
])
def test_one_host_keeps_exact_float32_without_measuring(size, local_size, why, capsys):
    cfg = compression.exact(_cfg())
    steps = _steps(cfg, size)
    decided = compression.decide(cfg, "auto", _ctx(size, local_size), None, steps, None)
    assert decided.cfg.train.compression == "none" and steps.traced == {}
    reason = decided.record.pop("reason")
    assert decided.record == {"requested": "auto", "choice": "none", "ranks": size,
                              "one_host": True, "decision_s": 0.0}
    assert reason.startswith(f"exact float32: {why}")
    assert "compression auto: none: exact float32" in capsys.readouterr().err


def test_a_named_compression_is_kept_and_recorded_as_named():
    cfg = _cfg("fp16")
    decided = compression.decide(cfg, "fp16", _ctx(4, 2), None, _steps(cfg, 4), None)
    assert decided.cfg is cfg and decided.record is None
    assert compression.given(cfg) == {"requested": "fp16", "choice": "fp16"}


def test_a_multi_rank_step_is_not_built_before_the_decision():
    with pytest.raises(ValueError, match=r"train\.compression must be one of \('none', "
                                         r"'fp16'\) when a step of 2 ranks is built, got 'auto'"):
        factory.train_step(_cfg(), (None, None), (128, 128), ranks=2, batch=4)


def test_deciding_fp16_drops_the_exact_steps_traced_so_far(monkeypatch):
    """The steps hold no config: the config their caller holds names the compression,
    and a step traced for another one is dropped."""
    monkeypatch.setattr(factory, "train_step", lambda cfg, *args: f"the {cfg.train.compression} step")
    exact = compression.exact(_cfg())
    steps = factory.TrainSteps(None, (128, 128), 2, {4: "the exact step"}, "none")
    assert steps.for_batch(exact, 4) == "the exact step"
    assert steps.for_batch(_cfg("fp16"), 4) == "the fp16 step"
    assert steps.traced == {4: "the fp16 step"} and steps.compression == "fp16"


def test_a_run_from_before_auto_resumes_with_what_it_trained_with(tmp_path):
    """A config.json written without ``train.compression`` trained exact: it resumes
    ``none``, not the new default; one that holds a decision resumes with it."""
    old = _cfg().to_dict()
    del old["train"]["compression"]
    run = write_config(tmp_path / "run", old)
    assert config_lib.for_resume(run).train.compression == "none"
    old["train"]["compression"] = "fp16"
    write_config(run, old)
    assert config_lib.for_resume(run).train.compression == "fp16"
    with pytest.raises(InputError, match="train.compression: the run was trained with 'fp16'"):
        config_lib.for_resume(run, {"train.compression": "auto"})
