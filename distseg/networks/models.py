"""The network a run trains: distseg's U-Net (``--model unet2d|unet3d``) or the
researcher's own Keras model (``--model-fn``, ``distseg.networks.userfn``).

Every builder of a run's network (training, the precision trial, predict, export)
comes through ``build``, so a config names one network wherever it is rebuilt.
"""

from __future__ import annotations

from typing import Sequence

from distseg.core.config import ModelConfig


def build(cfg: ModelConfig, input_shape: Sequence[int] | None = None, run_dir: str = "",
          name: str = "unet"):
    """The Keras model of ``cfg`` for samples of spatial ``input_shape`` (None:
    ``image_size`` on every axis; the U-Net only) and ``cfg.in_channels`` channels.
    ``run_dir``: where a ``--model-fn`` run keeps its model's source.

    Raises:
      ValueError: a U-Net hyper-parameter that cannot build a network, or
        (``InputError``) a model function that cannot be found or builds no fitting model.
    """
    if cfg.fn:
        from distseg.networks import userfn
        if input_shape is None:
            raise ValueError("a --model-fn network needs the input shape")
        return userfn.build(cfg, input_shape, run_dir=run_dir, name=name)
    from distseg.networks import unet
    return unet.from_config(cfg, input_shape, name=name)


def describe(cfg: ModelConfig) -> str:
    """The network in a few words: ``unet2d``, ``unet3d`` or the ``--model-fn``
    reference's function with its file's name."""
    if cfg.fn:
        target, _, function = cfg.fn.rpartition(":")
        return f"{target.rsplit('/', 1)[-1]}:{function}"
    return f"unet{cfg.spatial_dims}d"
