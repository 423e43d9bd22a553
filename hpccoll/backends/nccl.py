"""NCCL backend (through CuPy's NCCL bindings): the baseline hpccoll is measured against, and
the eigensolver's `--comm nccl` path.  Not deterministic; NCCL picks its own algorithms
(NVLink multicast stays off: NCCL_NVLS_ENABLE=0 is forced)."""
from __future__ import annotations

import os
import socket

from .._validate import Call
from ..errors import HpccollError
from .base import Backend, Capabilities, agreed_device
from .streams import stream_ptr, synchronize_stream


def nccl_unavailable_reason() -> str | None:
    try:
        from cupy.cuda import nccl
    except Exception as exc:  # noqa: BLE001
        return f"cupy.cuda.nccl not importable ({exc})"
    if not getattr(nccl, "available", True):
        return "CuPy found no NCCL library (pip install nvidia-nccl-cu13)"
    return None


def gpu_identity(device: int) -> tuple[str, str]:
    """(host name, PCI bus id) of a CUDA device ordinal: one GPU on one machine, whatever the
    ordinal numbering (CUDA_VISIBLE_DEVICES) of the process."""
    import cupy

    return socket.gethostname(), cupy.cuda.Device(device).pci_bus_id


def shared_gpus(gpus: list[tuple[str, str] | None]) -> str | None:
    """Which ranks share a GPU, from every rank's gpu_identity (None: not known, never shared);
    None when none do."""
    ranks: dict[tuple[str, str], list[int]] = {}
    for r, key in enumerate(gpus):
        if key is not None:
            ranks.setdefault(key, []).append(r)
    shared = [f"ranks {', '.join(map(str, rs))} share GPU {bus} on {host}"
              for (host, bus), rs in ranks.items() if len(rs) > 1]
    return "; ".join(shared) or None


class NcclBackend(Backend):
    name = "nccl"
    caps = Capabilities(device=True, collectives=frozenset({"Allreduce", "Bcast", "Allgather",
                                                             "Reduce_scatter_block", "Alltoall"}),
                        groups=True, asynchronous=True)

    def __init__(self, mpi_comm, device=None):
        os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast on shared hosts
        # every rank comes to each agreement before any raises (a rank raising alone would leave
        # its peers waiting in the next exchange)
        whys = [(r, w) for r, w in enumerate(mpi_comm.allgather(nccl_unavailable_reason())) if w]
        if whys:
            raise HpccollError("Communicator: backend='nccl' is not available: "
                               + "; ".join(f"rank {r}: {w}" for r, w in whys))
        import cupy
        from cupy.cuda import nccl
        from mpi4py import MPI

        node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
        local = node.Get_rank()
        node.Free()
        ndev = cupy.cuda.runtime.getDeviceCount()
        self.device_id = agreed_device(mpi_comm, device, local % ndev, ndev)
        cupy.cuda.Device(self.device_id).use()
        self.size, self.rank = mpi_comm.Get_size(), mpi_comm.Get_rank()
        # NCCL refuses two ranks on one GPU (NCCL_ERROR_INVALID_USAGE, no reason given): say
        # which ranks share which GPU, on every rank alike
        gpus = mpi_comm.allgather(gpu_identity(self.device_id))
        shared = shared_gpus(gpus)
        if shared:
            raise HpccollError(f"Communicator: backend='nccl' needs one GPU per rank, and {shared}: use "
                               "backend='cuda' (hpccoll's kernels serve several ranks per GPU, under MPS) "
                               "or start one rank per GPU")
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = mpi_comm.bcast(uid, root=0)
        self.nccl = nccl
        try:
            self.comm = nccl.NcclCommunicator(self.size, uid, self.rank)
        except Exception as exc:  # noqa: BLE001 - CuPy's NcclError, whatever its module
            raise HpccollError(f"Communicator: backend='nccl': NCCL could not open a communicator of "
                               f"{self.size} ranks on this rank's GPU {gpus[self.rank][1]} ({exc}); "
                               "NCCL_DEBUG=WARN makes NCCL say why") from exc
        self.mpi = mpi_comm
        self.types = {"float64": nccl.NCCL_FLOAT64, "float32": nccl.NCCL_FLOAT32,
                      "float16": nccl.NCCL_FLOAT16, "int32": nccl.NCCL_INT32, "int64": nccl.NCCL_INT64}
        if hasattr(nccl, "NCCL_BFLOAT16"):
            self.types["bfloat16"] = nccl.NCCL_BFLOAT16
        self.ops = {"SUM": nccl.NCCL_SUM, "PROD": nccl.NCCL_PROD, "MAX": nccl.NCCL_MAX, "MIN": nccl.NCCL_MIN}

    def run(self, call: Call, deterministic: bool, algorithm: str, stream, iters: int = 1) -> None:
        t = self.types.get(call.recv.dtype)
        if t is None:
            raise HpccollError(f"{call.name}: this NCCL build has no {call.recv.dtype}: use backend='cuda'")
        s = stream_ptr(stream)
        send, recv = call.send.flat, call.recv.flat
        size, rank = self.size, self.rank
        for _ in range(iters):
            if call.name == "Allreduce":
                self.comm.allReduce(send.data.ptr, recv.data.ptr, recv.size, t, self.ops[call.op.name], s)
            elif call.name == "Bcast":
                self.comm.bcast(recv.data.ptr, recv.size, t, call.root, s)
            elif call.name == "Allgather":
                n = recv.size // size
                src = recv[rank * n:] if call.in_place else send
                self.comm.allGather(src.data.ptr, recv.data.ptr, n, t, s)
            elif call.name == "Reduce_scatter_block":
                n = recv.size // size if call.in_place else recv.size
                self.comm.reduceScatter(send.data.ptr, recv.data.ptr, n, t, self.ops[call.op.name], s)
            elif call.name == "Alltoall":
                self._alltoall(call, t, s)

    def _alltoall(self, call: Call, t, s: int) -> None:
        """Pairwise sends and receives in one NCCL group (NCCL has no Alltoall of its own)."""
        import cupy

        size = self.size
        recv = call.recv.flat
        n = recv.size // size
        src = call.send.flat
        if call.in_place:
            with cupy.cuda.ExternalStream(s):
                src = recv.copy()
        esize = recv.itemsize
        self.nccl.groupStart()
        try:
            for peer in range(size):
                self.comm.send(src.data.ptr + peer * n * esize, n, t, peer, s)
                self.comm.recv(recv.data.ptr + peer * n * esize, n, t, peer, s)
        finally:
            self.nccl.groupEnd()

    def run_group(self, items) -> None:
        """A group's calls inside ncclGroupStart / ncclGroupEnd: NCCL issues them together."""
        self.nccl.groupStart()
        try:
            for item in items:
                self.run(*item)
        finally:
            self.nccl.groupEnd()

    def synchronize(self, stream=None) -> None:
        synchronize_stream(stream)

    def barrier(self, stream=None, iters: int = 1, sync: bool = True) -> None:
        import cupy

        x = cupy.zeros(1, dtype=cupy.float32)
        s = stream_ptr(stream)
        for _ in range(iters):
            self.comm.allReduce(x.data.ptr, x.data.ptr, 1, self.nccl.NCCL_FLOAT32, self.nccl.NCCL_SUM, s)
        if sync:
            self.synchronize(stream)

    def free(self) -> None:
        self.mpi.Barrier()
        self.comm.destroy()
