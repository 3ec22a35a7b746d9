"""The export's inference twin: distseg's U-Net rebuilt from Keras' own layers, with
the weights copied, gives the same probabilities (``distseg.inference.export``)."""

import dataclasses

import numpy as np
import pytest

from distseg.core import config as config_lib
from distseg.inference import export  # noqa: E402
from distseg.networks import unet  # noqa: E402

#: (spatial_dims, norm, recompute, precision, input shape)
CASES = [
    (2, "batch", False, "float32", (16, 16)),
    (2, "group", True, "float32", (16, 16)),
    (3, "batch", True, "float32", (8, 16, 8)),
    (3, "group", False, "float32", (8, 8, 16)),
    (2, "none", False, "float32", (16, 16)),
    (3, "instance", True, "float32", (8, 8, 16)),
    (3, "batch", False, "bfloat16", (8, 8, 8)),
]


def _randomised(model, seed=0):
    """Every weight random (BatchNorm variances positive), so a weight copied to the
    wrong place shows in the output."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        values = rng.normal(0.0, 0.3, v.shape)
        if "variance" in v.name:
            values = rng.uniform(0.5, 2.0, v.shape)
        v.assign(values.astype(np.float32))
    return model


@pytest.mark.parametrize("dims,norm,recompute,precision,shape", CASES)
def test_the_twin_has_keras_layers_and_the_same_outputs(dims, norm, recompute, precision, shape):
    cfg = dataclasses.replace(config_lib.smoke().model, spatial_dims=dims, norm=norm,
                              recompute=recompute, precision=precision, num_classes=3)
    ours = _randomised(unet.from_config(cfg, shape))
    twin = export.inference_twin(cfg, shape)
    export.copy_weights(ours, twin)
    modules = {type(layer).__module__.split(".")[0] for layer in twin.layers}
    assert modules == {"keras"}, modules
    assert all(w.dtype == "float32" for w in twin.weights)
    assert unet.NORM_LAYERS == {"batch": unet.FusedBatchNorm, "group": unet.GroupNorm,
                                "instance": unet.GroupNorm}  # restored
    x = np.random.default_rng(1).random((2,) + shape + (1,), dtype=np.float32)
    expected = ours(x, training=False).numpy()
    got = twin(x, training=False).numpy()
    assert got.shape == expected.shape == (2,) + shape + (3,)
    # float32: the same arithmetic up to rounding; bfloat16: the twin is the float32 model
    np.testing.assert_allclose(got, expected, atol=2e-6 if precision == "float32" else 0.05)


def test_a_model_trained_with_batchnorm_ghost_batches_exports():
    """The demo preset's BatchNorm ghost batches are a training rule: the twin, which
    infers with the moving statistics, is built without them and agrees."""
    cfg = dataclasses.replace(config_lib.smoke().model, bn_ghost_batch=2, num_classes=3)
    ours = _randomised(unet.from_config(cfg, (16, 16)))
    twin = export.inference_twin(cfg, (16, 16))
    export.copy_weights(ours, twin)
    x = np.random.default_rng(1).random((4, 16, 16, 1), dtype=np.float32)
    np.testing.assert_allclose(twin(x, training=False).numpy(), ours(x, training=False).numpy(),
                               atol=2e-6)


def test_weights_of_another_model_are_refused():
    cfg = config_lib.smoke().model
    small = unet.from_config(dataclasses.replace(cfg, num_classes=3), (16, 16))
    other = export.inference_twin(dataclasses.replace(cfg, num_classes=3, base_filters=8), (16, 16))
    with pytest.raises(ValueError, match="does not match the twin's"):
        export.copy_weights(small, other)


def test_the_export_states_each_ct_normalisation_as_a_rule_a_reader_can_apply():
    import numpy as np

    from distseg.data.convert.intensity import Intensity
    from distseg.inference import export

    hu = np.array([-1000.0, 0.0, 109.1, 500.0])
    for intensity in (Intensity.ct(), Intensity("ct_foreground", 24.0, 191.6, 109.1, 29.9)):
        rule = export._intensity_rule(intensity)
        # the rule, evaluated with numpy's clip, gives what the normaliser gives
        got = eval(rule.replace("clip(HU", "np.clip(hu"), {"np": np, "hu": hu})  # noqa: S307
        want = intensity.normaliser(_Raw(), intensity.bounds(None))(hu.astype(np.float32).copy())
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


class _Raw:
    """Voxels whose raw values are already HU."""

    @staticmethod
    def values(block):
        return block
