"""A config.json written before a field existed resumes with what that run trained
with (``config.ABSENT_MEANS``), not with what the liver2d preset it is read over sets
now."""

from __future__ import annotations

import json

import pytest

from distseg.core import config as config_lib
from distseg.core import rundir as rundir_lib


@pytest.mark.parametrize("dotted", sorted(config_lib.ABSENT_MEANS))
def test_a_field_missing_from_an_old_config_resumes_as_it_trained(tmp_path, dotted):
    section, name = dotted.split(".")
    cfg = config_lib.resolve("liver2d", None, {"data.path": "x.h5", "run_dir": "r"})
    assert getattr(getattr(cfg, section), name) != config_lib.ABSENT_MEANS[dotted], \
        "an entry equal to the preset's value says nothing"
    old = cfg.to_dict()
    del old[section][name]
    run = tmp_path / "run"
    run.mkdir()
    (run / rundir_lib.CONFIG_FILE).write_text(json.dumps({**old, "run_dir": str(run)}))
    resumed = config_lib.for_resume(str(run))
    assert getattr(getattr(resumed, section), name) == config_lib.ABSENT_MEANS[dotted]
