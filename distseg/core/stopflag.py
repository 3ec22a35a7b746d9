"""A request to stop, set where stopping is unsafe and acted on where it is safe.

A signal handler (or a watchdog thread) only records the request; the loop reads it at
its next safe point: the next training step (``distseg.training.stopping``, where the
flag rides in the step's allreduce so every rank stops together) or the next case of a
conversion (``distseg.data.convert.pipeline``). Raising from the handler instead would
interrupt whatever runs at that moment: a Horovod collective (the other ranks would
wait in it) or a finaliser (Python prints and drops the exception).

Plain Python (no TensorFlow, no Horovod).
"""

from __future__ import annotations

from distseg.core.errors import Interrupted


class StopFlag:
    """Set once (the first reason wins), from a signal handler or a thread; read by the
    loop through ``requested`` or ``check``."""

    def __init__(self):
        self.reason: str | None = None
        """Why the stop was asked for (one line), or None."""

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        """Asks to stop; a later request keeps the first reason."""
        if self.reason is None:
            self.reason = reason

    def check(self) -> None:
        """Raises ``Interrupted`` with the reason when a stop was asked for."""
        if self.reason is not None:
            raise Interrupted(self.reason)
