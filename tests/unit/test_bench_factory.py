"""Every benchmark trains what ``distseg-train`` would train: its model and optimizer
come from the run's factory (``distseg.training.step.factory``, through
``benchlib.model_variants.model_and_optimizer``), so a config's optimizer, weight
decay and clipping reach the benchmark as they reach a run. Checked three ways: no
file under benchmarks/ constructs an optimizer (or a U-Net it trains) itself; the
builder gives the config's optimizer, model variants included; and the two in-process
step tools (``benchlib.step_ab``'s variants in this process, ``benchlib.precision`` as
``make bench`` runs it) run on tiny data under a config that asks for SGD with weight
decay and clipping."""

from __future__ import annotations

import glob
import json
import math
import os
import re
import sys

import pytest

from support import BENCHMARKS, run_benchmark

sys.path.insert(0, BENCHMARKS)

#: An optimizer made by hand: a Keras optimizer class called or imported, or one named
#: by string for ``compile``.
OPTIMIZER = re.compile(r"\boptimizers\.[A-Z]\w*\(|\bfrom\s+(?:tensorflow\.)?keras\.optimizers\s+import\b"
                       r"|\boptimizer\s*=\s*['\"]")
#: A U-Net built beside the factory.
MODEL = re.compile(r"\b(?:build_unet|from_config)\(")
#: Files that build a U-Net without training it, and why that is not a second recipe.
MODEL_ONLY = {
    "benchlib/model_variants.py": "the factory's model with Keras' layers swapped in",
    "benchlib/flops.py": "counts a model's FLOPs, never trains it",
    "benchlib/bandwidth.py": "sizes the gradients of an allreduce, never trains",
}


def built_beside_the_factory(root: str = BENCHMARKS) -> list[str]:
    """``file:line: text`` for every optimizer constructed, and every U-Net built outside
    ``MODEL_ONLY``, by a Python file under ``root``."""
    found = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, root)
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                code = line.split("#", 1)[0]
                if OPTIMIZER.search(code) or (MODEL.search(code) and rel not in MODEL_ONLY):
                    found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_no_benchmark_builds_its_optimizer_or_model_beside_the_factory():
    assert built_beside_the_factory() == []


def test_an_optimizer_or_model_built_by_hand_is_found(tmp_path):
    (tmp_path / "benchlib").mkdir()
    (tmp_path / "a.py").write_text("opt = keras.optimizers.Adam(1e-3)\n"
                                   "model.compile(optimizer='sgd', loss=loss)\n"
                                   "# keras.optimizers.SGD(0.1) in a comment is fine\n")
    (tmp_path / "benchlib" / "b.py").write_text("from keras.optimizers import SGD\n"
                                                "model = unet.from_config(cfg.model)\n")
    (tmp_path / "benchlib" / "flops.py").write_text("model = unet.from_config(cfg.model)\n")
    assert built_beside_the_factory(str(tmp_path)) == [
        "a.py:1: opt = keras.optimizers.Adam(1e-3)", "a.py:2: model.compile(optimizer='sgd', loss=loss)",
        "benchlib/b.py:1: from keras.optimizers import SGD", "benchlib/b.py:2: model = unet.from_config(cfg.model)"]


#: What a config may ask of the optimizer, far from the presets' Adam.
SGD = {"optimizer": "sgd", "momentum": 0.8, "weight_decay": 1e-4, "clip_norm": 2.0, "lr": 0.02}


def sgd_config():
    import dataclasses

    from benchlib.args import preset_config
    cfg = preset_config("smoke")
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **SGD))


@pytest.mark.parametrize("variant", ["keras", "kerasbn"])
def test_the_builder_gives_the_configs_optimizer_and_the_variants_layers(variant):
    import keras

    from benchlib import model_variants
    model, optimizer = model_variants.model_and_optimizer(sgd_config(), (32, 32), 0, variant=variant)
    assert isinstance(optimizer, keras.optimizers.SGD) and optimizer.nesterov
    assert (optimizer.momentum, optimizer.weight_decay, optimizer.global_clipnorm) == (0.8, 1e-4, 2.0)
    assert float(optimizer.learning_rate) == pytest.approx(0.02) and optimizer.built
    norms = {type(layer) for layer in model.layers if "_bn" in layer.name}
    assert (keras.layers.BatchNormalization in norms) == (variant == "kerasbn")


def test_a_model_variant_put_into_distseg_train_is_built_by_the_factory(monkeypatch):
    # benchlib.train_variant --model kerasbn (make bench's --ab distseg-1+kerasbn): the
    # real distseg-train, its U-Net built with Keras' BatchNormalization.
    import keras

    from distseg.networks import unet
    from distseg.training.step import factory

    from benchlib import train_variant
    monkeypatch.setattr(unet, "from_config", unet.from_config)  # put back after the test
    train_variant.install(model="kerasbn")
    model, optimizer = factory.model_and_optimizer(sgd_config(), (32, 32), 0)
    assert keras.layers.BatchNormalization in {type(layer) for layer in model.layers}
    assert isinstance(optimizer, keras.optimizers.SGD)


def test_the_precision_modes_build_the_configs_optimizer():
    import keras

    from benchlib import precision
    model, optimizer = precision.build_mode(sgd_config(), "bfloat16:kerasbn")
    assert isinstance(optimizer, keras.optimizers.SGD) and optimizer.weight_decay == 1e-4
    assert model.layers[1].dtype_policy.compute_dtype == "bfloat16"
    assert keras.mixed_precision.global_policy().name == "float32"  # the policy is put back


@pytest.fixture(scope="module")
def sgd_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "sgd.json"
    path.write_text(json.dumps({"train": SGD}))
    return str(path)


def test_step_ab_builds_and_times_every_variant_under_the_configs_optimizer(tiny, sgd_file):
    # In this process, as ``run`` does on one rank after Horovod's start (not needed here:
    # a one-rank step has no collective).
    from distseg.parallel import distributed as dist

    from benchlib import step_ab
    names = ["distseg", "bare", "keras+kerasbn"]
    args = step_ab.parse_args(["--data", tiny, "--preset", "smoke", "--config", sgd_file,
                               "--batch-size", "4", "--variants", ",".join(names)])
    batches, steps, flags = step_ab.build(args, dist.Context(0, 1, 0, 1, "none", 1, False))
    assert list(steps) == names and all(len(images) == 4 for images, _ in batches)
    for step in steps.values():
        wall, cpu = step_ab.time_round(step, batches, flags, 1, 0)
        assert math.isfinite(wall) and wall > 0 and math.isfinite(cpu)


def test_the_precision_tool_times_and_trains_each_mode_under_the_configs_optimizer(tiny, sgd_file):
    out = run_benchmark("-m", "benchlib.precision", "--data", tiny, "--preset", "smoke", "--config",
                        sgd_file, "--modes", "float32:kerasbn", "--rounds", "1", "--steps", "1",
                        "--dice-epochs", "1")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    (seconds,) = result["step_seconds"].values()
    assert list(result["step_seconds"]) == ["float32:kerasbn"] and math.isfinite(seconds) and seconds > 0
    assert list(result["val_liver_dice"]) == ["float32:kerasbn"]
    assert 0.0 <= result["val_liver_dice"]["float32:kerasbn"] <= 1.0
