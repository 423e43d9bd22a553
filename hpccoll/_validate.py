"""Argument validation for every collective, in one place.

`prepare(...)` turns the user's arguments into a `Call` or raises TypeError/ValueError
naming the call, the argument and the fix, before any communication.

Check mode (`Communicator(check=True)`, HPCCOLL_CHECK=1) adds one exchange before each call,
`agree(...)`: every rank shares the outcome of its own validation (the call's signature, or
the error it raised), so an error on any rank becomes an error on every rank (the failing rank
re-raises its own; the others raise MismatchError naming it), and signatures that differ
(collective, count, dtype, op, root, algorithm, deterministic, whether it is queued in a group,
the backend that runs it (host or device buffers), Alltoallv's counts) raise
MismatchError on every rank.  Calls without buffers (Barrier, Dup, Split, Free, a persistent
request's init) exchange their name (`plain_signature`), so one rank's Barrier never pairs with
another's Allreduce.  Every check-mode call makes exactly one exchange, whatever its validation
raised: the ranks' exchanges stay paired.  Without check mode a call whose arguments differ
between ranks is erroneous, as in MPI: it may hang until the timeout or give wrong values."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._buffers import Buf, as_buf, is_in_place, is_mpi_datatype
from .errors import MismatchError
from .ops import Op, as_op

INDEXLIKE = "__index__"


@dataclass(frozen=True)
class VSpec:
    """Alltoallv's element counts and displacements, per rank."""

    send_counts: tuple
    send_displs: tuple
    recv_counts: tuple
    recv_displs: tuple


@dataclass
class Call:
    """A validated collective call: `send` may equal `recv` (in place)."""

    name: str
    send: Buf
    recv: Buf
    op: Op | None
    root: int | None
    in_place: bool
    v: VSpec | None = None


def _same_dtype(fn, a: Buf, b: Buf, an="sendbuf", bn="recvbuf"):
    if a.dtype != b.dtype:
        raise TypeError(f"{fn}: {an} is {a.dtype} but {bn} is {b.dtype}: use the same dtype for both")


def _same_place(fn, a: Buf, b: Buf, an="sendbuf", bn="recvbuf"):
    if a.device != b.device:
        where = lambda d: "host memory" if d is None else f"GPU {d}"  # noqa: E731
        raise ValueError(f"{fn}: {an} is in {where(a.device)} but {bn} in {where(b.device)}: "
                         "put both on the same device")


def _same_order(fn, a: Buf, b: Buf):
    """Elements are matched in memory order: a C-ordered and an F-ordered array would silently
    pair transposed elements."""
    if "A" not in (a.order, b.order) and a.order != b.order:
        fix = "np.asfortranarray" if b.order == "F" else "np.ascontiguousarray"  # sendbuf to recvbuf's order
        raise ValueError(f"{fn}: sendbuf is {a.order}-ordered {tuple(a.array.shape)} but recvbuf is "
                         f"{b.order}-ordered {tuple(b.array.shape)}: collectives pair elements in memory "
                         f"order, so this would transpose them; pass both in one order (e.g. {fix}(sendbuf))")


def _disjoint(fn, a: Buf, b: Buf):
    if a.overlaps(b):
        raise ValueError(f"{fn}: sendbuf and recvbuf overlap in memory: pass hpccoll.IN_PLACE as sendbuf "
                         "to work in place, or separate buffers")


def _is_integer(value) -> bool:
    """Python's or numpy's integers (anything with __index__, as in mpi4py), not a bool."""
    return not isinstance(value, bool) and hasattr(value, INDEXLIKE)


def integer(fn: str, argname: str, value) -> int:
    """An integer argument, or a TypeError naming it."""
    if not _is_integer(value):
        raise TypeError(f"{fn}: {argname}={value!r} must be an integer")
    return value.__index__()


def _root(fn, root, size: int) -> int:
    if not _is_integer(root) or not 0 <= root.__index__() < size:
        raise ValueError(f"{fn}: root={root!r} is not a rank of this communicator: use 0 <= root < {size}")
    return root.__index__()  # numpy integers too, as in mpi4py


def switch(fn: str, argname: str, value) -> bool:
    """An on/off argument: a bool (or numpy bool, or the integers 0 and 1).  A string is refused:
    bool("false") is True."""
    if value is True or value is False:  # (the common case first: a call's deterministic=)
        return value
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{fn}: {argname}={value!r}: pass True or False")


