"""CI runs exactly the test command the README gives (linting: tests/test_lint.py)."""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess

from support import REPO, command_env


def _ci_command() -> list[str]:
    """The command .ci/run ends in: its last line that is not blank or a comment, which
    must ``exec`` it (so nothing runs after it and its exit status is CI's)."""
    with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as f:
        lines = [l.strip() for l in f if l.strip() and not l.strip().startswith("#")]
    words = shlex.split(lines[-1], comments=True)
    assert words[0] == "exec", f".ci/run does not end in `exec COMMAND`: {lines[-1]!r}"
    return words[1:]


def _readme_commands() -> set[str]:
    """Commands the README shows: lines of fenced code blocks (without a trailing
    ``# comment``) and inline code spans."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    commands = set()
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S):
        commands.update(re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines())
    commands.update(span.strip() for span in re.findall(r"`([^`\n]+)`", text))
    return commands - {""}


def test_ci_runs_the_readme_test_command(tmp_path):
    command = _ci_command()
    assert shlex.join(command) in _readme_commands(), (
        f".ci/run runs {shlex.join(command)!r}, which README.md does not show in a code block")
    # Run .ci/run with a stand-in for the program that records how it was called: what
    # was parsed above is what CI really executes, from the repository root.
    stub_dir = tmp_path / "bin"
    stub_dir.mkdir()
    record = tmp_path / "called"
    stub = stub_dir / command[0]
    stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "$PWD" "$@" > {shlex.quote(str(record))}\n')
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    env = command_env(PATH=f"{stub_dir}:{os.environ.get('PATH', '')}")
    out = subprocess.run([os.path.join(REPO, ".ci", "run")], capture_output=True, text=True,
                         timeout=30, env=env)
    assert out.returncode == 0, out.stderr
    assert record.read_text().splitlines() == [REPO, *command[1:]]
