"""Fixtures shared by every serial test module (helpers to import are in ``support.py``)."""

from __future__ import annotations

import pytest

from distseg.data import synth


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """128 training slices of 32x32 (10 phantom cases x 16 slices, by-case split)."""
    path = str(tmp_path_factory.mktemp("data") / "tiny.h5")
    synth.make_dataset(path, cases=10, size=32, seed=0, slices_per_case=16)
    return path
