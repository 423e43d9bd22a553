"""The phases that use the Cholesky factor, on the 1 x P column block-cyclic layout with L
distributed like B (each rank keeps its own columns of L, nothing more):

  potrf   B = L L^T, right-looking: the owner of each panel factors it (L11 = chol(B11),
          L21 = B21 L11^-T) and broadcasts it; every rank updates its trailing columns,
          B22 -= L21 L21^T.  One Bcast per panel.
  sygst   C = L^-1 A L^-T by LAPACK dsygst's blocked algorithm (itype 1, lower).  Per panel the
          owner forms C11 = L11^-1 A11 L11^-T and A21 L11^-T - 1/2 L21 C11, broadcasts it with
          L21, every rank applies the symmetric rank-2nb update to its trailing columns, and the
          owner keeps W = A21 L11^-T - L21 C11.  LAPACK then solves L22 X = W for the panel
          (C21 = X), a result that feeds nothing later: so every panel's solve runs in one
          forward substitution at the end, L^-1 applied to the strictly block-lower part of C
          (a second pass of panel Bcasts of L).  Only C's lower triangle is formed, and its strict
          upper triangle is zeroed: the tridiagonalization reads nothing else, so C is exactly
          symmetric by construction (an unsymmetric L^-1 (L^-1 A)^T costs accuracy in
          proportion to cond(B)).
  trsm    X = L^-T Y on the owned columns of Y, by backward substitution over the panels, last
          to first.  One Bcast per panel.

A panel's Bcast carries at most (n - k0) x 2 nb values; the trailing updates are local GEMMs
accumulated in place (_xp.gemm_acc).  potrf's and sygst's update only what a later panel reads:
the lower part of the trailing columns, in chunks of `update_cols` local columns from the row of
each chunk's first column (half the flops of full columns, a few GEMMs per panel).
Every rank receives every panel of L, so every rank sees a failed Cholesky pivot (NaN or <= 0)
and raises NotPositiveDefinite at the end of potrf (one host sync)."""
from __future__ import annotations

import numpy as np

from ._xp import potrf as potrf_block
from ._xp import _unit_rows, gemm_acc, is_device, potrf_in_place, sygst_block, trsm, trsm_in_place
from .layout import BlockCyclic, panel_bcast


UPDATE_COLS = 1024  # local columns per GEMM of the trailing updates
ONE_RANK_NB = 256   # panel width of potrf, sygst and back_transform on one rank (panel_desc)
# sygst's panel width on one GPU rank: 1024-column panels took 0.032 s at n = 8192 on one H200
# against 0.071 s for 256 (bench/onerank_lab.py's sweep), as fast as two whole-matrix trsm
# without their loss of symmetry (and of eigenvalue accuracy at cond(B) = 1e12)
SYGST_ONE_RANK_NB_DEVICE = 1024


def panel_desc(desc: BlockCyclic, nb: int | None = None) -> BlockCyclic:
    """The layout potrf, sygst and back_transform step through: `desc` itself on several ranks;
    on one rank, where every column is local whatever the block (the same array), panels of
    nb (default ONE_RANK_NB) columns: a quarter of the per-panel launches at nb = 64, and wider
    GEMMs."""
    nb = ONE_RANK_NB if nb is None else nb
    if desc.nprocs > 1 or desc.nb >= nb:
        return desc
    return BlockCyclic(desc.m, desc.n, nb, 1)


def sygst_desc(desc: BlockCyclic, device: bool) -> BlockCyclic:
    """sygst's panels: panel_desc's, SYGST_ONE_RANK_NB_DEVICE columns wide on one GPU rank."""
    return panel_desc(desc, SYGST_ONE_RANK_NB_DEVICE if device else None)


def _whole_on_device(desc: BlockCyclic, xp, *arrays) -> bool:
    """One rank on the GPU with column-major arrays: every column is local, so potrf and the
    back-substitution are cuSOLVER's and cuBLAS's own calls on the whole matrix (no panel loop;
    cuSOLVER's potrf took a quarter of the 256-column panels' time at n = 8192 on one H200)."""
    return desc.nprocs == 1 and is_device(xp) and all(_unit_rows(a) for a in arrays)


class NotPositiveDefinite(np.linalg.LinAlgError):
    """B is not (numerically) symmetric positive definite."""


def lower_update(M, P, Q, cols, cols_x, lt: int, k1: int, update_cols: int, xp) -> None:
    """M[:, lt:] -= P Q[rows of its columns]^T on rows at or below each chunk's first column:
    P and Q hold global rows k1.. of the panel; the local columns lt.. are global columns
    cols[lt:] (all >= k1; cols_x: the same on the device).  Rows above a chunk's first global
    column are never read again (each panel reads its own columns from their diagonal down), so
    they go stale."""
    for c0 in range(lt, cols.size, update_cols):
        c1 = min(c0 + update_cols, cols.size)
        g0, g1 = int(cols[c0]), int(cols[c1 - 1]) + 1
        if g1 - g0 == c1 - c0:  # contiguous global columns (one rank, or one block)
            right = Q[g0 - k1:g1 - k1]
        else:
            right = Q[cols_x[c0:c1] - k1]
        gemm_acc(xp, M[g0:, c0:c1], P[g0 - k1:], right.T)


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


