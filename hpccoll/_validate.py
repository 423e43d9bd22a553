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
    """A validated collective call: `send` may equal `recv` (in place).  Alltoallv carries its
    per-rank element counts and displacements (`sendv`, `recvv`: (counts, displs) tuples)."""

    name: str
    send: Buf
    recv: Buf
    op: Op | None
    root: int | None
    in_place: bool
    sendv: tuple | None = None
    recvv: tuple | None = None


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
    if name == "Alltoallv":
        return _prepare_alltoallv(size, sendbuf, recvbuf)
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
    elif name == "Alltoall":
        if recv.count % size:
            what = "recvbuf (IN_PLACE: it holds the input)" if in_place else "recvbuf"
            raise ValueError(f"Alltoall: {what} has {recv.count} elements, not a multiple of size={size} "
                             f"(block j, 1/size of the elements, goes to rank j): pad it to "
                             f"{-(-recv.count // size) * size} elements")
        if not in_place and send.count != recv.count:
            raise ValueError(f"Alltoall: recvbuf has {recv.count} elements, sendbuf {send.count}: "
                             "they must have the same size (size blocks of equal count)")
    else:  # pragma: no cover - internal misuse
        raise AssertionError(name)
    return Call(name, send, recv, rop, None, in_place)


def _prepare_alltoallv(size: int, sendbuf, recvbuf) -> Call:
    """Alltoallv(sendbuf, recvbuf), each mpi4py's buffer spec (array, counts) or (array, counts,
    displs): element counts and displacements per rank (displs default to the exclusive prefix
    sum of counts).  Received blocks must not overlap; sent blocks may."""
    if is_in_place(sendbuf):
        raise ValueError("Alltoallv: IN_PLACE is not supported: pass sendbuf as (array, counts[, displs])")
    send, sendv = _vspec("sendbuf", sendbuf, size, writable=False)
    recv, recvv = _vspec("recvbuf", recvbuf, size, writable=True)
    _same_dtype("Alltoallv", send, recv, "sendbuf's array", "recvbuf's array")
    _same_place("Alltoallv", send, recv, "sendbuf's array", "recvbuf's array")
    blocks = sorted((d, d + c, j) for j, (c, d) in enumerate(zip(*recvv)) if c)
    for (_, end, i), (start, _, j) in zip(blocks, blocks[1:]):
        if start < end:
            raise ValueError(f"Alltoallv: recvbuf's blocks from ranks {i} and {j} overlap (elements "
                             f"{start}..{end - 1}): give each source its own range of displacements")
    return Call("Alltoallv", send, recv, None, None, False, sendv, recvv)


def _vspec(argname: str, spec, size: int, *, writable: bool):
    """(Buf, (counts, displs)) of one Alltoallv buffer spec, or an error naming the argument."""
    fn = "Alltoallv"
    if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3):
        raise TypeError(f"{fn}: {argname} must be (array, counts) or (array, counts, displs) as in mpi4py, "
                        f"not {type(spec).__name__}")
    buf = as_buf(spec[0], f"{argname}'s array", fn, writable=writable)
    counts = _ints(spec[1], f"{argname}'s counts", size)
    if len(spec) == 3 and spec[2] is not None:
        displs = _ints(spec[2], f"{argname}'s displs", size)
    else:
        displs, at = [], 0
        for c in counts:
            displs.append(at)
            at += c
    for j, (c, d) in enumerate(zip(counts, displs)):
        if d + c > buf.count:
            raise ValueError(f"{fn}: {argname}'s block for rank {j} (displacement {d}, count {c}) ends at element "
                             f"{d + c}, past the array's {buf.count}: use displs[j] + counts[j] <= {buf.count}")
    return buf, (tuple(counts), tuple(displs))


def _ints(values, what: str, size: int) -> list[int]:
    """A list of `size` non-negative ints (numpy integers too), or an error naming `what`."""
    fn = "Alltoallv"
    try:
        out = list(values)
    except TypeError:
        raise TypeError(f"{fn}: {what} must be a sequence of {size} ints, not {type(values).__name__}") from None
    if len(out) != size:
        raise ValueError(f"{fn}: {what} has {len(out)} entries: give one per rank ({size})")
    for j, v in enumerate(out):
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise TypeError(f"{fn}: {what}[{j}] = {v!r} is not an integer: pass element counts as ints")
        if v.__index__() < 0:
            raise ValueError(f"{fn}: {what}[{j}] = {v} is negative: counts and displacements are >= 0")
    return [v.__index__() for v in out]


def block_count(call: Call, size: int) -> int:
    """Elements per rank of Allgather / Reduce_scatter_block (the signature's count)."""
    if call.name == "Allgather":
        return call.recv.count // size
    if call.name == "Reduce_scatter_block":
        return call.recv.count // size if call.in_place else call.recv.count
    if call.name == "Alltoall":
        return call.recv.count // size
    if call.name == "Alltoallv":
        return None  # per-rank counts differ: check_agreement matches them pairwise
    return call.recv.count


_FIELDS = ("collective", "count", "dtype", "op", "root")


def check_agreement(mpi_comm, call: Call) -> None:
    """Check mode: every rank compares every rank's signature; raise on all ranks if any differ."""
    sig = (call.name, block_count(call, mpi_comm.Get_size()), call.recv.dtype,
           call.op.name if call.op else None, call.root)
    sigs = mpi_comm.allgather(sig)
    if call.name == "Alltoallv" and all(s == sigs[0] for s in sigs):
        _check_alltoallv_counts(mpi_comm, call)
    if all(s == sigs[0] for s in sigs):
        return
    for i, field in enumerate(_FIELDS):
        vals = [s[i] for s in sigs]
        if any(v != vals[0] for v in vals):
            per_rank = ", ".join(f"rank {r} has {v}" for r, v in enumerate(vals))
            raise MismatchError(f"{sigs[mpi_comm.Get_rank()][0]}: ranks disagree on {field}: {per_rank}")


def _check_alltoallv_counts(mpi_comm, call: Call) -> None:
    """Check mode for Alltoallv: what rank i sends to rank j is what rank j expects from rank i,
    for every pair (raised on every rank)."""
    sends = mpi_comm.allgather(call.sendv[0])
    recvs = mpi_comm.allgather(call.recvv[0])
    bad = [(i, j) for i in range(len(sends)) for j in range(len(sends)) if sends[i][j] != recvs[j][i]]
    if bad:
        i, j = bad[0]
        raise MismatchError(f"Alltoallv: rank {i} sends {sends[i][j]} elements to rank {j}, which expects "
                            f"{recvs[j][i]} from it ({len(bad)} pair(s) disagree): make sendcounts[j] on rank i "
                            "equal recvcounts[i] on rank j")
