"""distseg: data-parallel U-Net segmentation training with Horovod.

The sub-packages follow the path of a batch (docs/architecture.md):

- ``distseg.core``: plain-Python facts shared with ``analysis`` and ``distseg-jobs``
  (config, errors, log schema, run-directory layout); never imports TensorFlow or Horovod.
- ``distseg.data``: HDF5 slices and volumes, the feeds the loop reads, the phantom,
  LiTS and the converter.
- ``distseg.networks``: the U-Net spec and builder, losses and Dice, the memory planner.
- ``distseg.training``: the loop, its steps, checkpoints, resume, stopping, the run log,
  and ``distributed``, the one module that imports Horovod.
- ``distseg.inference``: sliding-window prediction, metrics, ``distseg-predict``.
- ``distseg.cluster``: Slurm job scripts (plain Python).
- ``distseg.cli``: the thin entry points.
"""
