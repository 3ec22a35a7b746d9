"""A run's checkpoints: written, found past damaged ones, loaded (``checkpoint``), and a
stopped run resumed from them (``resume``)."""
