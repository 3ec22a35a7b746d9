"""Inference: one sliding-window inferer for 2D and 3D, ``distseg-predict``, and the
segmentation metrics."""
