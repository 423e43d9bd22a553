"""Host backend: numpy buffers through mpi4py; device buffers are staged through host.

The reference for every other backend.  Deterministic reductions gather every
contribution and reduce in rank order (`ops.reduce_in_rank_order`), so every rank
gets the same bits in every run."""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .._validate import Call
from ..ops import SUM, PROD, MAX, MIN, reduce_in_rank_order

_MPI_OPS = {SUM: MPI.SUM, PROD: MPI.PROD, MAX: MPI.MAX, MIN: MPI.MIN}
_MPI_TYPED = {"float64", "float32", "int32", "int64"}


class _Staged:
    """Host view of a buffer; device buffers are copied in and (for outputs) back.

    Staging is synchronous with respect to EVERY stream of the device: the copy in waits for
    all queued work (the caller may have produced the data on a non-blocking stream, which a
    legacy-stream copy would not wait for), and the copy back completes before returning (a
    pageable host-to-device cudaMemcpy may return before its DMA lands)."""

    def __init__(self, buf, fetch: bool = True):
        self.buf = buf
        if buf.is_device:
            import cupy

            cupy.cuda.runtime.deviceSynchronize()
            self.host = cupy.asnumpy(buf.flat) if fetch else np.empty(buf.count, buf.flat.dtype)
        else:
            self.host = buf.flat

    def commit(self):
        if self.buf.is_device:
            import cupy

            self.buf.flat.set(self.host)
            cupy.cuda.runtime.deviceSynchronize()


class HostBackend:
    name = "host"

    def __init__(self, mpi_comm):
        self.comm = mpi_comm
        self.size = mpi_comm.Get_size()
        self.rank = mpi_comm.Get_rank()

    # -- helpers -------------------------------------------------------------
    def _gather_all(self, x: np.ndarray) -> np.ndarray:
        out = np.empty((self.size,) + x.shape, dtype=x.dtype)
        self.comm.Allgather(x.view(np.uint8), out.view(np.uint8))
        return out

    # -- collectives ---------------------------------------------------------
    def allreduce(self, call: Call, deterministic: bool, algorithm: str) -> None:
        send = _Staged(call.send)
        recv = send if call.in_place else _Staged(call.recv, fetch=False)
        x = send.host
        if not deterministic and call.send.dtype in _MPI_TYPED:
            src = MPI.IN_PLACE if call.in_place else x
            self.comm.Allreduce(src, recv.host, op=_MPI_OPS[call.op])
        else:
            recv.host[...] = reduce_in_rank_order(call.op, self._gather_all(np.array(x, copy=True)))
        recv.commit()

    def reduce_scatter_block(self, call: Call, deterministic: bool, algorithm: str) -> None:
        send = _Staged(call.send)
        x = send.host
        n = x.size // self.size
        parts = np.empty((self.size, n), dtype=x.dtype)
        self.comm.Alltoall(np.ascontiguousarray(x).view(np.uint8), parts.view(np.uint8))
        res = reduce_in_rank_order(call.op, parts)
        recv = send if call.in_place else _Staged(call.recv, fetch=False)
        recv.host[:n] = res
        recv.commit()

    def allgather(self, call: Call, deterministic: bool, algorithm: str) -> None:
        recv = _Staged(call.recv, fetch=call.in_place)
        n = call.recv.count // self.size
        if call.in_place:
            mine = np.array(recv.host[self.rank * n:(self.rank + 1) * n], copy=True)
        else:
            mine = np.ascontiguousarray(_Staged(call.send).host)
        self.comm.Allgather(mine.view(np.uint8), recv.host.view(np.uint8))
        recv.commit()

    def bcast(self, call: Call, deterministic: bool, algorithm: str) -> None:
        buf = _Staged(call.recv, fetch=self.rank == call.root)
        self.comm.Bcast(buf.host.view(np.uint8), root=call.root)
        buf.commit()

    def barrier(self) -> None:
        self.comm.Barrier()

    def free(self) -> None:
        pass
