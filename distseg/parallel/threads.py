"""TensorFlow's import and thread pools for one rank: the runtime set-up that training
and ``distseg-predict`` share (set before TensorFlow's first op).

No Horovod here: the caller passes the cores this rank may use (``distributed.Context``).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import os
import sys

from distseg.core import config as config_lib

#: What Keras imports if it can, for what no distseg process asks of it (``fit`` on
#: pandas frames, its image galleries drawn with pyplot): left out while TensorFlow
#: loads, importable as ever after, so no rank's start pays for them (measured in
#: docs/development.md#how-long-make-test-takes).
KERAS_OPTIONAL = ("pandas", "matplotlib.pyplot")


class _Hidden(importlib.abc.MetaPathFinder):
    """An import finder that answers ``ImportError`` for ``names``, as if not installed."""

    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, fullname, path, target=None):
        if fullname in self.names:
            raise ImportError(f"{fullname} left out while TensorFlow loads", name=fullname)
        return None


@contextlib.contextmanager
def _hidden(names):
    finder = _Hidden(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def import_tensorflow():
    """Imports TensorFlow and Keras with ``KERAS_OPTIONAL`` left out (a module already
    imported stays in use), and returns TensorFlow. Call it where a process first
    imports TensorFlow; any later ``import tensorflow`` finds it loaded."""
    if "tensorflow" not in sys.modules:
        with _hidden(KERAS_OPTIONAL):
            import keras  # noqa: F401 - all of Keras' own imports under the finder
            import tensorflow  # noqa: F401
    import tensorflow as tf
    return tf


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
