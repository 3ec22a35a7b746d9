"""The set-up and demo scripts behind `make demo` / `make test` pass bash -n and shellcheck."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ["scripts/install.sh", "scripts/demo.sh", ".ci/run"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_is_clean_bash(script):
    path = os.path.join(ROOT, script)
    subprocess.run(["bash", "-n", path], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (scripts/install.sh installs it)")
    out = subprocess.run(["shellcheck", "-x", path], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_ci_runs_the_readme_test_command():
    with open(os.path.join(ROOT, ".ci/run")) as f:
        ci = f.read()
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert "make test" in ci and "make test" in readme
