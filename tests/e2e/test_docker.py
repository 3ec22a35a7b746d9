"""The Docker image, built and run for real: ``make test-docker`` (docs/docker.md).

``scripts/test-docker.sh`` builds docker/Dockerfile with buildah on a Debian bookworm
base made locally (no Docker engine or registry needed), then runs inside the image, as
its unprivileged user, ``horovodrun -np 4 -H localhost:4 distseg-train`` on synthetic
data and ``distseg-report`` on the run. The tests here check what that left on the host
with ``distseg.core.schema`` only. Minutes and root: skipped unless DISTSEG_TEST_DOCKER=1.
"""

from __future__ import annotations

import os

import pandas as pd
import pytest

from proc_group import run_group
from support import REPO, command_env, log_records

#: A cold build (base, apt, TensorFlow, Horovod compiled) takes about 8 minutes here.
TIMEOUT = 2400
RANKS = 4
pytestmark = [
    pytest.mark.skipif(os.environ.get("DISTSEG_TEST_DOCKER") != "1",
                       reason="builds and runs the Docker image (minutes, root): "
                              "make test-docker"),
    pytest.mark.timeout(TIMEOUT + 60),
]


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    """The image built and run once; the host directory its /work/runs was."""
    out = tmp_path_factory.mktemp("docker")
    proc = run_group(["bash", os.path.join(REPO, "scripts", "test-docker.sh"), str(out)],
                     timeout=TIMEOUT, env=command_env(), merge_stderr=True)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return out / "runs"


def test_runs_as_the_images_unprivileged_user(image_run):
    with open(image_run / "container.txt") as f:
        fields = dict(word.split("=", 1) for word in f.read().split()[:2])
    assert fields == {"user": "distseg", "uid": "1000"}
    logs = sorted((image_run / "np4" / "logs").iterdir())
    assert {p.stat().st_uid for p in logs} == {1000}


def test_every_rank_logged_a_whole_run(image_run):
    run_dir = str(image_run / "np4")
    assert sorted(os.listdir(os.path.join(run_dir, "logs"))) == [
        f"rank-{r:05d}.jsonl" for r in range(RANKS)]
    for rank in range(RANKS):
        recs = log_records(run_dir, rank)
        head, end = recs[0], recs[-1]
        assert head["type"] == "run" and head["size"] == RANKS and head["rank"] == rank
        assert head["controller"] == "mpi"  # horovodrun found mpirun in the image
        assert head["versions"]["python"].startswith("3.11.")
        assert end["type"] == "end" and end["status"] == "ok" and end["epochs_done"] == 2
        assert [r["epoch"] for r in recs if r["type"] == "epoch"] == [0, 1]


def test_report_finds_every_epoch_covered(image_run):
    cov = pd.read_csv(image_run / "np4-report" / "coverage.csv")
    # 4 cases of 16 slices, 1 held out: 48 training slices, split over 4 ranks per epoch
    assert list(cov["epoch"]) == [0, 1] and list(cov["ranks_logged"]) == [RANKS, RANKS]
    assert cov["covered"].all() and cov["digest_matches"].all()
    assert set(cov["samples"]) == {48}
    assert (image_run / "np4-report" / "report.html").stat().st_size > 50_000
