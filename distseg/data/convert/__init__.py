"""Scanner volumes (MSD task folders, nnU-Net raw datasets, LiTS-style NIfTI/NRRD pairs)
to distseg's HDF5 format, and the geometry that takes predictions back onto the scans.

``sources``    finds a folder's cases and reads volumes and their channels (nibabel, pynrrd)
``geometry``   RAS reorientation, axial slice layout, in-plane resampling, and the inverse
``intensity``  per channel: HU window for CT, per-volume percentiles or z-score for MR
``splits``     seeded splits by case: a held-out share or k folds
``writer``     the streaming HDF5 writer (``OUT.h5.partial``, renamed when complete)
``pipeline``   ``run``: the ``distseg-data convert`` command's work

Nothing here imports TensorFlow or Horovod; ``distseg.inference.predict`` reuses ``sources``,
``geometry`` and ``intensity`` so a prediction sees the preprocessing training saw.
"""
