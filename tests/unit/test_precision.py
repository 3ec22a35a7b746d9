"""``--precision auto``'s decision without Horovod: which CPU flags count, the 10 %
rule, and a config's precision through the config tree and the network builder."""

from __future__ import annotations

import dataclasses

import pytest

from distseg.core import config as config_lib
from distseg.core.errors import InputError
from distseg.networks import spec as spec_lib
from distseg.training.startup import precision

EPYC = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 "
        "avx512_vnni\nbogomips\t: 4800\n")
SAPPHIRE = "flags\t\t: avx512f amx_bf16 amx_tile amx_int8 avx512_bf16\n"
KNL = "flags\t\t: fpu avx2 avx512f avx512pf avx512er avx512cd\n"


@pytest.mark.parametrize("cpuinfo, flags", [(EPYC, ["avx512_bf16"]),
                                            (SAPPHIRE, ["avx512_bf16", "amx_bf16"]),
                                            (KNL, []), ("", []),
                                            ("flags\t: avx512_bf16x\n", [])])
def test_the_bfloat16_flags_of_a_cpu(cpuinfo, flags):
    assert precision.bf16_flags(cpuinfo) == flags


def test_a_cpuinfo_file_that_cannot_be_read_has_no_flags(tmp_path, monkeypatch):
    (tmp_path / "knl").write_text(KNL)
    (tmp_path / "epyc").write_text(EPYC)
    assert precision.read_bf16_flags(str(tmp_path / "epyc")) == ["avx512_bf16"]
    monkeypatch.setenv(precision.CPUINFO_ENV, str(tmp_path / "knl"))
    assert precision.read_bf16_flags() == []
    monkeypatch.setenv(precision.CPUINFO_ENV, str(tmp_path / "missing"))
    assert precision.read_bf16_flags() == []


@pytest.mark.parametrize("f32, bf16, choice", [(1.0, 1.0, "float32"), (1.09, 1.0, "float32"),
                                               (1.10, 1.0, "bfloat16"), (1.5, 1.0, "bfloat16"),
                                               (1.0, 3.0, "float32")])
def test_bfloat16_is_kept_at_ten_percent_faster_or_more(f32, bf16, choice):
    assert precision.choose({"float32": f32, "bfloat16": bf16}) == choice


def test_auto_is_every_preset_s_request_but_the_test_presets_and_no_network_builds_it():
    assert config_lib.ModelConfig().precision == config_lib.AUTO
    for name in ("liver2d", "demo", "liver3d"):
        assert config_lib.PRESETS[name]().model.precision == config_lib.AUTO
    for name in ("smoke", "smoke3d"):
        assert config_lib.PRESETS[name]().model.precision == "float32"
    cfg = config_lib.demo()
    dataclasses.replace(cfg, run_dir="run", data=dataclasses.replace(cfg.data, path="x.h5")).validate()
    with pytest.raises(InputError, match="decided when a training run starts"):
        spec_lib.spec_of(dataclasses.replace(cfg.model, num_classes=3))
    assert precision.without_trial(cfg).model.precision == "float32"
    kept = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, precision="bfloat16"))
    assert precision.without_trial(kept) is kept
