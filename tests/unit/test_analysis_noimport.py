"""``distseg-report`` works where TensorFlow and Horovod cannot be imported.

The report runs in a fresh interpreter whose import system refuses ``tensorflow``,
``horovod`` and ``keras`` (and any of their submodules), as on a login node or a laptop
without them; it must still read the logs and write every file, and must not have
loaded the training side of ``distseg`` on the way.
"""

import json
import os
import subprocess
import sys

import h5py
import numpy as np

from tests.analysis_fixtures.runs import RunSpec, write_run

from support import REPO, import_blocker

BLOCKED = ("tensorflow", "horovod", "keras", "tf_keras")
BLOCKED_RUN = import_blocker(*BLOCKED) + r"""
from analysis.cli import report

try:
    report.main(sys.argv[1:], prog_name="distseg-report", standalone_mode=True)
finally:
    heavy = sorted(m for m in sys.modules
                   if m.split(".")[0] in BLOCKED or m.startswith(
                       ("distseg.training", "distseg.networks", "distseg.inference", "distseg.cli.train")))
    print("HEAVY=" + ",".join(heavy), file=sys.stderr)
"""


def test_report_runs_with_tensorflow_and_horovod_blocked(tmp_path):
    # A readable data file, so the coverage cross-check opens it (and imports
    # distseg.data for its FORMAT_VERSION) under the blocker too.
    data = str(tmp_path / "d.h5")
    with h5py.File(data, "w") as f:
        f["split"] = np.r_[np.zeros(16), np.ones(4)].astype(np.uint8)
        f.attrs["format_version"] = 1
    runs = [write_run(str(tmp_path / "np1"), RunSpec(size=1, data_path=data)),
            write_run(str(tmp_path / "np2"), RunSpec(size=2, data_path=data))]
    out = tmp_path / "report"
    env = dict(os.environ, PYTHONPATH=REPO, MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKED_RUN, *runs, "--target-loss", "-0.15",
         "--project-nodes", "4", "--format", "json", "--out", str(out)],
        capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "HEAVY=\n" in proc.stderr, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert [r["ranks"] for r in doc["tables"]["time_per_epoch"]] == [1, 2]
    assert doc["projection"]["table"]
    assert {r["reference"] for r in doc["tables"]["coverage"]} == {"train split of the data file"}
    assert all(r["covered"] for r in doc["tables"]["coverage"])
    for name in ("report.html", "report.md", "loss_vs_time.png", "coverage.csv"):
        assert (out / name).stat().st_size > 0


#: Modules the light side (distseg-report, distseg-jobs, distseg-memory's arithmetic)
#: imports: plain Python, never TensorFlow or Horovod.
PLAIN_MODULES = ("distseg.core.config", "distseg.core.errors", "distseg.core.schema",
                 "distseg.core.rundir", "distseg.core.stopflag", "distseg.cluster.jobs",
                 "distseg.cluster.outcome", "distseg.core.ranktime", "analysis.mismatch",
                 "distseg.cli.jobs", "distseg.networks.spec", "distseg.networks.memory",
                 "distseg.training.step.memprobe", "distseg.parallel.threads",
                 "distseg.training.progress.noise", "analysis.report")


def test_the_plain_modules_import_without_tensorflow_and_horovod():
    code = import_blocker(*BLOCKED) + "\nimport importlib\nfor name in sys.argv[1:]:\n" \
        "    importlib.import_module(name)\n"
    done = subprocess.run([sys.executable, "-c", code, *PLAIN_MODULES], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
