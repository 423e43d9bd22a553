"""The interface every backend implements, and what each one can do, as data.

The Communicator (hpccoll/comm.py) validates a call, then hands the `Call` to a backend: the
host backend for host buffers, its device backend (cuda, nccl, or the hierarchical composition
of node and inter-node backends) for device buffers of the collectives that backend runs
(`caps.collectives`); any other device call goes to the host backend, which stages it through
host memory.  Nothing in comm.py asks a backend what it is: it reads `caps`."""
from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import NamedTuple

log = logging.getLogger("hpccoll")

#: every collective a Communicator offers, by its mpi4py name
COLLECTIVES = frozenset({"Allreduce", "Bcast", "Allgather", "Reduce_scatter_block", "Alltoall", "Alltoallv"})


def ranks_reasons(mpi_comm, why: str | None) -> str | None:
    """Every rank's reason not to go on, as 'rank r: why; ...', or None when no rank has one
    (collective): what each rank raises alike, where a rank raising alone would leave its
    peers waiting in the next exchange."""
    said = [f"rank {r}: {w}" for r, w in enumerate(mpi_comm.allgather(why)) if w]
    return "; ".join(said) or None


def ranks_differ(mpi_comm, mine) -> str | None:
    """Every rank's `mine`, as 'rank r: value; ...', when they are not all equal, else None
    (collective): for arguments every rank must pass alike."""
    theirs = mpi_comm.allgather(mine)
    if all(t == mine for t in theirs):
        return None
    return "; ".join(f"rank {r}: {t}" for r, t in enumerate(theirs))


def agreed_device(mpi_comm, device, default: int, ndev: int) -> int:
    """This rank's GPU ordinal (`device`, else `default`), checked on every rank together
    (collective): an ordinal some rank does not have raises ValueError on every rank, naming
    those ranks."""
    dev = int(device) if device is not None else default
    bad = ranks_reasons(mpi_comm, None if 0 <= dev < ndev else f"device={dev}, it has GPUs 0..{ndev - 1}")
    if bad:
        raise ValueError(f"Communicator: a GPU ordinal out of range ({bad}): pass an ordinal every "
                         "such rank has, or device=None (the node-local rank's GPU)")
    return dev


def release_together(mpi_comm, release, within: float | None, what: str) -> bool:
    """Call `release()` once every rank of `mpi_comm` has come here (collective: a nonblocking
    barrier, so that no peer still writes into memory this rank unmaps).  `within` None waits
    as long as it takes; a number of seconds is for teardown after a CollectiveTimeout, where a
    peer may never come: past it nothing is released (the process's exit reclaims it), a
    warning says so, and the result is False.  Every rank of a teardown must call this (the
    barrier is MPI_Ibarrier, which a blocking MPI_Barrier does not match); a rank that gave up
    leaves its barrier posted, so a peer arriving later still passes."""
    req = mpi_comm.Ibarrier()
    if within is None:
        req.Wait()
    else:
        deadline = time.monotonic() + within
        while not req.Test():
            if time.monotonic() > deadline:
                log.warning("hpccoll: %s: a peer did not come within %g s after the timeout; its "
                            "memory and MPI communicator are left to the end of the process", what, within)
                return False
            time.sleep(1e-3)
    release()
    return True


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do (read by the Communicator instead of probing attributes).

    device: runs device (CuPy / CUDA array interface) buffers itself.
    host_buffers: runs numpy buffers itself (else the host backend takes them).
    collectives: the collectives it runs itself; others go to the host backend (which stages
        device buffers through host memory).
    algorithms: the `algorithm=` names it accepts besides "auto" (the host backend's "mpi").
    plans: prepares a launch for a repeated call (`plan`), the repeated call's fast path.
    groups: fuses the calls of a `comm.group()` block (`run_group`), beyond running them in order.
    engine: runs the eager engine (`start_engine` / `stop_engine`).
    asynchronous: device calls are queued on a stream; `synchronize` waits for them."""

    device: bool
    host_buffers: bool = False
    collectives: frozenset = COLLECTIVES
    algorithms: tuple = ()
    plans: bool = False
    groups: bool = False
    engine: bool = False
    asynchronous: bool = False
    extension: bool = False  # offers the device-extension API (symmetric memory, kernel args)


class Route(NamedTuple):
    """How one validated call runs, decided once (hpccoll/_routes.py picks the backend, whose
    `route` asks hpccoll.policy): the fast path, persistent requests, groups and check mode keep
    this value, and the backend runs the call by it without deciding again.

    requested: the algorithm the call asked for (its own, else the communicator's default):
        what check mode compares, what the eager engine and groups take.
    algorithm: what runs (the cuda backend: policy.pick's kernel; the host backend: its Allreduce
        path; the hierarchical backend: policy.hier_variant's composition; else `requested`).
    chain: the one-shot a captured Allreduce runs in a chain node (cuda, policy.chain_algorithm).
    (A named tuple: immutable, and made in a fraction of a frozen dataclass's time on every
    call's full path.)"""

    backend: "Backend"
    requested: str
    algorithm: str
    deterministic: bool
    chain: str | None = None


class Backend(ABC):
    """One way of running validated calls (hpccoll._validate.Call).

    route(call, algorithm, deterministic): the call's Route on this backend, raising ValueError /
        HpccollError for an algorithm name it cannot run (local: no communication).
    run(call, route, stream): issue the call as its route says.
    plan(call, route): a prepared launch with `.launch(stream)` for repeats of exactly this
        call, or None.
    run_group(items, check): the calls of a group block, items of (call, route, stream); check:
        compare with every rank how they would be issued first (check mode).
    synchronize(stream), barrier(), free()."""

    name: str = "?"
    caps: Capabilities = Capabilities(device=False)
    device_id: int | None = None
    #: free() gave up waiting for a peer after a CollectiveTimeout (release_together): the MPI
    #: communicator must not be freed either
    abandoned: bool = False

    def route(self, call, algorithm: str, deterministic: bool) -> Route:
        if algorithm != "auto" and algorithm not in self.caps.algorithms:
            names = ", ".join(("auto",) + tuple(self.caps.algorithms))
            raise ValueError(f"{call.name}: algorithm={algorithm!r} is not one the {self.name} backend "
                             f"runs: use one of {names}")
        return Route(self, algorithm, algorithm, deterministic)

    @abstractmethod
    def run(self, call, route: Route, stream) -> None:
        """Issue one validated call as `route` says."""

    def takes(self, call) -> bool:
        """Whether this backend runs `call` itself (by its capabilities)."""
        caps = self.caps
        if call.name not in caps.collectives:
            return False
        return caps.device if call.recv.is_device else caps.host_buffers

    def plan(self, call, route: Route):
        return None

    def run_group(self, items, check: bool = False) -> None:
        for call, route, stream in items:
            self.run(call, route, stream)

    def synchronize(self, stream=None) -> None:
        """Wait for this backend's work on `stream` (a no-op for synchronous backends)."""

    def prepare(self, dtypes) -> None:
        """Compile or load now the kernels this backend runs for `dtypes` (canonical names); a
        no-op for backends without compiled kernels."""

    @abstractmethod
    def barrier(self) -> None:
        """Every rank has reached this point (device work queued before it included)."""

    @abstractmethod
    def free(self) -> None:
        """Release what the backend holds (collective; after a CollectiveTimeout bounded by the
        timeout, see release_together)."""