def prepare(name: str, size: int, sendbuf=None, recvbuf=None, *, op=None, root=None,
            rank: int | None = None) -> Call:
    """`rank`: the calling rank, for checks of its own part (Alltoallv's block to itself)."""
    fn = name
    if name == "Bcast":
        buf = as_buf(recvbuf, "buf", fn, writable=True)
        return Call(name, buf, buf, None, _root(fn, root, size), True)
    if name == "Alltoallv":
        return _prepare_alltoallv(size, sendbuf, recvbuf, rank)

    rop = as_op(op, fn) if name in ("Allreduce", "Reduce_scatter_block") else None  # op=None raises
    recv = as_buf(recvbuf, "recvbuf", fn, writable=True)
    in_place = is_in_place(sendbuf)
    send = recv if in_place else as_buf(sendbuf, "sendbuf", fn, writable=False)
    if not in_place:
        _same_dtype(fn, send, recv)
        _same_place(fn, send, recv)
        _same_order(fn, send, recv)
        _disjoint(fn, send, recv)
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
            raise ValueError(f"Alltoall: recvbuf has {recv.count} elements, not a multiple of size={size} "
                             "(a block from every rank)")
        if not in_place and send.count != recv.count:
            raise ValueError(f"Alltoall: recvbuf has {recv.count} elements, sendbuf {send.count}: they must "
                             f"have the same size ({size} blocks of equal count)")
    else:  # pragma: no cover - internal misuse
        raise AssertionError(name)
    return Call(name, send, recv, rop, None, in_place)


def _vector(fn, argname: str, spec, size: int, writable: bool):
    """(Buf, counts, displs) of an Alltoallv argument, mpi4py's (array, counts) or (array,
    counts, displs); displs default to the running sum of counts."""
    if isinstance(spec, (tuple, list)) and (any(map(is_mpi_datatype, spec)) or _nested(spec)):
        raise TypeError(f"{fn}: {argname} is given in mpi4py's datatype or nested form ([array, counts, "
                        f"MPI.DOUBLE], (array, (counts, displs))), which hpccoll does not take: pass (array, "
                        f"counts) or (array, counts, displs) (the array's dtype gives the datatype)")
    if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3):
        raise TypeError(f"{fn}: {argname} must be (array, counts) or (array, counts, displs) as in "
                        f"mpi4py, not {type(spec).__name__}")
    buf = as_buf(spec[0], f"{argname}'s array", fn, writable=writable)
    counts = _ints(fn, f"{argname}'s counts", spec[1], size)
    if len(spec) == 3 and spec[2] is not None:
        displs = _ints(fn, f"{argname}'s displs", spec[2], size)
    else:
        displs, acc = [], 0
        for c in counts:
            displs.append(acc)
            acc += c
    for r, (c, d) in enumerate(zip(counts, displs)):
        if d + c > buf.count:
            raise ValueError(f"{fn}: {argname}'s block for rank {r} (displacement {d}, count {c}) ends at element "
                             f"{d + c}, past the array's {buf.count}: use displs[j] + counts[j] <= {buf.count}")
    return buf, tuple(counts), tuple(displs)


def _nested(spec) -> bool:
    """mpi4py's (array, (counts, displs)): a pair of sequences where counts go."""
    inner = spec[1] if len(spec) == 2 else None
    return (isinstance(inner, (tuple, list)) and len(inner) == 2
            and all(isinstance(v, (tuple, list)) or getattr(v, "ndim", 0) >= 1 for v in inner))


def _ints(fn, what: str, values, size: int) -> list[int]:
    """`size` non-negative ints (numpy integers too), or an error naming `what`."""
    try:
        vals = list(values)
    except TypeError:
        raise TypeError(f"{fn}: {what} must be a sequence of {size} ints, not {type(values).__name__}") from None
    if len(vals) != size:
        raise ValueError(f"{fn}: {what} has {len(vals)} entries: give one per rank ({size})")
    for j, v in enumerate(vals):
        if not _is_integer(v):
            raise TypeError(f"{fn}: {what}[{j}] = {v!r} is not an integer: pass element counts as ints")
        if v.__index__() < 0:
            raise ValueError(f"{fn}: {what}[{j}] = {v} is negative: counts and displacements are >= 0")
    return [v.__index__() for v in vals]


