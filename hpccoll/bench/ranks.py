"""What the ranks of a sweep agree on before they go on.  Every piece that can fail on one rank
alone (a compile, a capture, an allocation) runs through `guarded`: its failure becomes a Skip
on every rank, so no rank is left waiting in a kernel or a collective for one that gave up."""
from __future__ import annotations

import functools
import os


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
    whys = mpi_comm.allgather(why)
    if any(whys):
        raise Skip(what + "; ".join(f"rank {r}: {w}" for r, w in enumerate(whys) if w))


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
    """One line naming the exception.  A SyntaxError about NUL bytes also names where it was
    raised and which of torch's sources read back with NUL bytes now: importlib drops its own
    frames, so the failing import does not name the file (a damaged file system did this)."""
    text = f"{exc.__class__.__name__}: {exc}".splitlines()[0][:300]
    if isinstance(exc, SyntaxError) and "null bytes" in text:
        import traceback

        where = "; ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
                          for f in traceback.extract_tb(exc.__traceback__)[-3:])
        text += f" (raised in {where}; {nul_files()})"
    return text


@functools.lru_cache(maxsize=1)
def nul_files(pkg: str = "torch") -> str:
    """Which of pkg's .py files read back with NUL bytes in this process now."""
    import importlib.util

    spec = importlib.util.find_spec(pkg)
    bad, n = [], 0
    for root in (spec.submodule_search_locations or []) if spec else []:
        for d, _, files in os.walk(root):
            for f in files:
                if f.endswith(".py"):
                    n += 1
                    with open(os.path.join(d, f), "rb") as fh:
                        if b"\0" in fh.read():
                            bad.append(os.path.relpath(os.path.join(d, f), root))
    return f"{len(bad)} of {n} {pkg} .py files read back with NUL bytes now: {bad[:5]}"
