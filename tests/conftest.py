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


@pytest.fixture(scope="session")
def finished_run(tiny, tmp_path_factory):
    """A finished one-process smoke run of 1 epoch x 2 steps (no validation), trained
    once for every test that needs a run to refuse or read: such tests must leave it
    as it is (they assert so)."""
    from proc_group import run_group
    from support import BIN, command_env

    run_dir = str(tmp_path_factory.mktemp("finished") / "run")
    out = run_group([f"{BIN}/distseg-train", "--preset", "smoke", "--intra-op-threads", "1",
                     "--inter-op-threads", "1", "--data", tiny, "--run-dir", run_dir,
                     "--max-steps-per-epoch", "2", "--no-validate"],
                    timeout=300, env=command_env())
    assert out.returncode == 0, out.stderr[-2000:]
    return run_dir

