"""No rank fails alone: every rank takes the same decision about an error found on some.

A rank that raised alone would leave the others waiting in the next collective, so an
error is first shared (one ``allgather_object``) and then raised on every rank as the
same ``RunError``: ``agree`` runs a piece that may fail on some ranks, ``failure_of``
and ``raise_agreed`` carry an error caught inside a loop to the next point where the
ranks agree, ``first_error`` is that agreement. ``find_divergence`` compares a few
numbers (weight checksums) across ranks, and ``run_command`` ends a command with one
line and its exit code.

Plain Python over ``distseg.parallel.distributed``'s collectives: this module never
imports Horovod (``distributed`` is its one home).
"""

from __future__ import annotations

import numpy as np

from distseg.core.errors import DistsegError, Interrupted, RunError, fail
from distseg.parallel import distributed


def first_error(message: str | None, code: int = 1) -> tuple[str, int] | None:
    """Makes every rank take the same decision about an error found on some ranks.

    Each rank passes its own error message (or None) and the exit code it asks for.
    All ranks get back ``(message, exit code)``: the message of the lowest rank that
    had one (with how many ranks failed) and the highest code asked for; or None when
    no rank failed. One allgather. A rank must never raise alone: the others would
    wait in the next collective.
    """
    gathered = distributed.allgather_object((message, int(code)) if message else None)
    failed = [(r, g) for r, g in enumerate(gathered) if g]
    if not failed:
        return None
    code = max(c for _, (_, c) in failed)
    rank, (msg, _) = failed[0]
    if len(gathered) == 1:
        return msg, code
    others = f" (and {len(failed) - 1} other rank(s))" if len(failed) > 1 else ""
    return f"{msg} [rank {rank}{others}]", code


def failure_of(e: BaseException) -> tuple[str, int]:
    """(one-line message, exit code) for an error raised on this rank: its own code for
    a ``DistsegError``; 2 for other bad input (``ValueError``, ``OSError``: a data
    file, config or run directory); 1 for anything else."""
    if isinstance(e, DistsegError):
        return str(e), e.exit_code
    if isinstance(e, (ValueError, OSError)) and str(e):
        return str(e).splitlines()[0], 2
    return f"{type(e).__name__}: {e}".splitlines()[0], 1


def raise_agreed(failure: tuple[str, int] | None) -> None:
    """Collective: every rank raises the same ``RunError`` if any rank has a failure."""
    agreed = first_error(*failure) if failure else first_error(None)
    if agreed:
        raise RunError(*agreed)


def agree(fn, *args, **kwargs):
    """Runs ``fn`` on every rank and returns its result; if it fails on any rank, with
    any exception, every rank raises the same ``RunError``. One allgather.

    ``Interrupted`` passes through untouched: a signal reaches every rank by itself.
    """
    result, failure = None, None
    try:
        result = fn(*args, **kwargs)
    except Interrupted:
        raise
    except Exception as e:  # noqa: BLE001 - every error is shared, then re-raised as RunError
        failure = failure_of(e)
    raise_agreed(failure)
    return result


def find_divergence(values, rtol: float = 1e-6):
    """Compares a few numbers (e.g. weight checksums) across ranks.

    Returns None when every rank agrees with rank 0 within ``rtol``, else
    ``(rank, its values, rank 0's values, relative difference)`` for the first rank
    that differs. Every rank gets the same answer.
    """
    gathered = distributed.allgather_object([float(v) for v in values])
    ref = np.asarray(gathered[0])
    for r, other in enumerate(gathered):
        diff = np.abs(np.asarray(other) - ref) / np.maximum(np.abs(ref), 1e-12)
        if float(diff.max()) > rtol:
            return r, other, gathered[0], float(diff.max())
    return None


def run_command(fn, *args, **kwargs):
    """Runs the body of a command that may run on many ranks (``distseg-train``,
    ``distseg-predict``): a distseg error ends it with one line and its exit code, an
    interruption with 130, and Horovod is shut down whatever happens."""
    try:
        return fn(*args, **kwargs)
    except Interrupted as e:
        fail(f"interrupted: {e}", e.exit_code)
    except KeyboardInterrupt as e:
        fail(f"interrupted: {e}", Interrupted.exit_code)
    except DistsegError as e:
        fail(str(e), e.exit_code)
    finally:
        distributed.shutdown()
