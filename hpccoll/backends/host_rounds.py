"""The host backend's nonblocking MPI calls: in rounds over staging the library owns.

A collective above the shared-memory limit runs as rounds, each over a slice of the data: the
slice of the input copied into staging, one nonblocking MPI call on the staging completed
against the deadline (HostBackend._complete), the result slice copied out.  A round that times
out keeps its request and staging alive (`_ABANDONED`), so MPI never writes into freed memory
nor into the caller's buffers; a late peer pairs with that round's original input, then waits
for a next round never posted and raises.  Staging is at most STAGE_BYTES per side, whatever
the message's size.  The Allreduce's MPI paths (`AllreducePlan`) are built here, once per call
or once per repeated call."""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .._abi import CANONICAL_NAN
from ..ops import _INT, MAX, MIN, PROD, SUM, fp_quiet, fp_restore

_MPI_OPS = {SUM: MPI.SUM, PROD: MPI.PROD, MAX: MPI.MAX, MIN: MPI.MIN}
_MPI_TYPED = {"float64", "float32", "int32", "int64"}
_FLOATS = {"float64", "float32", "float16", "bfloat16"}
# MPI counts are C ints: a message of more bytes than this goes in units of a contiguous
# datatype (Allgather, Alltoall) or in pieces (Bcast).  Tests lower it.
MAX_COUNT = 2**31 - 1
_UNITS: dict = {}   # bytes per unit -> committed contiguous MPI datatype
#: (request, memory it reads and writes) of every MPI call abandoned by a timeout whose peers
#: have not completed it yet: MPI cannot cancel a collective, and a late peer completes it
_ABANDONED: list = []
#: What one round of a collective stages, per side (input, result): the slice of an elementwise
#: call (Allreduce, Bcast), and the share of the P blocks of a per-rank-block call (Allgather,
#: Reduce_scatter_block, Alltoall, Alltoallv, the rank-order Allreduce), whose slice per block is
#: STAGE_BYTES / P but never under MIN_BLOCK_SLICE_BYTES (a round's latency grows with P).
STAGE_BYTES = 1 << 20
MIN_BLOCK_SLICE_BYTES = 16 << 10


def _unit(nbytes: int):
    t = _UNITS.get(nbytes)
    if t is None:
        t = _UNITS[nbytes] = MPI.BYTE.Create_contiguous(nbytes).Commit()
    return t


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
    return [u8, _unit(unit)]


