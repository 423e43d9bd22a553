"""1-D column block-cyclic layout (a 1 x P process grid, ScaLAPACK conventions).

Global column j lives on rank (j // nb) % P, rows are not split (mb = m).  A rank's local
array holds its columns in increasing global order, shape (m, numroc(n, nb, rank, P)),
Fortran order so that every column and every trailing block is contiguous in memory."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._xp import get_xp


def numroc(n: int, nb: int, iproc: int, nprocs: int) -> int:
    """Number of the n block-cyclic indices (block nb) owned by process iproc (ScaLAPACK NUMROC)."""
    nblocks = n // nb
    count = (nblocks // nprocs) * nb
    extra = nblocks % nprocs
    if iproc < extra:
        count += nb
    elif iproc == extra:
        count += n % nb
    return count


@dataclass(frozen=True)
class BlockCyclic:
    """Descriptor of an m x n matrix in 1 x nprocs column block-cyclic layout with block nb."""

    m: int
    n: int
    nb: int
    nprocs: int

    def __post_init__(self):
        if self.m < 0 or self.n < 0:
            raise ValueError(f"BlockCyclic: m={self.m}, n={self.n} must be >= 0")
        if self.nb < 1:
            raise ValueError(f"BlockCyclic: nb={self.nb} must be >= 1")
        if self.nprocs < 1:
            raise ValueError(f"BlockCyclic: nprocs={self.nprocs} must be >= 1")

    @property
    def grid(self) -> tuple[int, int]:
        """Process grid (rows, columns): always (1, nprocs) here."""
        return (1, self.nprocs)

    def owner(self, j: int) -> int:
        """Rank owning global column j."""
        return (j // self.nb) % self.nprocs

    def local_n(self, rank: int) -> int:
        """Number of columns rank owns."""
        return numroc(self.n, self.nb, rank, self.nprocs)

    @property
    def max_local_n(self) -> int:
        return self.local_n(0)

    def local_cols(self, rank: int) -> np.ndarray:
        """Global indices of rank's columns, increasing (int64)."""
        starts = np.arange(rank * self.nb, self.n, self.nb * self.nprocs)
        if starts.size == 0:
            return np.zeros(0, dtype=np.int64)
        cols = (starts[:, None] + np.arange(self.nb)[None, :]).ravel()
        return cols[cols < self.n].astype(np.int64)

    def local_index(self, j: int) -> int:
        """Position of global column j in its owner's local array."""
        blk = j // self.nb
        return (blk // self.nprocs) * self.nb + j % self.nb


def own_blocks(desc: BlockCyclic, rank: int, start: int = 0):
    """(g0, g1, l0, l1) of each block of columns `rank` owns with global start g0 >= start:
    global columns [g0, g1) are local columns [l0, l1)."""
    step = desc.nb * desc.nprocs
    first = rank * desc.nb
    if start > first:
        first += -(-(start - first) // step) * step
    for g0 in range(first, desc.n, step):
        l0 = desc.local_index(g0)
        g1 = min(g0 + desc.nb, desc.n)
        yield g0, g1, l0, l0 + g1 - g0


def distribute(global_array, desc: BlockCyclic, rank: int):
    """Rank's local block (m x local_n, Fortran order) of a replicated global matrix; same array type."""
    xp = get_xp(global_array)
    if tuple(global_array.shape) != (desc.m, desc.n):
        raise ValueError(f"distribute: global array has shape {tuple(global_array.shape)}, "
                         f"the descriptor says ({desc.m}, {desc.n})")
    cols = desc.local_cols(rank)
    return xp.asfortranarray(global_array[:, xp.asarray(cols)])


def gather(local, desc: BlockCyclic, comm):
    """The global matrix on every rank from the local blocks (one Allgather through comm).

    Blocks are padded to the largest local width so that every rank sends the same count."""
    xp = get_xp(local)
    w = desc.max_local_n
    send = xp.zeros((w, desc.m), dtype=local.dtype)  # row-major: local columns as rows
    nloc = desc.local_n(comm.Get_rank())
    if tuple(local.shape) != (desc.m, nloc):
        raise ValueError(f"gather: local block has shape {tuple(local.shape)}, "
                         f"rank {comm.Get_rank()} should hold ({desc.m}, {nloc})")
    send[:nloc] = local.T
    recv = xp.empty((desc.nprocs, w, desc.m), dtype=local.dtype)
    comm.Allgather(send, recv)
    out = xp.empty((desc.m, desc.n), dtype=local.dtype, order="F")
    for r in range(desc.nprocs):
        cols = desc.local_cols(r)
        if cols.size:
            out[:, xp.asarray(cols)] = recv[r, :cols.size].T
    return out


def panel_bcast(local, desc: BlockCyclic, comm, k0: int, r0: int | None = None, owned=None):
    """Rows r0.. (default k0) of the global columns [k0, k1) of the block starting at k0, on every
    rank: the owner's copy by one Bcast.  Returns an (m - r0) x (k1 - k0) F-order view of a
    buffer of the local array's module (a C-order (k1 - k0) x (m - r0) buffer, so that the
    broadcast is one contiguous message).  owned: where the owner keeps those rows elsewhere (a
    packed copy, ormtr.pack_reflectors), the owner's (m - r0) x (k1 - k0) array, sent instead of
    local's columns; local then gives only the array module and dtype."""
    xp = get_xp(local)
    r0 = k0 if r0 is None else r0
    k1 = min(k0 + desc.nb, desc.n)
    owner = desc.owner(k0)
    buf = xp.empty((k1 - k0, desc.m - r0), dtype=local.dtype)
    if comm.Get_rank() == owner:
        lj = desc.local_index(k0)
        buf[...] = (local[r0:, lj:lj + k1 - k0] if owned is None else owned).T
    comm.Bcast(buf, root=owner)
    return buf.T


def column_order(desc: BlockCyclic):
    """Global column indices grouped by owner, rank 0's first (each group ascending): where
    rows_to_columns expects the columns of a row block, so that the block each rank receives is
    one contiguous range of the sender's F-order array."""
    return np.concatenate([desc.local_cols(r) for r in range(desc.nprocs)]).astype(np.int64)


def rows_to_columns(rows, row_starts, desc: BlockCyclic, comm):
    """The block-cyclic local columns (m x local_n, F order) of a matrix that the ranks hold in
    contiguous row blocks: rank r holds rows [row_starts[r], row_starts[r + 1]) as an F-order
    array whose columns are in column_order(desc).  One Alltoallv.  Pass `rows` without keeping
    a reference to it (e.g. `rows_to_columns(parts.pop(), ...)`): it is freed once sent, so the
    call holds two copies of the rank's share at a time, not three."""
    xp = get_xp(rows)
    rank, P = comm.Get_rank(), desc.nprocs
    heights = [row_starts[r + 1] - row_starts[r] for r in range(P)]
    widths = [desc.local_n(r) for r in range(P)]
    h, nloc = heights[rank], widths[rank]
    if tuple(rows.shape) != (h, desc.n):
        raise ValueError(f"rows_to_columns: rank {rank} holds rows of shape {tuple(rows.shape)}, "
                         f"expected ({h}, {desc.n})")
    if P == 1:   # one rank: its rows are its columns, already in order (no exchange, no copy)
        return xp.asfortranarray(rows)
    send = xp.asfortranarray(rows).reshape(-1, order="F")
    del rows
    recv = xp.empty(desc.m * nloc, dtype=send.dtype)
    comm.Alltoallv((send, [h * w for w in widths]), (recv, [g * nloc for g in heights]))
    del send
    out = xp.empty((desc.m, nloc), dtype=recv.dtype, order="F")
    at = 0
    for r, g in enumerate(heights):
        if g and nloc:
            out[row_starts[r]:row_starts[r] + g] = recv[at:at + g * nloc].reshape((g, nloc), order="F")
        at += g * nloc
    return out
