"""One exception family for every distseg command, each error carrying its exit code.

Plain Python (no TensorFlow, no Horovod, no click): ``analysis`` imports it too.

Exit codes, the same in every CLI (``distseg-train``, ``distseg-data``,
``distseg-jobs``, ``distseg-report``):

* 0 done;
* 1 a failure that is not the user's input (a crash, diverged ranks, a lost rank);
* 2 bad input: a file, field, flag or directory that is not what was expected;
* 130 interrupted (SIGTERM, Ctrl-C), as a shell reports a SIGINT.
"""

from __future__ import annotations

import sys
from typing import NoReturn

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class DistsegError(Exception):
    """Base of every error distseg raises on purpose; ``str(e)`` is one line for people."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(DistsegError, ValueError):
    """Bad input: names the file or field and what was expected (exit 2).

    Also a ``ValueError``, so callers that validate with ``except ValueError`` keep working.
    """

    exit_code = EXIT_BAD_INPUT


class RunError(DistsegError):
    """A problem every rank of a run agreed on (``distributed.agree``): each rank raises
    the same message and exit code, so none waits alone in a collective."""


class Interrupted(DistsegError):
    """A signal asked the run to stop (exit 130)."""

    exit_code = EXIT_INTERRUPTED


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Ends a command: ``error: MESSAGE`` on stderr, exit ``code``."""
    # One write: under mpirun a line written in two pieces can interleave with another
    # rank's output.
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    sys.exit(code)


def refuse_newer(where: str, field: str, found, supported: int) -> None:
    """Raises ``InputError`` when a file was written by a newer distseg (``found`` >
    ``supported``): reading it anyway could silently misread renamed fields."""
    try:
        version = int(found)
    except (TypeError, ValueError, OverflowError):
        shown = " ".join(repr(found).split())[:60]  # one line, however odd the value
        raise InputError(f"{where}: {field} is {shown}, expected an integer <= {supported}")
    if version > supported:
        raise InputError(f"{where}: {field} {version} is newer than this distseg reads "
                         f"({supported}); upgrade distseg to read it")
