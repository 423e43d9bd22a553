"""How each collective becomes kernel launches on one communicator's `Site` (its kernels,
workspace layout, rank and size): the region it uses, its grid, chunking for messages larger
than a region, and staging through aligned temporaries for buffers that are not 16-byte
aligned.  The algorithm comes resolved (the call's route, policy.py); nothing here chooses one,
and nothing here calls back into the backend (backend.py calls these functions)."""
from __future__ import annotations

from dataclasses import dataclass

from ..._abi import PACK
from ..._validate import Call
from .kernels import OPS, Kernels, aligned, aligned_copy, copy_to, packs_of, through_aligned_copy
from .workspace import S_LL, S_LLB, S_TWOSHOT, Layout


@dataclass(frozen=True)
class Site:
    """What a launch needs of its communicator (fixed once the backend is open)."""

    kernels: Kernels
    layout: Layout
    rank: int
    size: int


def allreduce_grid(t, algo: str, count: int, esize: int) -> tuple[int, int]:
    if algo == "twoshot_ll128":  # an 8-lane group per 128-byte line of the owner's share
        lines = (count + 128 // esize - 2) // (128 // esize - 1)
        return t.kernels.grid((lines + t.size - 1) // t.size, 8)
    npacks = packs_of(count * esize)  # a thread per pack (two-shot: of the owner's share)
    return t.kernels.grid(npacks if algo.startswith("oneshot") else (npacks + t.size - 1) // t.size)


def allreduce_launcher(t, dtype: str, algo: str, op: str, loop: bool = False):
    """The kernel of (algo, op) for dtype, and the payload bytes one launch can carry."""
    cap, region, region2 = t.layout.allreduce[algo]
    return t.kernels.launcher(dtype, f"hc_allreduce_{algo}_{OPS[op]}", region, region2, loop), cap


def allreduce(t, call: Call, algo: str, op: str, s: int, iters: int) -> None:
    send, recv = call.send.flat, call.recv.flat
    if not (aligned(send) and aligned(recv)):
        dtype = call.recv.dtype
        through_aligned_copy(send, recv, s, lambda tmp: _allreduce_aligned(t, tmp, tmp, dtype, algo, op, s, iters))
        return
    _allreduce_aligned(t, send, recv, call.recv.dtype, algo, op, s, iters)


def _allreduce_aligned(t, send, recv, dtype, algo, op, s, iters) -> None:
    esize = send.itemsize
    n = send.size
    lau, cap = allreduce_launcher(t, dtype, algo, op, iters > 1)
    step = cap // esize
    a = lau.args
    a.iters = iters
    for c0 in range(0, max(n, 1), step):
        c = min(step, n - c0)
        a.in_ = send.data.ptr + c0 * esize
        a.out = recv.data.ptr + c0 * esize
        a.count = c
        lau(*allreduce_grid(t, algo, c, esize), s)


def bcast_launcher(t, dtype: str, loop: bool = False):
    return t.kernels.launcher(dtype, "hc_bcast_ll", (t.layout.llb, t.layout.sub_llb), loop=loop)


def bcast_grid(t, nbytes: int) -> tuple[int, int]:
    """Bcast's grid: a thread per pack of one chunk (the kernel walks the chunks)."""
    return t.kernels.grid(packs_of(min(nbytes, S_LLB)))


def bcast(t, call: Call, algo: str, op, s: int, iters: int) -> None:
    buf = call.recv.flat
    if not aligned(buf):
        through_aligned_copy(buf, buf, s, lambda tmp: _bcast_flat(t, tmp, call, s, iters))
        return
    _bcast_flat(t, buf, call, s, iters)


def _bcast_flat(t, buf, call, s, iters):
    """One launch whatever the size: the kernel walks the chunks of S_LLB bytes itself."""
    lau = bcast_launcher(t, call.recv.dtype, iters > 1)
    a = lau.args
    a.root, a.iters = call.root, iters
    a.in_ = a.out = buf.data.ptr
    a.count = buf.size
    lau(*bcast_grid(t, buf.size * buf.itemsize), s)


def blockwise(t, call: Call, kernel: str, region, cap_bytes: int, s: int, iters: int, mode: str) -> None:
    """Allgather / Reduce_scatter_block / Alltoall: per-rank blocks of `count` elements; direct
    when the blocks are whole packs and fit (Allgather and Alltoall walk their chunks inside one
    launch, Reduce_scatter takes one launch per cap_bytes), else staged through padded
    [nranks, chunk] buffers.  The choice reads only values every rank shares (a rank whose
    buffers are not 16-byte aligned runs the direct launch on aligned copies): a rank taking
    the other path would run other launches than its peers."""
    import cupy

    n = t.size
    esize = call.recv.flat.itemsize
    epp = PACK // esize
    out = call.recv.flat
    if mode == "gather":
        count = call.recv.count // n
        src = (call.recv.flat[t.rank * count:(t.rank + 1) * count] if call.in_place else call.send.flat)
    elif mode == "scatter":
        count = call.recv.count // n if call.in_place else call.recv.count
        src = call.recv.flat if call.in_place else call.send.flat
    else:  # alltoall
        count = call.recv.count // n
        if call.in_place:
            with cupy.cuda.ExternalStream(s):
                src = out.copy()
        else:
            src = call.send.flat
    lau = t.kernels.launcher(call.recv.dtype, kernel, region, loop=iters > 1)
    a = lau.args
    a.iters = iters
    fits = mode != "scatter" or count * esize <= cap_bytes
    if count % epp == 0 and fits:  # (values every rank shares: every rank takes this path)
        dst = out[:count] if mode == "scatter" else out  # what the launch writes (in place: the first block)
        tsrc = src if aligned(src) else aligned_copy(src, s)  # (this rank's buffers only)
        tout = dst if aligned(dst) else aligned_copy(dst, s, fill=False)
        a.in_, a.out, a.count = tsrc.data.ptr, tout.data.ptr, count
        lau(*t.kernels.grid(min(count, cap_bytes // esize) // epp), s)
        if tout is not dst:
            copy_to(dst, tout, s)
        return
    step = max(epp, cap_bytes // esize // epp * epp)
    dtype = out.dtype
    with cupy.cuda.ExternalStream(s):
        for c0 in range(0, max(count, 1), step):
            c = min(step, count - c0)
            cp = (c + epp - 1) // epp * epp
            if mode == "gather":
                tin = cupy.zeros(cp, dtype=dtype)
                tin[:c] = src[c0:c0 + c]
                tout = cupy.empty((n, cp), dtype=dtype)
            else:
                tin = cupy.zeros((n, cp), dtype=dtype)
                tin[:, :c] = src.reshape(n, -1)[:, c0:c0 + c]
                tout = cupy.empty((n, cp) if mode == "alltoall" else cp, dtype=dtype)
            a.in_, a.out, a.count = tin.data.ptr, tout.data.ptr, cp
            lau(*t.kernels.grid(cp // epp), s)
            if mode == "scatter":
                out[c0:c0 + c] = tout[:c]
            else:
                out.reshape(n, count)[:, c0:c0 + c] = tout[:, :c]


def allgather(t, call: Call, algo: str, op, s: int, iters: int) -> None:
    L = t.layout
    blockwise(t, call, "hc_allgather_ll", (L.ll, L.sub_ll), S_LL, s, iters, "gather")


def reduce_scatter_block(t, call: Call, algo: str, op, s: int, iters: int) -> None:
    L = t.layout
    if algo == "sentinel":
        region, cap = (L.ts1, L.sub_twoshot), S_TWOSHOT // t.size
    else:
        region, cap = (L.ll, L.sub_ll), S_LL
    blockwise(t, call, f"hc_reduce_scatter_{algo}_{OPS[op]}", region, cap, s, iters, "scatter")


def alltoall(t, call: Call, algo: str, op, s: int, iters: int) -> None:
    L = t.layout
    blockwise(t, call, "hc_alltoall_ll", (L.ll2, L.sub_ll), S_LL, s, iters, "alltoall")


def barrier(t, s: int, iters: int = 1) -> None:
    lau = t.kernels.launcher("float32", "hc_barrier", (0, 0), loop=iters > 1)
    lau.args.iters = iters
    lau(1, 32, s)


RUN = {"Allreduce": allreduce, "Bcast": bcast, "Allgather": allgather,
       "Reduce_scatter_block": reduce_scatter_block, "Alltoall": alltoall}

__all__ = ["Site", "RUN", "allreduce_launcher", "allreduce_grid", "bcast_launcher", "bcast_grid", "barrier"]
