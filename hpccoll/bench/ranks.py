"""What the ranks of a sweep agree on before they go on.  Every piece that can fail on one rank
alone (a compile, a capture, an allocation) runs through `guarded`: its failure becomes a Skip
on every rank, so no rank is left waiting in a kernel or a collective for one that gave up."""
from __future__ import annotations

from ..backends.base import ranks_reasons


class Skip(Exception):
    """A mode or baseline that cannot run here (the message says why)."""


def say(rank: int, *msg) -> None:
    """print on rank 0 only."""
    if rank == 0:
        print(*msg, flush=True)


def agree(mpi_comm, ok: bool) -> bool:
    """True only when every rank succeeded (collective)."""
    from mpi4py import MPI

    return bool(mpi_comm.allreduce(1 if ok else 0, op=MPI.MIN))


def max_over_ranks(mpi_comm, t):
    """MAX over ranks of each rank's time (None if any rank has none; collective)."""
    vals = mpi_comm.allgather(t)
    return None if any(v is None for v in vals) else max(vals)


def skip_unless_all(mpi_comm, why: str | None, what: str = "") -> None:
    """Raise Skip on every rank when any rank has a reason `why` (collective)."""
    whys = ranks_reasons(mpi_comm, why)
    if whys:
        raise Skip(what + whys)


def guarded(mpi_comm, fn, what: str = ""):
    """fn() on every rank; raise Skip on all ranks when it failed on any (collective)."""
    why = val = None
    try:
        val = fn()
    except Exception as exc:  # noqa: BLE001 - any failure is a reason to skip
        why = describe(exc)
    skip_unless_all(mpi_comm, why, what)
    return val


def describe(exc: BaseException) -> str:
    """One line naming the exception."""
    return f"{exc.__class__.__name__}: {exc}".splitlines()[0][:300]
