"""Slurm job scripts for ``distseg-jobs`` (plain Python, no TensorFlow or Horovod)."""
