"""``distseg.networks.userfn``: finding, recording and loading a researcher's model
function, and the checks of what it returns (real Keras models, real files)."""

import dataclasses
import os
import shutil
import sys

import numpy as np
import pytest

from distseg.core import rundir
from distseg.core.config import ModelConfig
from distseg.core.errors import InputError
from distseg.networks import models, userfn

from support import REPO

EXAMPLE = os.path.join(REPO, "docs", "examples", "own_unet.py")


def cfg_of(ref, **fields):
    base = ModelConfig(fn=ref, num_classes=3, in_channels=2, precision="float32",
                       args={"filters": 4})
    return userfn.recorded(dataclasses.replace(base, **fields))


@pytest.mark.parametrize("ref", ["build", "file.py:", ":build", "file.py:not a name"])
def test_a_malformed_reference_is_refused(ref):
    with pytest.raises(InputError, match="expected FILE.py:FUNCTION"):
        userfn.parse(ref)


def test_a_file_reference_is_made_absolute_and_hashed(tmp_path, monkeypatch):
    shutil.copy(EXAMPLE, tmp_path / "net.py")
    monkeypatch.chdir(tmp_path)
    cfg = cfg_of("net.py:build")
    assert cfg.fn == f"{tmp_path}/net.py:build"
    assert cfg.fn_sha256 == userfn.digest(EXAMPLE)
    assert userfn.recorded(cfg) is cfg  # a resumed run's record is kept


def test_a_module_reference_imports_the_package(tmp_path, monkeypatch):
    pkg = tmp_path / "lab_models"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("FILTERS = 4\n")
    (pkg / "nets.py").write_text(open(EXAMPLE).read().replace(
        "def build(input_shape, num_classes, filters=8", "from . import FILTERS\n\n\n"
        "def build(input_shape, num_classes, filters=FILTERS"))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = cfg_of("lab_models.nets:build", args={})
    assert cfg.fn == "lab_models.nets:build"
    model = models.build(cfg, (16, 16))
    assert model.output_shape == (None, 16, 16, 3)
    assert model.input_shape == (None, 16, 16, 2)
    sys.modules.pop("lab_models.nets", None)
    sys.modules.pop("lab_models", None)


def test_the_run_copy_stands_in_for_a_moved_or_changed_original(tmp_path):
    shutil.copy(EXAMPLE, tmp_path / "net.py")
    run = tmp_path / "run"
    run.mkdir()
    cfg = cfg_of(f"{tmp_path}/net.py:build")
    userfn.keep_copy(cfg, str(run))
    assert userfn.digest(rundir.model_fn_path(str(run))) == cfg.fn_sha256
    with open(tmp_path / "net.py", "a") as f:
        f.write("\nraise RuntimeError('edited since')\n")
    assert userfn.source_with_hash(cfg.fn, cfg.fn_sha256, str(run)) == rundir.model_fn_path(str(run))
    assert models.build(cfg, (16, 16), run_dir=str(run)).output_shape == (None, 16, 16, 3)
    os.remove(rundir.model_fn_path(str(run)))
    with pytest.raises(InputError, match=r"the original .*has changed; the run's copy .*is missing"):
        userfn.function_of(cfg, str(run))


def test_a_file_that_fails_to_import_is_one_line(tmp_path):
    (tmp_path / "broken.py").write_text("import keras\ndef (:\n")
    cfg = cfg_of(f"{tmp_path}/broken.py:build")
    with pytest.raises(InputError, match=r"broken.py fails to import \(SyntaxError: "):
        models.build(cfg, (16, 16))


def test_bfloat16_computes_inside_and_returns_float32_probabilities(tmp_path):
    shutil.copy(EXAMPLE, tmp_path / "net.py")
    cfg = cfg_of(f"{tmp_path}/net.py:build", precision="bfloat16")
    model = models.build(cfg, (8, 16, 16))
    conv = next(layer for layer in model.layers[1].layers if "conv" in layer.name)
    assert conv.compute_dtype == "bfloat16"
    out = np.asarray(model(np.zeros((1, 8, 16, 16, 2), np.float32)))
    assert out.dtype == np.float32 and np.allclose(out.sum(-1), 1, atol=1e-2)
    import keras
    assert keras.config.dtype_policy().name == "float32"  # the global policy put back


def test_describe_names_the_network():
    assert models.describe(ModelConfig(spatial_dims=3)) == "unet3d"
    assert models.describe(ModelConfig(fn="/a/b/net.py:build")) == "net.py:build"
