"""``--precision auto``'s decisions kept between launches, keyed by what decides them.

The trial's answer depends only on the CPU, the software, the model and the step's
shape (``precision.cache_facts``), yet it took 4-5 s of the demo's 14 s of training and
87 s on ``liver2d`` at every launch. So its outcome is kept in one small JSON file per
configuration under the user's cache folder (``folder``: ``$DISTSEG_CACHE_DIR``, else
``$XDG_CACHE_HOME/distseg``, else ``~/.cache/distseg``); on a cluster whose home is
shared, every job of a partition and every requeue reuses it.

A cache is a convenience, never a reason to fail: a file that is not valid JSON, has
another schema or answers another key is ignored with one warning, and a folder that
cannot be read or written is too; the trial then runs and the run goes on. Entries are
written under a name of their own and renamed into place (``partial``), so two jobs
writing at once leave one whole entry. Plain Python: the caller (``precision``) says
which rank reads it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
from dataclasses import dataclass
from typing import Callable

from distseg.core import partial
from distseg.core.errors import InputError

#: The cache folder, overriding ``$XDG_CACHE_HOME/distseg`` (tests, a site's shared disk).
DIR_ENV = "DISTSEG_CACHE_DIR"
#: ``cached`` (the default): reuse a kept decision; ``always``: measure again and keep
#: the new one (``distseg-train --precision-trial``, which sets it for every rank).
TRIAL_ENV = "DISTSEG_PRECISION_TRIAL"
TRIAL_MODES = ("cached", "always")
#: The entry format; another number is a foreign entry.
SCHEMA = 1
KIND = "distseg precision trial"
PRECISIONS = ("float32", "bfloat16")


def folder() -> str:
    """Where decisions are kept: ``$DISTSEG_CACHE_DIR``, else ``$XDG_CACHE_HOME/distseg``,
    else ``~/.cache/distseg`` (the XDG base directory rule)."""
    if os.environ.get(DIR_ENV):
        return os.environ[DIR_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "distseg")


def trial_mode() -> str:
    """``$DISTSEG_PRECISION_TRIAL`` (``cached`` when unset); anything else is refused."""
    mode = os.environ.get(TRIAL_ENV, "") or "cached"
    if mode not in TRIAL_MODES:
        raise InputError(f"{TRIAL_ENV}={mode!r}: expected one of {', '.join(TRIAL_MODES)}")
    return mode


def key_of(facts: dict) -> str:
    """The SHA-256 of ``facts`` as canonical JSON: the same facts, the same key."""
    text = json.dumps(facts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def now_iso() -> str:
    """This moment in UTC, to the second, ISO 8601."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Entry:
    """A kept decision: the trial's outcome (choice, seconds per precision, speedup,
    steps, trial_s, reason), when it was measured, and the file it came from."""

    outcome: dict
    measured_at: str
    path: str


def _checked_outcome(outcome) -> dict:
    """``outcome`` when it has the fields a decision needs, else ValueError naming one."""
    if not isinstance(outcome, dict) or outcome.get("choice") not in PRECISIONS:
        raise ValueError("no outcome with a choice of float32 or bfloat16")
    seconds = outcome.get("seconds")
    if not (isinstance(seconds, dict) and set(seconds) == set(PRECISIONS)
            and all(isinstance(s, (int, float)) and s > 0 for s in seconds.values())):
        raise ValueError("the outcome's seconds are not one positive number per precision")
    for name in ("speedup", "trial_s"):
        if not isinstance(outcome.get(name), (int, float)):
            raise ValueError(f"the outcome has no number {name}")
    return outcome


def parse(text: str, key: str, path: str) -> Entry:
    """The entry ``text`` holds, if it answers ``key``; ValueError naming what is wrong
    (not JSON, another schema, another key, a missing field)."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND or data.get("schema") != SCHEMA:
        raise ValueError(f"not a schema-{SCHEMA} entry of {KIND!r}")
    facts = data.get("facts")
    if data.get("key") != key or not isinstance(facts, dict) or key_of(facts) != key:
        raise ValueError("it answers another configuration (key mismatch)")
    if not isinstance(data.get("measured_at"), str):
        raise ValueError("no measured_at time")
    return Entry(_checked_outcome(data.get("outcome")), data["measured_at"], path)


class Cache:
    """The decisions kept in ``root`` (``folder()`` when None); problems are reported
    once per launch through ``warn`` (one line, no ``warning:`` prefix needed)."""

    def __init__(self, root: str | None = None, warn: Callable[[str], None] | None = None):
        self.root = root or folder()
        self._warn = warn or (lambda message: None)
        self.warned = False

    def path(self, facts: dict) -> str:
        return os.path.join(self.root, f"precision-{key_of(facts)}.json")

    def warn(self, message: str) -> None:
        """Says ``message`` the first time a problem is met, and nothing after it."""
        if not self.warned:
            self.warned = True
            self._warn(message)

    def lookup(self, facts: dict) -> Entry | None:
        """The kept decision for ``facts``; None when there is none, or when it cannot be
        read or trusted (then one warning)."""
        path = self.path(facts)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as e:
            self.warn(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e}); "
                      "the precision trial runs")
            return None
        try:
            return parse(text, key_of(facts), path)
        except ValueError as e:
            self.warn(f"{path}: ignored, {e}; the precision trial runs")
            return None

    def store(self, facts: dict, outcome: dict) -> str | None:
        """Keeps ``outcome`` for ``facts``; returns the file, or None (one warning) where
        the folder cannot be written. Written under a name of this process's own, then
        renamed: a reader never sees half an entry, two writers never mix theirs."""
        path = self.path(facts)
        entry = {"kind": KIND, "schema": SCHEMA, "key": key_of(facts), "facts": facts,
                 "outcome": outcome, "measured_at": now_iso()}
        try:
            os.makedirs(self.root, exist_ok=True)
            mine = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp"
            with partial.PartialFile(path, mine) as part:
                with open(part.partial, "w", encoding="utf-8") as f:
                    json.dump(entry, f, indent=1, sort_keys=True, default=str)
        except OSError as e:
            self.warn(f"{self.root}: the precision decision cannot be kept there "
                      f"({e.strerror or e}); the next launch measures again "
                      f"(set {DIR_ENV} to a writable folder)")
            return None
        return path
