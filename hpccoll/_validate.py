"""Argument validation for every collective, in one place.

`prepare(...)` turns the user's arguments into a `Call` or raises TypeError/ValueError
naming the argument and the fix, before any communication.  In check mode the
call's signature is compared across ranks first, so a mismatch raises the same
MismatchError on every rank instead of hanging or computing garbage."""
from __future__ import annotations

from dataclasses import dataclass

from ._buffers import Buf, as_buf, is_in_place
from .errors import MismatchError
from .ops import Op, as_op


@dataclass
class Call:
    """A validated collective call: `send` may equal `recv` (in place)."""

    name: str
    send: Buf
    recv: Buf
    op: Op | None
    root: int | None
    in_place: bool


def _same_dtype(fn, a: Buf, b: Buf, an="sendbuf", bn="recvbuf"):
    if a.dtype != b.dtype:
        raise TypeError(f"{fn}: {an} is {a.dtype} but {bn} is {b.dtype}: use the same dtype for both")


def _same_place(fn, a: Buf, b: Buf, an="sendbuf", bn="recvbuf"):
    if a.device != b.device:
        where = lambda d: "host memory" if d is None else f"GPU {d}"  # noqa: E731
        raise ValueError(f"{fn}: {an} is in {where(a.device)} but {bn} in {where(b.device)}: "
                         "put both on the same device")


def prepare(name: str, size: int, sendbuf=None, recvbuf=None, *, op=None, root=None) -> Call:
    fn = name
    if name == "Bcast":
        buf = as_buf(recvbuf, "buf", fn, writable=True)
        if isinstance(root, bool) or not hasattr(root, "__index__") or not 0 <= root.__index__() < size:
            raise ValueError(f"Bcast: root={root!r} is not a rank of this communicator: use 0 <= root < {size}")
        return Call(name, buf, buf, None, root.__index__(), True)  # numpy integers too, as in mpi4py

    rop = as_op(op) if name in ("Allreduce", "Reduce_scatter_block") else None  # op=None raises
    recv = as_buf(recvbuf, "recvbuf", fn, writable=True)
    in_place = is_in_place(sendbuf)
    send = recv if in_place else as_buf(sendbuf, "sendbuf", fn, writable=False)
    if not in_place:
        _same_dtype(fn, send, recv)
        _same_place(fn, send, recv)
    if name == "Allreduce":
        if send.count != recv.count:
            raise ValueError(f"Allreduce: recvbuf has {recv.count} elements, sendbuf {send.count}: "
                             "they must have the same size")
    elif name == "Reduce_scatter_block":
        n_in = recv.count if in_place else send.count
        expect = recv.count * size if not in_place else None
        if in_place:
            if recv.count % size:
                raise ValueError(f"Reduce_scatter_block: with IN_PLACE recvbuf holds the input and needs "
                                 f"a multiple of size={size} elements, it has {recv.count}")
        elif n_in != expect:
            raise ValueError(f"Reduce_scatter_block: sendbuf has {n_in} elements, recvbuf {recv.count}: "
                             f"sendbuf needs size*recvcount = {size}*{recv.count} = {expect}")
    elif name == "Allgather":
        if in_place:
            if recv.count % size:
                raise ValueError(f"Allgather: recvbuf has {recv.count} elements, not a multiple of size={size}")
        elif recv.count != send.count * size:
            raise ValueError(f"Allgather: recvbuf has {recv.count} elements, sendbuf {send.count}: "
                             f"recvbuf needs size*sendcount = {size}*{send.count} = {send.count * size}")
    else:  # pragma: no cover - internal misuse
        raise AssertionError(name)
    return Call(name, send, recv, rop, None, in_place)


def block_count(call: Call, size: int) -> int:
    """Elements per rank of Allgather / Reduce_scatter_block (the signature's count)."""
    if call.name == "Allgather":
        return call.recv.count // size
    if call.name == "Reduce_scatter_block":
        return call.recv.count // size if call.in_place else call.recv.count
    return call.recv.count


_FIELDS = ("collective", "count", "dtype", "op", "root")


def check_agreement(mpi_comm, call: Call) -> None:
    """Check mode: every rank compares every rank's signature; raise on all ranks if any differ."""
    sig = (call.name, block_count(call, mpi_comm.Get_size()), call.recv.dtype,
           call.op.name if call.op else None, call.root)
    sigs = mpi_comm.allgather(sig)
    if all(s == sigs[0] for s in sigs):
        return
    for i, field in enumerate(_FIELDS):
        vals = [s[i] for s in sigs]
        if any(v != vals[0] for v in vals):
            per_rank = ", ".join(f"rank {r} has {v}" for r, v in enumerate(vals))
            raise MismatchError(f"{sigs[mpi_comm.Get_rank()][0]}: ranks disagree on {field}: {per_rank}")