def _prepare_alltoallv(size: int, sendbuf, recvbuf, rank: int | None) -> Call:
    fn = "Alltoallv"
    if is_in_place(sendbuf):
        raise ValueError("Alltoallv: IN_PLACE is not supported: pass (array, counts[, displs]) as sendbuf")
    send, sc, sd = _vector(fn, "sendbuf", sendbuf, size, writable=False)
    recv, rc, rd = _vector(fn, "recvbuf", recvbuf, size, writable=True)
    _same_dtype(fn, send, recv, "sendbuf's array", "recvbuf's array")
    _same_place(fn, send, recv, "sendbuf's array", "recvbuf's array")
    _disjoint(fn, send, recv)
    if rank is not None and sc[rank] != rc[rank]:
        raise ValueError(f"Alltoallv: rank {rank} sends itself {sc[rank]} elements (sendbuf counts[{rank}]) but "
                         f"expects {rc[rank]} from itself (recvbuf counts[{rank}]): make the two equal")
    blocks = sorted((d, d + c, j) for j, (c, d) in enumerate(zip(rc, rd)) if c)  # sent blocks may overlap
    for (_, end, i), (start, _, j) in zip(blocks, blocks[1:]):
        if start < end:
            raise ValueError(f"Alltoallv: recvbuf's blocks from ranks {i} and {j} overlap (elements {start}.."
                             f"{end - 1}): give each source its own range of displacements")
    return Call(fn, send, recv, None, None, False, VSpec(sc, sd, rc, rd))


def block_count(call: Call, size: int) -> int:
    """Elements per rank of Allgather / Reduce_scatter_block / Alltoall (the signature's count)."""
    if call.name in ("Allgather", "Alltoall"):
        return call.recv.count // size
    if call.name == "Reduce_scatter_block":
        return call.recv.count // size if call.in_place else call.recv.count
    return call.recv.count


_FIELDS = ("collective", "count", "dtype", "op", "root", "algorithm", "deterministic", "group", "backend")
_GROUPED = {True: "queued in comm.group()", False: "issued at once"}


def signature(call: Call, size: int, algorithm: str, deterministic: bool, backend: str,
              grouped: bool = False) -> tuple:
    """What every rank's call must agree on (check mode).  Alltoallv's counts may differ per rank:
    what must match is checked pairwise from its VSpec (agree).  `backend`: the backend that
    runs this rank's call (host buffers on some ranks and device buffers on others send them
    to different backends, whose calls never meet).  `grouped`: queued in `comm.group()` (issued
    at the block's end) on this rank."""
    count = None if call.v is not None else block_count(call, size)
    return (call.name, count, call.recv.dtype, call.op.name if call.op else None,
            call.root, algorithm, bool(deterministic), _GROUPED[grouped], backend)


def plain_signature(name: str) -> tuple:
    """The signature of a call with nothing to compare but its name (Barrier, Dup, Split, Free:
    Split's colors and keys differ between ranks legitimately)."""
    return (name,) + (None,) * (len(_FIELDS) - 1)


def _described(exc: BaseException) -> str:
    """'TypeError: message', even for an exception whose message cannot be formatted."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a user type's __str__ may raise anything
        text = "(its message could not be formatted)"
    return f"{type(exc).__name__}: {text}"


def agree(allgather, rank: int, name: str, outcome, vspec: VSpec | None = None) -> None:
    """Check mode's exchange (collective): `outcome` is this rank's signature, or the exception its
    validation raised; `allgather(obj, name)` gathers one object per rank (the host backend's,
    bounded by the timeout).  Raises on every rank if any rank failed or the signatures differ:
    a failed rank its own exception, the others MismatchError naming it and its error."""
    mine = ("error", _described(outcome)) if isinstance(outcome, BaseException) else ("ok", outcome, vspec)
    everyone = allgather(mine, name)
    failed = [(r, o[1]) for r, o in enumerate(everyone) if o[0] == "error"]
    if failed:
        if isinstance(outcome, BaseException):
            raise outcome
        raise MismatchError(f"{name}: rank {failed[0][0]} failed before the exchange ({failed[0][1]}); no rank "
                            "ran the call" + (f" ({len(failed)} ranks failed)" if len(failed) > 1 else ""))
    sigs = [o[1] for o in everyone]
    for i, field in enumerate(_FIELDS):
        vals = [s[i] for s in sigs]
        if any(v != vals[0] for v in vals):
            per_rank = ", ".join(f"rank {r} has {v}" for r, v in enumerate(vals))
            raise MismatchError(f"{sigs[rank][0]}: ranks disagree on {field}: {per_rank}")
    if vspec is not None:  # what rank i sends to j is what j expects from i
        specs = [o[2] for o in everyone]
        for i, si in enumerate(specs):
            for j, sj in enumerate(specs):
                if si.send_counts[j] != sj.recv_counts[i]:
                    raise MismatchError(f"Alltoallv: rank {i} sends {si.send_counts[j]} elements to rank {j}, "
                                        f"which expects {sj.recv_counts[i]} from it (recvbuf counts[{i}])")


__all__ = ["Call", "VSpec", "prepare", "agree", "signature", "plain_signature", "block_count"]