def potrf(B, desc: BlockCyclic, comm, xp, *, update_cols: int = UPDATE_COLS):
    """Overwrite the local columns B of the distributed symmetric positive definite matrix with
    those of its lower Cholesky factor L (zeros above the diagonal)."""
    if _whole_on_device(desc, xp, B):   # one rank: cuSOLVER's potrf of the whole matrix, in place
        failed = potrf_in_place(xp, B)
        zero_above_diagonal(B, desc, 0, xp)
        if bool(failed):
            raise NotPositiveDefinite("sygvd: B is not positive definite (Cholesky failed)")
        return B
    n, nb, rank = desc.n, desc.nb, comm.Get_rank()
    cols = desc.local_cols(rank)
    cols_x = xp.asarray(cols)
    failed = xp.zeros((), dtype=bool)
    for k0 in range(0, n, nb):
        k1 = min(k0 + nb, n)
        w = k1 - k0
        if rank == desc.owner(k0):
            lj = desc.local_index(k0)
            blk = B[k0:, lj:lj + w]
            L11 = potrf_block(xp, blk[:w])          # NaNs where B11 is not positive definite
            blk[:w] = L11
            if k1 < n:                              # L21 L11^T = B21
                blk[w:] = trsm(xp, L11, blk[w:].T).T
            B[:k0, lj:lj + w] = 0.0
        Lp = panel_bcast(B, desc, comm, k0)         # (n - k0) x w
        failed |= ~xp.all(xp.diagonal(Lp[:w]) > 0)  # a NaN pivot compares False
        lt = int(np.searchsorted(cols, k1))
        if lt < cols.size:  # B22 -= L21 L21^T (lower part)
            lower_update(B, Lp[w:], Lp[w:], cols, cols_x, lt, k1, update_cols, xp)
    if bool(failed):
        raise NotPositiveDefinite("sygvd: B is not positive definite (Cholesky failed)")
    return B


def sygst(A, L, desc: BlockCyclic, comm, xp, *, update_cols: int = UPDATE_COLS):
    """Overwrite the local columns A of the distributed symmetric A with the lower triangle of
    C = L^-1 A L^-T (strict upper triangle zero); L as potrf leaves it."""
    n, nb, rank = desc.n, desc.nb, comm.Get_rank()
    cols = desc.local_cols(rank)
    cols_x = xp.asarray(cols)
    swap = xp.asarray(np.r_[np.arange(nb, 2 * nb), np.arange(nb)])  # [L21 | X21]'s columns (full panels)
    for k0 in range(0, n, nb):
        k1 = min(k0 + nb, n)
        w = k1 - k0
        owner = desc.owner(k0)
        if rank == owner:
            lj = desc.local_index(k0)
            L11 = L[k0:k1, lj:lj + w]
            C11 = sygst_block(xp, A[k0:k1, lj:lj + w], L11)     # symmetric, both triangles
            A[k0:k1, lj:lj + w] = C11
        if k1 == n:
            break
        buf = xp.empty((2 * w, n - k1), dtype=A.dtype)           # [A21 L11^-T - C11 L21^T / 2 ; L21^T]
        if rank == owner:
            A21, L21 = A[k1:, lj:lj + w], L[k1:, lj:lj + w]
            half = 0.5 * (L21 @ C11)
            A21[...] = trsm(xp, L11, A21.T).T - half
            buf[:w] = A21.T
            buf[w:] = L21.T
        comm.Bcast(buf, root=owner)
        Pk = buf.T                                               # (n - k1) x 2w: [X21 | L21]
        lt = int(np.searchsorted(cols, k1))
        if lt < cols.size:  # A22 -= X21 L21^T + L21 X21^T, lower part (LAPACK's dsyr2k)
            lower_update(A, Pk, Pk[:, swap], cols, cols_x, lt, k1, update_cols, xp)
        if rank == owner:
            A21 -= half                                          # W: LAPACK's second dsymm
    # C21 = L22^-1 W for every panel at once: L^-1 on the strictly block-lower part
    for j0 in range(nb, n, nb):
        j1 = min(j0 + nb, n)
        Lp = panel_bcast(L, desc, comm, j0)
        lt = int(np.searchsorted(cols, j0))                      # owned columns left of block j
        if lt:
            X = A[j0:j1, :lt]
            X[...] = trsm(xp, Lp[:j1 - j0], X)
            if j1 < n:
                gemm_acc(xp, A[j1:, :lt], Lp[j1 - j0:], X)
    zero_above_diagonal(A, desc, rank, xp)
    return A


def zero_above_diagonal(M, desc: BlockCyclic, rank: int, xp) -> None:
    """Zero the strict upper triangle of the distributed matrix in this rank's columns M, block
    by owned block."""
    for g0, g1, l0, l1 in own_blocks(desc, rank):
        M[:g0, l0:l1] = 0.0
        M[g0:g1, l0:l1] = xp.tril(M[g0:g1, l0:l1])


def back_transform(Y, L, desc: BlockCyclic, comm, xp):
    """Overwrite the local columns Y with X = L^-T Y (backward substitution, panels last to first)."""
    if _whole_on_device(desc, xp, Y, L):   # one rank: one cuBLAS trsm, in place
        trsm_in_place(xp, L, Y, trans=True)
        return Y
    n, nb = desc.n, desc.nb
    nloc = Y.shape[1]
    for j0 in reversed(range(0, n, nb)):
        j1 = min(j0 + nb, n)
        w = j1 - j0
        Lp = panel_bcast(L, desc, comm, j0)
        if not nloc:
            continue
        if j1 < n:
            gemm_acc(xp, Y[j0:j1], Lp[w:].T, Y[j1:])
        Y[j0:j1] = trsm(xp, Lp[:w], Y[j0:j1], trans=True)
    return Y
