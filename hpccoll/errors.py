"""Exceptions raised by hpccoll."""
from __future__ import annotations


class HpccollError(RuntimeError):
    """Base class of hpccoll's runtime errors."""


class CollectiveTimeout(HpccollError):
    """A peer did not deliver in time (a rank never joined, or crashed).

    Attributes name what the kernel was waiting for: `collective`, `peer`, `slot`,
    `waited_s`.  The communicator is unusable afterwards; free it."""

    def __init__(self, message: str, *, collective=None, peer=None, slot=None, waited_s=None):
        super().__init__(message)
        self.collective = collective
        self.peer = peer
        self.slot = slot
        self.waited_s = waited_s


class MismatchError(ValueError):
    """Ranks called a collective with arguments that do not match (check mode)."""


class PerformanceWarning(UserWarning):
    """hpccoll runs, but far slower than it could, and the warning says how to fix it (for
    instance ranks sharing a GPU without MPS: hpccoll.mps)."""
