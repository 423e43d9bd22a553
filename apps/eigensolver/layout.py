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
