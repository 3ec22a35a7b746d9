"""One exception family for every distseg command, each error carrying its exit code.

Plain Python (no TensorFlow, no Horovod, no click): ``analysis`` imports it too.

Exit codes, the same in every CLI (``distseg-train``, ``distseg-data``,
``distseg-jobs``, ``distseg-report``):

* 0 done;
* 1 a failure that is not the user's input (a crash, diverged ranks, a lost rank, a
  disk that filled up during a run);
* 2 bad input: a file, field, flag or directory that is not what was expected;
* 130 interrupted (SIGTERM, Ctrl-C), as a shell reports a SIGINT.
"""

from __future__ import annotations

import os
import shutil
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
    """A problem every rank of a run agreed on (``agreement.agree``): each rank raises
    the same message and exit code, so none waits alone in a collective."""


class WriteError(DistsegError, OSError):
    """A file of a run could not be written while it ran (a full disk, a lost mount):
    not the input's fault (exit 1). Names the file or directory and what was being
    written.

    Also an ``OSError``, so callers that guard a write with ``except OSError`` keep
    working, and get exit 1 rather than the 2 (bad input) of any other ``OSError``.
    """

    @classmethod
    def of(cls, where: str, doing: str, error: OSError) -> "WriteError":
        """``WHERE: no space left on device while DOING`` for ``error``."""
        return cls(f"{where}: {os_reason(error)} while {doing}")


def os_reason(error: OSError) -> str:
    """What went wrong in words, without the errno or the path: ``no space left on
    device`` (the first line of the message where the error has no errno)."""
    if error.errno:
        reason = os.strerror(error.errno)
    else:
        reason = (str(error).splitlines() or [type(error).__name__])[0]
    return reason[:1].lower() + reason[1:]


def output_dir(path: str, flag: str, keep: bool = True) -> str:
    """Makes the output folder ``path`` (and its parents) and checks that it takes a
    file, before any work is done for it; returns ``path``. ``keep`` False: removes
    again the folders it made (a check before the inputs are, which must leave nothing
    behind if they fail).

    Raises:
      InputError: ``FLAG PATH: cannot be created or written (REASON)`` (exit 2), as a
        bad input path is: a read-only or full file system, a quota, a file in the way.
    """
    first_made = os.path.abspath(path)
    while not os.path.exists(os.path.dirname(first_made)) and os.path.dirname(first_made) != first_made:
        first_made = os.path.dirname(first_made)
    made = not os.path.exists(first_made)
    probe = os.path.join(path, f".distseg-probe-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise InputError(f"{flag} {path}: cannot be created or written ({os_reason(e)})") from None
    finally:
        if made and not keep and os.path.isdir(first_made):
            shutil.rmtree(first_made, ignore_errors=True)
    return path


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
