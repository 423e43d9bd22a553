"""Groups (Communicator.group): consecutive Allreduce calls that can share one one-shot launch
run as one, their buffers laid end to end (cuda/hc_abi.h's Group): one epoch and one round
trip for all of them, and for each call the very bits it gives alone.  Which calls may share a
launch and with which algorithm is policy.py's decision; this module finds the runs."""
from __future__ import annotations

from ... import policy
from ..._abi import GROUP_MAX, PACK, Args, Group
from ...errors import MismatchError
from .driver import Launcher
from .kernels import OPS, aligned, aligned_copy, copy_to, packs
from .launch import allreduce_launcher
from ..base import ranks_differ
from ..streams import stream_ptr


def run_group(b, items, check: bool = False) -> None:
    """A group's calls, in order: every run of consecutive Allreduce calls that can share a
    launch as one launch, any other call as usual.  items: (call, route, stream) tuples.  check: first compare the launches with every rank's (MismatchError on
    every rank where they differ, and nothing issued)."""
    runs = []  # (i, j, algorithm or None)
    i = 0
    while i < len(items):
        j, algo = _run_at(b, items, i)
        runs.append((i, j, algo))
        i = j
    if check:
        differ = ranks_differ(b.comm, [(j - i, algo) for i, j, algo in runs])
        if differ:
            raise MismatchError(f"group: ranks would issue different launches (calls per launch, one-shot): "
                                f"{differ}: the calls' buffers overlap each other's outputs, or share a "
                                "stream, on some ranks only; make them alike on every rank")
    for i, j, algo in runs:
        if algo is None:
            b.run(*items[i])
        else:
            _launch(b, items[i:j], algo)


def _groupable(b, call, algorithm: str) -> bool:
    """(Not the buffers' alignment, which is each rank's own: a rank launching its calls one by
    one would never meet its peers' group launch.  _launch stages unaligned buffers.)"""
    return policy.groupable(call.name, algorithm) and call.recv.count > 0 and call.recv.device == b.device_id


def _run_at(b, items, i: int) -> tuple[int, str | None]:
    """(j, algorithm): items[i:j] share one launch, or (i + 1, None).  They share it when they are
    groupable calls with the same dtype, op, policy, algorithm argument and stream, at most
    GROUP_MAX, independent (no call's recvbuf overlaps another call's sendbuf or recvbuf), and
    policy.group_algorithm gives a one-shot for their total bytes."""
    call, route, stream = items[i]
    det, algorithm = route.deterministic, route.requested
    if not _groupable(b, call, algorithm):
        return i + 1, None
    key = (call.recv.dtype, call.op.name, det, algorithm, stream_ptr(stream))
    spans: list[tuple[int, int, bool]] = []  # (lo, hi, written) of the run's buffers
    sizes: list[int] = []  # bytes each call takes in the launch (whole packs)
    total = 0
    cap = lambda algo: b.layout.allreduce[algo][0]  # noqa: E731
    limit = policy.group_bytes(cap)
    for c, r, st in items[i:i + GROUP_MAX]:
        if sizes and not (_groupable(b, c, r.requested) and
                          (c.recv.dtype, c.op.name, r.deterministic, r.requested, stream_ptr(st)) == key):
            break
        nbytes = packs(c.recv.flat) * PACK
        if total + nbytes > limit:
            break
        out = (c.recv.flat.data.ptr, c.recv.flat.data.ptr + c.recv.flat.nbytes)
        inp = (c.send.flat.data.ptr, c.send.flat.data.ptr + c.send.flat.nbytes)
        if any(lo < out[1] and out[0] < hi for lo, hi, _ in spans) or \
                any(w and lo < inp[1] and inp[0] < hi for lo, hi, w in spans):
            break  # not independent of the calls before it
        spans += [(*out, True), (*inp, False)]
        sizes.append(nbytes)
        total += nbytes
    k, algo = policy.group_share(sizes, lambda total: b.resolve("Allreduce", call.recv.dtype, call.op.name, total,
                                                                det, algorithm), cap)
    return i + k, algo


def _launch(b, calls, algo: str) -> None:
    """One launch of hc_allreduce_<algo>_<op>_group over these calls (_run_at's run)."""
    call, _route, stream = calls[0]
    b.check_error()
    s = stream_ptr(stream)
    dtype, op = call.recv.dtype, call.op.name
    base, _cap = allreduce_launcher(b.site, dtype, algo, op)
    a = Args.from_buffer_copy(base.args)
    a.in_ = a.out = None
    a.count, a.iters = 0, 1
    g = Group(n=len(calls))
    npacks = 0
    staged = []  # (user recvbuf, aligned copy): buffers not 16-byte aligned
    for j, (c, *_rest) in enumerate(calls):
        send, recv = c.send.flat, c.recv.flat
        if not (aligned(send) and aligned(recv)):
            send = recv = aligned_copy(send, s)
            staged.append((c.recv.flat, recv))
        g.start[j], g.in_[j], g.out[j], g.count[j] = npacks, send.data.ptr, recv.data.ptr, c.recv.count
        npacks += packs(c.recv.flat)
    g.start[len(calls)] = npacks
    fn = b.kernels.module(dtype).fn(f"hc_allreduce_{algo}_{OPS[op]}_group")
    Launcher(fn, a, pdl=b.kernels.pdl, extra=g)(*b.kernels.grid(npacks), s)
    b.engines.note_launch(s)
    for user, tmp in staged:
        copy_to(user, tmp, s)
