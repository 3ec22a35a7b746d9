"""Files written under a temporary name and renamed into place only when whole.

Plain Python. Every writer of a file that must never look complete before it is (a
converted dataset, a checkpoint, a run's config) writes ``PATH.partial`` (or a name it
chooses), then either ``finish``es, renaming it over ``PATH`` in one step, or
``abort``s, removing it and leaving ``PATH`` as it was::

    with PartialFile("out.json") as part:
        with open(part.partial, "w") as f:
            f.write(text)
    # out.json now holds text; had the block raised, out.json would be untouched and
    # out.json.partial gone

A writer that keeps its own handle on the file (HDF5) calls ``finish`` and ``abort``
itself, and gives ``abort`` the function that closes that handle.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Callable

#: What ``PartialFile`` appends to the final name when not told another name.
SUFFIX = ".partial"


class PartialFile:
    """One file being written to ``partial`` before it becomes ``path``."""

    def __init__(self, path: str, partial: str | None = None):
        self.path = path
        """Where the whole file ends up."""
        self.partial = partial if partial is not None else f"{path}{SUFFIX}"
        """Where it is written meanwhile (same directory, so the rename is atomic)."""
        self.finished = False

    def finish(self) -> None:
        """Renames the partial file to ``path``, replacing what was there."""
        os.replace(self.partial, self.path)
        self.finished = True

    def abort(self, release: Callable[[], object] | None = None) -> None:
        """Removes the partial file, if any (after ``finish``: nothing to do).

        The file is emptied before ``release`` (the writer's close) runs: a library
        that still holds it open after a failed write, as HDF5 does on a full disk,
        then flushes into a file with room instead of failing again, or crashing at
        exit. Errors of ``release`` are ignored: the file is discarded, and the error
        that made the caller abort is the one to report.
        """
        if self.finished:
            return
        with contextlib.suppress(OSError):
            os.truncate(self.partial, 0)
        try:
            if release is not None:
                with contextlib.suppress(Exception):
                    release()
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.partial)

    def __enter__(self) -> "PartialFile":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Finishes when the block succeeded, aborts when it (or the rename) raised."""
        if exc_type is not None:
            self.abort()
            return
        try:
            self.finish()
        except BaseException:
            self.abort()
            raise


def write_json(path: str, obj, indent: int = 2) -> None:
    """Writes ``obj`` as JSON to ``path`` through ``PATH.tmp`` and a rename (a run's
    config.json, a checkpoint's manifest), keys sorted."""
    with PartialFile(path, f"{path}.tmp") as part:
        with open(part.partial, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=indent, sort_keys=True)
