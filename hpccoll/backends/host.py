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
# MPI counts are C ints: a message of more bytes than this goes in units of a contiguous
# datatype (Allgather, Alltoall) or in pieces (Bcast).  Open MPI 4.1 refused a 2 GiB Bcast
# (MPI_ERR_ARG: the eigensolver's n = 16384 problem, 2026-11-30).  Tests lower it.
MAX_COUNT = 2**31 - 1
_UNITS: dict = {}   # bytes per unit -> committed contiguous MPI datatype


def _msg(u8: np.ndarray, blocks: int = 1):
    """mpi4py message for the bytes `u8` (1-D uint8, contiguous) of `blocks` equal per-rank
    blocks: the array itself when its size fits an MPI count, else [array, contiguous type of
    2^k bytes] (mpi4py then counts units per block: the size over blocks and unit)."""
    n = u8.size
    if n <= MAX_COUNT:
        return u8
    per = n // blocks
    unit = 1 << 20
    while per % unit:
        unit >>= 1
    if per // unit > MAX_COUNT:
        raise ValueError(f"hpccoll host backend: a block of {per} bytes has no unit of 2^k bytes that "
                         f"brings its MPI count under {MAX_COUNT + 1}; pad the buffer to a multiple of 1 KiB")
    return [u8, _unit_type(unit)]


def _unit_type(unit: int):
    """MPI.BYTE, or a committed contiguous type of `unit` bytes (kept)."""
    if unit == 1:
        return MPI.BYTE
    t = _UNITS.get(unit)
    if t is None:
        t = _UNITS[unit] = MPI.BYTE.Create_contiguous(unit).Commit()
    return t


def _vunit(sizes) -> int:
    """Bytes per unit of an Alltoallv whose counts and displacements are `sizes` bytes: 1 when
    every one fits an MPI count, else the largest power of two up to 1 MiB dividing them all.
    Units of other sizes on other ranks still match: the type signatures are all bytes."""
    if max(sizes, default=0) <= MAX_COUNT:
        return 1
    unit = 1 << 20
    while any(s % unit for s in sizes):
        unit >>= 1
    if max(sizes) // unit > MAX_COUNT:
        raise ValueError(f"hpccoll host backend: Alltoallv counts/displacements of up to {max(sizes)} bytes "
                         f"have no unit of 2^k bytes that brings them under {MAX_COUNT + 1}; make them "
                         "multiples of 1 KiB")
    return unit


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
        self.comm.Allgather(_msg(x.reshape(-1).view(np.uint8)), _msg(out.reshape(-1).view(np.uint8), self.size))
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
        self.comm.Alltoall(_msg(np.ascontiguousarray(x).reshape(-1).view(np.uint8), self.size),
                           _msg(parts.reshape(-1).view(np.uint8), self.size))
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
        self.comm.Allgather(_msg(mine.reshape(-1).view(np.uint8)), _msg(recv.host.reshape(-1).view(np.uint8), self.size))
        recv.commit()

    def bcast(self, call: Call, deterministic: bool, algorithm: str) -> None:
        buf = _Staged(call.recv, fetch=self.rank == call.root)
        u8 = buf.host.view(np.uint8)
        for off in range(0, max(u8.size, 1), MAX_COUNT):  # pieces whose counts fit an int
            self.comm.Bcast(u8[off:off + MAX_COUNT], root=call.root)
        buf.commit()

    def alltoall(self, call: Call, deterministic: bool, algorithm: str) -> None:
        recv = _Staged(call.recv, fetch=call.in_place)
        if call.in_place:
            src = np.array(recv.host, copy=True)
        else:
            src = np.ascontiguousarray(_Staged(call.send).host)
        self.comm.Alltoall(_msg(src.reshape(-1).view(np.uint8), self.size),
                           _msg(recv.host.reshape(-1).view(np.uint8), self.size))
        recv.commit()

    def alltoallv(self, call: Call, deterministic: bool, algorithm: str) -> None:
        send = np.ascontiguousarray(_Staged(call.send).host).reshape(-1).view(np.uint8)
        recv = _Staged(call.recv)   # fetched: elements outside the received blocks keep their values
        item = np.dtype(call.recv.flat.dtype).itemsize
        (scnt, sdsp), (rcnt, rdsp) = call.sendv, call.recvv
        sizes = [item * x for x in (*scnt, *sdsp, *rcnt, *rdsp)]
        unit = _vunit(sizes)
        t = _unit_type(unit)
        spec = lambda u8, cnt, dsp: [u8, ([item * c // unit for c in cnt], [item * d // unit for d in dsp]), t]  # noqa: E731
        self.comm.Alltoallv(spec(send, scnt, sdsp), spec(recv.host.reshape(-1).view(np.uint8), rcnt, rdsp))
        recv.commit()

    def barrier(self) -> None:
        self.comm.Barrier()

    def free(self) -> None:
        pass
