"""GPU facts read from the driver: count, names, P2P access and native peer atomics, and which
GPU a rank runs on as NCCL tells GPUs apart (host and PCI bus)."""
from __future__ import annotations

import os
import socket


def p2p_matrix():
    """(names, access[i][j], atomics[i][j]) from cudaDeviceGetP2PAttribute."""
    import cupy

    rt = cupy.cuda.runtime
    n = rt.getDeviceCount()
    names = []
    for i in range(n):
        props = rt.getDeviceProperties(i)
        name = props["name"]
        names.append(name.decode() if isinstance(name, bytes) else name)
    access = [[i == j or bool(rt.deviceCanAccessPeer(i, j)) for j in range(n)] for i in range(n)]
    from .cuda.driver import p2p_native_atomics

    atomics = [[i == j or p2p_native_atomics(i, j) for j in range(n)] for i in range(n)]
    return names, access, atomics


def describe_gpus() -> str:
    names, access, atomics = p2p_matrix()
    n = len(names)
    lines = [f"GPUs: {n}"]
    lines += [f"  GPU {i}: {name}" for i, name in enumerate(names)]
    head = "      " + " ".join(f"{j:>4}" for j in range(n))
    lines.append("P2P access (A) and native peer atomics (+):")
    lines.append(head)
    for i in range(n):
        cells = ["self" if i == j else ("A+" if atomics[i][j] else "A") if access[i][j] else "-"
                 for j in range(n)]
        lines.append(f"  {i:>3} " + " ".join(f"{c:>4}" for c in cells))
    return "\n".join(lines)


def nccl_host() -> str:
    """The host as NCCL tells hosts apart: NCCL_HOSTID where set, else the host name."""
    return os.environ.get("NCCL_HOSTID") or socket.gethostname()


def nccl_identity(device: int) -> tuple[str, str]:
    """(NCCL's host, PCI bus id) of a CUDA device ordinal: one GPU on one machine, whatever the
    ordinal numbering (CUDA_VISIBLE_DEVICES) of the process.  NCCL refuses two ranks of one
    communicator on one GPU of one host; ranks given distinct NCCL_HOSTID values count as on
    different hosts, and NCCL joins them through its network transport, one GPU or not (the
    GPU tests' NCCL loopback mode)."""
    import cupy

    return nccl_host(), cupy.cuda.Device(device).pci_bus_id


def shared_gpus(gpus: list[tuple[str, str] | None]) -> str | None:
    """Which ranks share a GPU, from every rank's nccl_identity (None: not known, never shared);
    None when none do."""
    ranks: dict[tuple[str, str], list[int]] = {}
    for r, key in enumerate(gpus):
        if key is not None:
            ranks.setdefault(key, []).append(r)
    shared = [f"ranks {', '.join(map(str, rs))} share GPU {bus} on {host}"
              for (host, bus), rs in ranks.items() if len(rs) > 1]
    return "; ".join(shared) or None


def ranks_sharing_gpus(mpi_comm, device: int) -> str | None:
    """Which ranks of `mpi_comm` share a GPU as NCCL tells GPUs apart (None: none do, NCCL takes
    them); collective."""
    return shared_gpus(mpi_comm.allgather(nccl_identity(device)))


def warn_if_shared_without_mps(mpi_comm, device: int) -> bool:
    """Warn once, on rank 0 (hpccoll.PerformanceWarning, with the cost and the fix), where ranks
    of `mpi_comm` share a GPU and MPS does not run for them (hpccoll.mps); collective."""
    from ..mps import mps_status, shared_without_mps, warn_sharing

    gathered = mpi_comm.allgather((nccl_identity(device), mps_status()[0]))
    return warn_sharing(shared_without_mps([g for g, _ in gathered], [m for _, m in gathered]),
                        mpi_comm.Get_rank())
