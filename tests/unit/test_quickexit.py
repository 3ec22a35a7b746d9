"""``distseg.cli.quickexit``: a command ends with its own exit code, its output and its
``atexit`` handlers, skipping only the interpreter's teardown; a running thread that
is not a daemon is waited for. Each case runs a real click command in a fresh
interpreter."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import textwrap

import pytest

# A click command run through quickexit.run: it prints, registers an atexit handler
# that writes a file, optionally starts a thread that is not a daemon, and ends as asked.
SCRIPT = textwrap.dedent("""
    import atexit, sys, threading, time
    import click
    from distseg.cli import quickexit
    from distseg.core.errors import fail

    @click.command()
    @click.argument("how")
    @click.argument("marker")
    def cmd(how, marker):
        atexit.register(lambda: open(marker + ".atexit", "w").write("ran"))
        sys.stdout.write("printed, not flushed")
        if how == "thread":
            def late():
                # Writes only once the interpreter has begun its exit (the main thread
                # stopped, waiting for this one): an exit that does not wait loses it.
                while threading.main_thread().is_alive():
                    time.sleep(0.01)
                open(marker + ".thread", "w").write("done")
            threading.Thread(target=late).start()
        elif how == "fail":
            fail("a bad field", 2)
        elif how == "interrupted":
            fail("interrupted", 130)
        elif how == "message":
            sys.exit("a message for stderr")

    quickexit.run(cmd)
""")


def run_script(tmp_path, *args) -> subprocess.CompletedProcess:
    script = tmp_path / "cmd.py"
    script.write_text(SCRIPT)
    return subprocess.run([sys.executable, str(script), *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("how, code", [("done", 0), ("fail", 2), ("interrupted", 130),
                                       ("message", 1)])
def test_the_command_ends_with_its_code_its_output_and_its_atexit_handlers(tmp_path, how, code):
    marker = str(tmp_path / "m")
    done = run_script(tmp_path, how, marker)
    assert done.returncode == code, done.stderr
    assert done.stdout == "printed, not flushed"
    assert open(marker + ".atexit").read() == "ran"
    if how == "fail":
        assert done.stderr == "error: a bad field\n"
    if how == "message":
        assert done.stderr == "a message for stderr\n"


def test_a_usage_error_keeps_clicks_message_and_exit_2(tmp_path):
    done = run_script(tmp_path)
    assert done.returncode == 2
    assert "Missing argument 'HOW'" in done.stderr


def test_a_thread_that_is_not_a_daemon_is_waited_for(tmp_path):
    marker = str(tmp_path / "m")
    done = run_script(tmp_path, "thread", marker)
    assert done.returncode == 0, done.stderr
    assert open(marker + ".thread").read() == "done"
    assert open(marker + ".atexit").read() == "ran"


def test_a_profiler_still_writes_its_profile(tmp_path):
    script, profile = tmp_path / "cmd.py", tmp_path / "cmd.prof"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(profile), str(script),
                           "done", str(tmp_path / "m")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert profile.stat().st_size > 0  # cProfile writes it after the command returned


def test_the_console_scripts_of_the_tensorflow_commands_end_through_it():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(os.path.dirname(__file__), "..", "..", "setup.cfg"))
    scripts = dict(line.split(" = ") for line in
                   cfg["options.entry_points"]["console_scripts"].strip().splitlines())
    assert scripts["distseg-train"] == "distseg.cli.train:main"
    assert scripts["distseg-predict"] == "distseg.cli.predict:main"
