"""What sygvd asks of a timer: `phase(name)`, a context manager around each phase.

The library measures nothing itself; a caller that wants per-phase times or a collective count
passes an object with this method (the app's counting.PhaseTimer).  The default does nothing."""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Protocol


class Timer(Protocol):
    def phase(self, name: str) -> AbstractContextManager:
        """A context manager entered around the phase `name` (one of driver.PHASES)."""


class NoTimer:
    """The default Timer: every phase runs bare (no device sync, nothing recorded)."""

    def phase(self, name: str) -> AbstractContextManager:
        return nullcontext()
