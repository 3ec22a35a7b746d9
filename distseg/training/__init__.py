"""The training loop and its pieces: steps, checkpoints, resume, stopping, the per-rank
run log, and ``distributed``, the only module of distseg that imports Horovod."""