def _bytes(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


class AllreducePlan:
    """The MPI paths of an Allreduce (HostBackend._allreduce_path: "minmax", "mpi", "rank_order")
    for one call's buffers `x` and `out`, with everything decided once and the staging allocated
    once: a one-off call builds one and launches it, a repeated call keeps it.  A launch runs in
    rounds, each over a slice of the elements: the slice of the input copied into staging, one
    nonblocking MPI call on the staging, the result slice written to `out`.  A slice is
    STAGE_BYTES ("mpi", "minmax": the keys, their scratch and the NaN masks are slice-sized) or
    `_block_slice` per rank ("rank_order": P slices gathered, reduced in rank order).  Every
    operation is elementwise, so the results are those of one unsliced call bit for bit, and
    follow hpccoll.ops (tests/mpi/test_robustness.py compares every repeat with the reference)."""

    __slots__ = ("launch",)

    def __init__(self, b, path: str, x, out, in_place: bool, dtype: str, op):
        comm, complete, n, P = b.comm, b._complete, out.size, b.size
        if path == "rank_order":
            s = _block_slice(P, out.itemsize, n)
        else:
            s = max(1, min(STAGE_BYTES // out.itemsize, n))
        is_float = dtype in _FLOATS
        if is_float:
            canon = CANONICAL_NAN[dtype]
            ints = _INT[out.itemsize]
            bits_in, bits_out = x.view(ints), out.view(ints)
            nan_s = np.empty(s, dtype=bool)
            mag_s = np.empty(s if dtype == "bfloat16" or path == "minmax" else 0, dtype=ints)  # find_nans'
            width = 8 * out.itemsize
            low = ints((1 << (width - 1)) - 1)  # every bit but the sign
            inf = ints(np.array(np.inf, dtype=out.dtype).view(ints))  # NaN: magnitude bits above inf's
            canon_signed = _as_signed(canon, ints)

            def find_nans(bits, k):  # on the bits: bfloat16 too, and no floating-point warnings
                np.bitwise_and(bits, low, out=mag_s[:k])
                return np.greater(mag_s[:k], inf, out=nan_s[:k])

            def canonicalize(lo, k):  # out[lo:lo + k]'s NaNs made canonical
                if dtype == "bfloat16":
                    nan = find_nans(bits_out[lo:lo + k], k)
                else:  # (isnan: one call, and no warnings)
                    nan = np.isnan(out[lo:lo + k], out=nan_s[:k])
                if np.count_nonzero(nan):
                    np.copyto(bits_out[lo:lo + k], canon_signed, where=nan)

        if path == "minmax":
            mop = MPI.MAX if op is MAX else MPI.MIN
            keys, neg = np.empty(s, dtype=ints), np.empty(s, dtype=bool)
            extreme = ints(np.iinfo(ints).max if op is MAX else np.iinfo(ints).min)

            def launch(stream=None):
                if b.broken:
                    b._check("Allreduce")
                for lo, k in _spans(n, s):
                    key, ng, nan = keys[:k], neg[:k], nan_s[:k]
                    np.copyto(key, bits_in[lo:lo + k])  # ordered_keys: negatives flipped below the positives
                    np.bitwise_xor(key, low, out=key, where=np.less(key, 0, out=ng))
                    np.copyto(key, extreme, where=find_nans(bits_in[lo:lo + k], k))
                    complete(comm.Iallreduce(MPI.IN_PLACE, key, op=mop), "Allreduce", keys)
                    np.equal(key, extreme, out=nan)
                    np.bitwise_xor(key, low, out=key, where=np.less(key, 0, out=ng))
                    np.copyto(key, canon_signed, where=nan)
                    np.copyto(bits_out[lo:lo + k], key)
        elif path == "mpi":
            mop = _MPI_OPS[op]
            staged = np.empty(s, dtype=x.dtype)  # the input; in place also the result
            result = staged if in_place else np.empty(s, dtype=out.dtype)

            def launch(stream=None):
                if b.broken:
                    b._check("Allreduce")
                for lo, k in _spans(n, s):
                    np.copyto(staged[:k], x[lo:lo + k])
                    src = MPI.IN_PLACE if in_place else staged[:k]
                    complete(comm.Iallreduce(src, result[:k], op=mop), "Allreduce", staged, result)
                    np.copyto(out[lo:lo + k], result[:k])
                    if is_float:
                        canonicalize(lo, k)
        else:  # in rank order: ((x0 op x1) op x2) ..., as ops.reduce_in_rank_order
            mine, gathered = np.empty(s, dtype=x.dtype), np.empty(P * s, dtype=x.dtype)
            ufunc = np.add if op is SUM else np.multiply if op is PROD else None
            if ufunc is None:  # integer MAX / MIN
                ufunc = np.maximum if op is MAX else np.minimum

            def launch(stream=None):
                if b.broken:
                    b._check("Allreduce")
                for lo, k in _spans(n, s):
                    rows = gathered[:P * k].reshape(P, k)
                    np.copyto(mine[:k], x[lo:lo + k])
                    complete(comm.Iallgather(_msg(_bytes(mine[:k])), _msg(_bytes(rows), P)), "Allreduce",
                             mine, gathered)
                    res = out[lo:lo + k]  # = row 0 op row 1, then op each further row in rank order
                    token = fp_quiet()
                    try:
                        if P == 1:
                            np.copyto(res, rows[0])
                        else:
                            ufunc(rows[0], rows[1], out=res)
                        for row in rows[2:]:
                            ufunc(res, row, out=res)
                    finally:
                        fp_restore(token)
                    if is_float:
                        canonicalize(lo, k)
        self.launch = launch


def _abandon(req, memory) -> None:
    """Keep a request a timeout abandoned, and the memory it reads and writes, until a late peer
    completes it (for the life of the process if none does); drop those completed since."""
    _ABANDONED[:] = [kept for kept in _ABANDONED if not kept[0].Test()]
    _ABANDONED.append((req, memory))


def _spans(n: int, s: int):
    """(start, length) of the slices of s elements covering n: a call's rounds (one empty round
    for n = 0, so that every call is one MPI call at least, as unsliced)."""
    if n == 0:
        yield 0, 0
    for lo in range(0, n, max(s, 1)):
        yield lo, min(s, n - lo)


def _block_slice(size: int, itemsize: int, longest: int | None = None) -> int:
    """Elements of each block a round of a per-rank-block call carries: STAGE_BYTES / size, but
    at least MIN_BLOCK_SLICE_BYTES and one element (and at most `longest`, the block, where
    every rank has the same)."""
    s = max(1, max(STAGE_BYTES // size, MIN_BLOCK_SLICE_BYTES) // itemsize)
    return s if longest is None else max(1, min(s, longest))


class _Requests:
    """Several requests as one: Test() is true once every one has completed."""

    __slots__ = ("reqs",)

    def __init__(self, reqs):
        self.reqs = reqs

    def Test(self) -> bool:  # noqa: N802 (mpi4py's name)
        return MPI.Request.Testall(self.reqs)


def _as_signed(bits: int, ints) -> np.generic:
    """An unsigned bit pattern as the signed integer of the same width."""
    return np.array(bits, dtype=np.dtype(ints).str.replace("i", "u")).view(ints)[()]
