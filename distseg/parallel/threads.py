"""TensorFlow's thread pools for one rank: the runtime set-up that training and
``distseg-predict`` share (set before TensorFlow's first op).

No Horovod here: the caller passes the cores this rank may use (``distributed.Context``).
"""

from __future__ import annotations

import os

from distseg.core import config as config_lib


def resolve_threads(train_cfg, cores: int) -> tuple[int, int]:
    """(intra_op, inter_op) threads: flags, else OMP_NUM_THREADS, else cores per rank."""
    omp = os.environ.get("OMP_NUM_THREADS", "")
    intra = train_cfg.intra_op_threads or (int(omp) if omp.isdigit() and int(omp) > 0 else cores)
    inter = train_cfg.inter_op_threads or config_lib.default_inter_op_threads(cores)
    return max(1, intra), max(1, inter)


def configure_threads(train_cfg, cores: int) -> tuple[int, int]:
    """Sets TensorFlow's thread pools (before its first op); returns those in force."""
    intra, inter = resolve_threads(train_cfg, cores)
    os.environ.setdefault("OMP_NUM_THREADS", str(intra))
    import tensorflow as tf  # after dist.init(): threads must be set before first use
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:  # TF already running in this process (a second run in tests)
        intra = tf.config.threading.get_intra_op_parallelism_threads()
        inter = tf.config.threading.get_inter_op_parallelism_threads()
    return intra, inter
