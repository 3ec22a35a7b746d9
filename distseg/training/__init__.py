"""The training loop (``loop``) and its pieces: start-up and the precision trial, the
epoch plan, the training state that changes with progress (``state``), the factory of
the model and its steps, the step, validation, the observers of the loop, records,
checkpoints, resume and stopping.
Horovod itself is reached only through ``distseg.parallel.distributed``."""
