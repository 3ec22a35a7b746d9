"""One step: the train, eval and predict steps (``steps``), the one builder of the model
and its steps from a run's config (``factory``), validation's scoring (``validation``),
a step's measured memory (``memprobe``)."""
