"""Visit the transposed tile pairs of a matrix held in 1 x P column block-cyclic layout.

Symmetrizing a generated matrix and checking an input matrix for symmetry both compare
M[J_q, J_r] (rows J_q of rank r's columns) with M[J_r, J_q]^T (rank q's), for every pair of
ranks; `visit_transposed` brings each pair together without gathering the matrix: round
`k` pairs rank r with rank (k - r) mod P (a pairing that is its own inverse, so both ranks of a
pair meet in the same round, and every rank meets every rank, itself included, once), and
the tiles travel in chunks of at most CHUNK_BYTES through MPI on the host.  Per rank that is
n^2 / P elements sent and received in all, never more than one chunk held at a time."""
from __future__ import annotations

import numpy as np

from .linalg._xp import get_xp, is_device, to_host

#: bytes of one exchanged chunk (bounds the temporary memory of a visit)
CHUNK_BYTES = 8 * 2**20


def _chunk(n_rows: int, itemsize: int = 8) -> int:
    return max(1, CHUNK_BYTES // max(1, n_rows * itemsize))


def visit_transposed(M_loc, desc, mpi_comm, fn) -> None:
    """Call fn(mine, theirs_T) for every chunk of M[rows, cols] this rank holds, where theirs_T
    is the same-shaped chunk of M^T; when fn returns an array it replaces `mine` in M_loc.

    Collective over mpi_comm (every rank, the same desc).  On every pair of ranks the chunks are
    cut the same way, so an fn that is symmetric in its arguments (e.g. (a + b) / 2) writes
    bitwise equal values to M[i, j] and M[j, i]."""
    xp = get_xp(M_loc)
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    cols = [desc.local_cols(q) for q in range(size)]
    for rnd in range(size):
        q = (rnd - rank) % size
        if q == rank:
            _visit_diagonal(M_loc, cols[rank], xp, fn)
        else:
            _visit_pair(M_loc, cols, rank, q, xp, mpi_comm, fn)


def _visit_diagonal(M_loc, J, xp, fn) -> None:
    """The tile M[J, J] on this rank, in square chunks (a, b) with a <= b: both of a pair
    computed from the values before either is written."""
    m = J.size
    c = max(1, int(np.sqrt(_chunk(1))))
    Jx = xp.asarray(J)
    for a0 in range(0, m, c):
        a1 = min(m, a0 + c)
        for b0 in range(a0, m, c):
            b1 = min(m, b0 + c)
            X = M_loc[Jx[a0:a1], b0:b1]   # M[J_a, J_b]
            Y = M_loc[Jx[b0:b1], a0:a1]   # M[J_b, J_a]
            new_x = fn(X, Y.T)
            new_y = fn(Y, X.T) if b0 != a0 else None
            if new_x is not None:
                M_loc[Jx[a0:a1], b0:b1] = new_x
            if new_y is not None:
                M_loc[Jx[b0:b1], a0:a1] = new_y


def _visit_pair(M_loc, cols, rank, q, xp, mpi_comm, fn) -> None:
    """The tiles M[J_q, J_r] (here) and M[J_r, J_q] (on q), chunked along the higher rank's
    columns: the lower rank sends row chunks of its tile, the higher one column chunks."""
    lo, hi = min(rank, q), max(rank, q)
    Jhi = cols[hi]
    rows_other = xp.asarray(cols[q])
    m_lo = cols[lo].size
    c = _chunk(m_lo)
    for k0 in range(0, Jhi.size, c):
        k1 = min(Jhi.size, k0 + c)
        if rank == lo:
            rows_mine = xp.asarray(Jhi[k0:k1])
            mine = M_loc[rows_mine, :]                            # (k1-k0) x m_lo
            recv = np.empty((m_lo, k1 - k0))
        else:
            mine = M_loc[rows_other, k0:k1]                       # m_lo x (k1-k0)
            recv = np.empty((k1 - k0, m_lo))
        send = np.ascontiguousarray(to_host(mine), dtype=np.float64)
        mpi_comm.Sendrecv(send, dest=q, sendtag=17, recvbuf=recv, source=q, recvtag=17)
        theirs_t = xp.asarray(recv).T if is_device(xp) else recv.T
        new = fn(mine, theirs_t)
        if new is None:
            continue
        if rank == lo:
            M_loc[rows_mine, :] = new
        else:
            M_loc[rows_other, k0:k1] = new


def symmetrize(M_loc, desc, mpi_comm) -> None:
    """M := (M + M^T) / 2 in place: the bits of the one-rank (M + M.T) / 2 on any number of ranks."""
    visit_transposed(M_loc, desc, mpi_comm, lambda a, b: (a + b) / 2)


def asymmetry(M_loc, desc, mpi_comm) -> float:
    """max |M - M^T| over the whole matrix (the same value on every rank)."""
    worst = [0.0]

    def note(a, b):
        if a.size:
            worst[0] = max(worst[0], float(abs(a - b).max()))
        return None

    visit_transposed(M_loc, desc, mpi_comm, note)
    from mpi4py import MPI

    return mpi_comm.allreduce(worst[0], op=MPI.MAX)
