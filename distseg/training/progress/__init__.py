"""What changes as training goes on, kept in every checkpoint: the epoch plan (``plan``),
the training state with its lr (``state``), the gradient noise scale (``noise``), the
``goodput`` batch policy (``batchpolicy``). Plain Python: no TensorFlow, no Horovod."""
