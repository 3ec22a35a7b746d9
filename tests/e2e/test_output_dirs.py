"""Every output folder a command cannot make or write is one line naming the flag and
the folder, exit 2, and nothing half-written: the real commands, on a folder under
/proc (which no account, root included, can create), one behind a file, and one inside
a read-only folder (a read-only bind mount, which stops root too)."""

import os
import subprocess

import pytest

from proc_group import run_group
from support import BIN, command_env

TIMEOUT = 300
pytestmark = pytest.mark.timeout(2 * TIMEOUT)


def run(*cmd):
    return run_group([f"{BIN}/{cmd[0]}", *map(str, cmd[1:])], timeout=TIMEOUT, env=command_env())


def _read_only(folder) -> str:
    """``folder`` made read-only: a read-only bind mount of itself as root (a chmod does
    not stop root), its mode 555 otherwise."""
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return str(folder)
    for cmd in (["mount", "--bind", folder, folder], ["mount", "-o", "remount,bind,ro", folder]):
        if subprocess.run(cmd, capture_output=True).returncode != 0:
            pytest.skip("no read-only bind mount here")
    return str(folder)


@pytest.fixture(params=["proc", "file", "read-only"])
def unwritable(request, tmp_path):
    if request.param == "proc":
        return "/proc/distseg-no-such-folder/out"
    if request.param == "read-only":
        folder = _read_only(tmp_path / "read-only")
        if os.geteuid() == 0:
            request.addfinalizer(lambda: subprocess.run(["umount", folder]))
        return os.path.join(folder, "out")
    (tmp_path / "a-file").write_text("in the way\n")
    return str(tmp_path / "a-file" / "out")


def one_line(out, *words):
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_report_out_and_tensorboard(finished_run, unwritable):
    one_line(run("distseg-report", finished_run, "--out", unwritable), "--out", unwritable,
             "cannot be created or written")
    one_line(run("distseg-report", finished_run, "--out", os.path.dirname(finished_run) + "/rep",
                 "--tensorboard", unwritable), "--tensorboard", unwritable)


def test_predict_export(finished_run, unwritable):
    one_line(run("distseg-predict", "--checkpoint", finished_run, "--export", unwritable),
             "--export", unwritable, "cannot be created or written")


def test_jobs_sweep_out(tiny, unwritable):
    one_line(run("distseg-jobs", "sweep", "--partition", "generic", "--nodes", "1,2",
                 "--data", tiny, "--preset", "smoke", "--runs-dir", "runs", "--out", unwritable),
             "--out", unwritable)


def test_data_out(unwritable):
    one_line(run("distseg-data", "synth", "--out", os.path.join(unwritable, "x.h5"), "--cases", "2",
                 "--size", "16", "--slices-per-case", "2"), "x.h5")


def test_predict_out(finished_run, unwritable, tmp_path):
    import nibabel as nib
    import numpy as np
    scan = tmp_path / "scan.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((32, 32, 4), np.float32), np.eye(4)), scan)
    one_line(run("distseg-predict", "--checkpoint", finished_run, scan, "--out", unwritable,
                 "--no-progress"), "--out", unwritable, "cannot be created or written")
