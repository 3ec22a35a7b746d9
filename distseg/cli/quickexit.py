"""Ending a command without the interpreter's teardown of TensorFlow.

After ``import tensorflow``, Python's own exit destroys every module and
TensorFlow's C++ state, after every file is written and Horovod is shut down: time
that every launch of ``distseg-train`` and ``distseg-predict`` pays for nothing, and a
short prediction job at 2 ranks pays on its critical path (measured in
docs/studies/cv-lits117-2026-11-28.md#the-ensembles-prediction-at-2-ranks-where-its-start-goes-and-the-exit-2026-11-29-third-session).

``run`` ends the command as the interpreter would, minus that teardown: the
``atexit`` handlers (Horovod's shutdown, logging's flush, the caller's own), Python's
and C's standard streams flushed, then ``os._exit`` with the command's exit code. It
takes the ordinary exit where a thread that is not a daemon still runs (the
interpreter waits for such a thread, and so must the command), and under a profiler,
a debugger or a tracer (``python -m cProfile`` writes its profile after the command
returns).

Plain Python: no TensorFlow or Horovod import here.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
from typing import NoReturn

import click


def run(command: click.Command) -> NoReturn:
    """Runs ``command`` as its console script does (arguments from ``sys.argv``,
    click's messages and exit codes) and ends the process (``leave``)."""
    try:
        command.main(standalone_mode=True)
    except SystemExit as e:
        leave(e.code)
    leave(0)


def exit_code(code) -> int:
    """The status ``sys.exit(code)`` ends with: None is 0, an int is itself, anything
    else is written to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


def ordinary_exit_needed() -> bool:
    """Whether something runs after the command that the quick exit would cut off: a
    thread the interpreter waits for at exit, or a profiler, debugger or tracer."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return True
    return any(t.is_alive() and not t.daemon for t in threading.enumerate()
               if t is not threading.main_thread())


def leave(code) -> NoReturn:
    """Ends the process with ``code`` (as ``sys.exit`` takes it), the ``atexit``
    handlers run and the streams flushed, without the interpreter's teardown."""
    if ordinary_exit_needed():
        sys.exit(code)
    status = exit_code(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing left to deliver
            pass
    ctypes.CDLL(None).fflush(None)  # C's stdio buffers (a library's printf)
    os._exit(status)
