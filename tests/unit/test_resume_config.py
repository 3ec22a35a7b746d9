"""A config.json written before a field existed resumes with what that run trained
with (``config.ABSENT_MEANS``), not with what the liver2d preset it is read over sets
now."""

from __future__ import annotations

import pytest

from distseg.core import config as config_lib

from support import write_config


@pytest.mark.parametrize("dotted", sorted(config_lib.ABSENT_MEANS))
def test_a_field_missing_from_an_old_config_resumes_as_it_trained(tmp_path, dotted):
    section, name = dotted.split(".")
    cfg = config_lib.resolve("liver2d", None, {"data.path": "x.h5", "run_dir": "r"})
    assert getattr(getattr(cfg, section), name) != config_lib.ABSENT_MEANS[dotted], \
        "an entry equal to the preset's value says nothing"
    old = cfg.to_dict()
    del old[section][name]
    resumed = config_lib.for_resume(write_config(tmp_path / "run", old))
    assert getattr(getattr(resumed, section), name) == config_lib.ABSENT_MEANS[dotted]
