"""Opens a communicator's backends: the one place a backend is constructed.

`open_backends(mpi_comm, requested, device, config, layout)` (collective) gives a `Backends`:
the host backend (always: the reference, and the path of every call the main backend does not
take) and the main backend, which is

  - the hierarchical composition (hier.py) when `layout` spans several nodes: node backends
    opened here again per node, the stripe's host backend and, for device calls, its NCCL;
  - else the backend asked for: "host" (the host backend itself), "nccl", "cuda", or "auto"
    (cuda where every rank can open it, else host, logged).

Every rank comes to each agreement before any raises: whether every rank can open the device
path (`ranks_reasons`), whether every node opened its node backends.  A rank raising alone
would leave its peers waiting in the next exchange."""
from __future__ import annotations

import dataclasses
import logging

from ..errors import HpccollError
from .base import Backend, ranks_reasons
from .hier import Hierarchical, NodeLayout, nccl_between_reason, physical_device
from .host import HostBackend
from .topology import warn_if_shared_without_mps

log = logging.getLogger("hpccoll")

#: the backend names a Communicator accepts
REQUESTS = ("auto", "host", "cuda", "nccl")


def device_unavailable_reason() -> str | None:
    """None when the CUDA backend can run in this process, else why not (local)."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - report any import failure
        return f"CuPy is not importable ({exc.__class__.__name__}: {exc}); pip install 'hpccoll[cuda13]'"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001
        return f"no usable CUDA driver ({exc})"
    if n == 0:
        return "no GPU"
    return None


class Backends:
    """A communicator's backends over one MPI communicator: `host`, and `main` (the device or
    hierarchical backend, else `host` itself), named `name` ("host", "cuda", "nccl", "hier(...)").
    `free()` releases both, then the MPI communicator (collective)."""

    __slots__ = ("mpi_comm", "host", "main", "name")

    def __init__(self, mpi_comm, host: HostBackend, main: Backend, name: str):
        self.mpi_comm, self.host, self.main, self.name = mpi_comm, host, main, name

    @property
    def broken(self) -> str | None:
        """Why these backends are unusable (a call timed out), or None."""
        return self.host.broken or getattr(self.main, "broken", None)

    def free(self) -> None:
        """Release the main backend, then the host backend (local), then the MPI communicator,
        unless a timeout left an MPI operation pending (host) or a peer never came to the main
        backend's teardown (`abandoned`): freeing it would wait for them."""
        try:
            if self.main is not self.host:
                self.main.free()
        finally:
            self.host.free()
            if not self.host.broken and not self.main.abandoned:
                self.mpi_comm.Free()


def open_backends(mpi_comm, requested: str, device, config, layout: NodeLayout | None = None, *,
                  algorithm: str = "auto", deterministic: bool = False) -> Backends:
    """The backends of a communicator over `mpi_comm` (collective; see the module's doc).
    config: its hpccoll.config.Config (agreed by every rank).  layout: hier.node_layout's, None
    for one node.  algorithm / deterministic: the communicator's defaults, which the
    hierarchical backend's node phases take where the outer call names none."""
    if requested not in REQUESTS:
        raise ValueError(f"Communicator: backend={requested!r}: use one of {', '.join(REQUESTS)}")
    host = HostBackend(mpi_comm, config.timeout, shm=config.host_shm)
    if layout is not None:
        main = _open_hierarchical(mpi_comm, layout, requested, device, config, algorithm, deterministic)
        return Backends(mpi_comm, host, main, main.name)
    main, name = _open_device(mpi_comm, requested, device, config)
    return Backends(mpi_comm, host, main or host, name)


def _open_device(mpi_comm, requested: str, device, config) -> tuple[Backend | None, str]:
    """(device backend, name), or (None, "host") where the host backend serves every call."""
    if requested == "host":
        return None, "host"
    # Construction is collective: agree on whether every rank can open the device path.
    msg = ranks_reasons(mpi_comm, device_unavailable_reason())
    if msg:
        if requested == "auto":
            log.info("hpccoll: using the host backend (%s)", msg)
            return None, "host"
        raise HpccollError(f"Communicator: backend={requested!r} is not available: {msg}")
    if requested == "nccl":
        return open_nccl(mpi_comm, device, config.timeout), "nccl"
    from .cuda import CudaBackend, CudaUnavailable

    try:
        backend = CudaBackend(mpi_comm, device, config, open_nccl=open_nccl)
    except CudaUnavailable as exc:
        if requested == "auto":
            log.warning("hpccoll: CUDA backend unavailable, using host backend: %s", exc)
            return None, "host"
        raise
    warn_if_shared_without_mps(mpi_comm, backend.device_id)  # (every rank: it opened)
    return backend, "cuda"


def open_nccl(mpi_comm, device, timeout: float):
    """An NcclBackend (collective): the nccl backend, the cuda backend's NCCL fallback."""
    from .nccl import NcclBackend

    return NcclBackend(mpi_comm, device, timeout)


def _open_hierarchical(mpi_comm, layout: NodeLayout, requested: str, device, config, algorithm: str,
                       deterministic: bool) -> Hierarchical:
    """Node backends (the backend asked for, on each node), the stripe's host backend and, where
    every rank of a stripe can run it, the stripe's NCCL (collective over `mpi_comm`)."""
    phase_config = dataclasses.replace(config, check=False)  # (phases are never agreed: the call was)
    if device is None and requested != "host":
        device = physical_device(mpi_comm, layout, config.node_size is not None)
    local_mpi = mpi_comm.Split(layout.node, layout.local)
    stripe_mpi = mpi_comm.Split(layout.local, layout.node)
    # A node whose backends cannot open (backend='cuda' without P2P there, say) raises on its
    # ranks: every node learns it before the stripes are opened, and raises too
    node, error = None, None
    try:
        node = open_backends(local_mpi, requested, device, phase_config)
    except Exception as exc:  # noqa: BLE001 - agreed below, then re-raised on this rank
        error = exc
    failed = mpi_comm.allgather(None if error is None else f"node {layout.node}: {error}")
    if any(failed):
        if error is not None:
            raise error
        node.free()
        raise HpccollError("Communicator: another node's communicator could not open ("
                           + "; ".join(dict.fromkeys(f for f in failed if f)) + ")")
    stripe = open_backends(stripe_mpi, "host", None, phase_config)
    stripe_nccl = None
    # NCCL between nodes for device calls: decided by every rank of the stripe together (the
    # nodes' backends may differ)
    why = nccl_between_reason(stripe_mpi, node)
    if why:
        if node.name == "cuda":
            log.info("hpccoll: inter-node phase on MPI only: %s", why)
    else:
        stripe_nccl = open_backends(stripe_mpi.Dup(), "nccl", node.main.device_id, phase_config)
    return Hierarchical(layout, node, stripe, stripe_nccl, config.hier_rsag_bytes, algorithm, deterministic)
