"""The training loop (``loop``) and its pieces: start-up and the precision trial, the
epoch plan, the training state that changes with progress (``scaling``), the step,
validation, the parts that observe the loop, records, checkpoints, resume and stopping.
Horovod itself is reached only through ``distseg.parallel.distributed``."""
