"""NCCL backend (through CuPy's NCCL bindings): the baseline hpccoll is measured against, and
the eigensolver's `--comm nccl` path.  Not deterministic; NCCL picks its own algorithms
(NVLink multicast stays off: NCCL_NVLS_ENABLE=0 is forced)."""
from __future__ import annotations

import os

from .._validate import Call
from ..errors import HpccollError
from .base import Backend, Capabilities, agreed_device, ranks_reasons, release_together
from .streams import stream_ptr, synchronize_stream
from .topology import nccl_identity, shared_gpus


def nccl_unavailable_reason() -> str | None:
    try:
        from cupy.cuda import nccl
    except Exception as exc:  # noqa: BLE001
        return f"cupy.cuda.nccl not importable ({exc})"
    if not getattr(nccl, "available", True):
        return "CuPy found no NCCL library (pip install nvidia-nccl-cu13)"
    return None


class NcclBackend(Backend):
    name = "nccl"
    caps = Capabilities(device=True, collectives=frozenset({"Allreduce", "Bcast", "Allgather",
                                                             "Reduce_scatter_block", "Alltoall"}),
                        groups=True, asynchronous=True)

    def __init__(self, mpi_comm, device=None):
        os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast on shared hosts
        # every rank comes to each agreement before any raises (a rank raising alone would leave
        # its peers waiting in the next exchange)
        why = ranks_reasons(mpi_comm, nccl_unavailable_reason())
        if why:
            raise HpccollError(f"Communicator: backend='nccl' is not available: {why}")
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
        # NCCL refuses two ranks on one GPU of one host (NCCL_ERROR_INVALID_USAGE, no reason
        # given): say which ranks share which GPU, on every rank alike
        gpus = mpi_comm.allgather(nccl_identity(self.device_id))
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

    def run_group(self, items, check: bool = False) -> None:
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

        s = stream_ptr(stream)
        with cupy.cuda.ExternalStream(s):  # (on s: filled before, and its memory reused only after, the allreduces)
            x = cupy.zeros(1, dtype=cupy.float32)
        for _ in range(iters):
            self.comm.allReduce(x.data.ptr, x.data.ptr, 1, self.nccl.NCCL_FLOAT32, self.nccl.NCCL_SUM, s)
        if sync:
            self.synchronize(stream)

    def free(self, within: float | None = None) -> None:
        """Destroy the NCCL communicator once every rank is here (collective); `within` bounds
        the wait (the cuda backend's teardown after a CollectiveTimeout), past which the
        communicator is aborted instead (local)."""
        if not release_together(self.mpi, self.comm.destroy, within, "Free (NCCL)"):
            self.comm.abort()
