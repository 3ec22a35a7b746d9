"""The training loop (``loop``), what one launch shares (``session``, ``records``,
``runlog``, ``stopping``), and its pieces in rooms named for when they act:
``startup`` (the decisions before the first step), ``step`` (the train step and the
factory that builds it), ``progress`` (what changes as training goes on), ``epoch`` (the
model parts and the observers around each epoch), ``checkpoints`` (save and resume).
Imports point down ``progress`` -> ``step`` -> ``epoch``/``checkpoints`` -> ``startup``
-> the loop (docs/architecture.md). Horovod itself is reached only through
``distseg.parallel.distributed``."""
