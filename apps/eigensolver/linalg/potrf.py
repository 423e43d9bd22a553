"""The phases that use the Cholesky factor, on the 1 x P column block-cyclic layout with L
distributed like B (each rank keeps its own columns of L, nothing more); sygst.py has the third:

  potrf   B = L L^T, right-looking: the owner of each panel factors it (L11 = chol(B11),
          L21 = B21 L11^-T) and broadcasts it; every rank updates its trailing columns,
          B22 -= L21 L21^T.  One Bcast per panel.
  trsm    X = L^-T Y on the owned columns of Y, by backward substitution over the panels, last
          to first.  One Bcast per panel.

A panel's Bcast carries at most (n - k0) x 2 nb values; the trailing updates are local GEMMs
accumulated in place (_xp.gemm_acc).  potrf's and sygst's update only what a later panel reads:
the lower part of the trailing columns, in chunks of `update_cols` local columns from the row of
each chunk's first column (half the flops of full columns, a few GEMMs per panel).
Every rank receives every panel of L, so every rank sees a failed Cholesky pivot (NaN or <= 0),
and the smallest and largest pivots, and raises NotPositiveDefinite alike at the end of potrf
(one host sync) when a pivot failed or their ratio says B is singular to working precision."""
from __future__ import annotations

import numpy as np

from ._xp import _unit_rows, gemm_acc, is_device, potrf_in_place, to_host, trsm, trsm_in_place
from .layout import BlockCyclic, own_blocks, panel_bcast


UPDATE_COLS = 1024  # local columns per GEMM of the trailing updates
ONE_RANK_NB = 256   # panel width of potrf, sygst and back_transform on one rank (panel_desc)

def panel_desc(desc: BlockCyclic, nb: int | None = None) -> BlockCyclic:
    """The layout potrf, sygst and back_transform step through: `desc` itself on several ranks;
    on one rank, where every column is local whatever the block (the same array), panels of
    nb (default ONE_RANK_NB) columns: a quarter of the per-panel launches at nb = 64, and wider
    GEMMs."""
    nb = ONE_RANK_NB if nb is None else nb
    if desc.nprocs > 1 or desc.nb >= nb:
        return desc
    return BlockCyclic(desc.m, desc.n, nb, 1)


def _whole_on_device(desc: BlockCyclic, xp, *arrays) -> bool:
    """One rank on the GPU with column-major arrays: every column is local, so potrf and the
    back-substitution are cuSOLVER's and cuBLAS's own calls on the whole matrix (no panel loop,
    whose many small calls and broadcasts one rank does not need)."""
    return desc.nprocs == 1 and is_device(xp) and all(_unit_rows(a) for a in arrays)


class NotPositiveDefinite(np.linalg.LinAlgError):
    """B is not numerically symmetric positive definite: its Cholesky factorization met a pivot
    <= 0 or NaN, or its pivots l_ii^2 span more than 1/eps (then cond(B) > 1/eps: an eps-sized
    change of B makes it singular).  A ValueError (numpy.linalg.LinAlgError)."""


#: B is refused when min l_ii^2 < PIVOT_RATIO * max l_ii^2 (cond(B) >= max l_ii^2 / min l_ii^2)
PIVOT_RATIO = float(np.finfo(np.float64).eps)


def check_pivots(failed, pmin, pmax, xp) -> None:
    """Raise NotPositiveDefinite (one host sync) when `failed` (a device flag) is set or the
    pivots' squared ratio (pmin / pmax)^2 is below PIVOT_RATIO."""
    failed, pmin, pmax = (float(v) for v in to_host(xp.stack([xp.asarray(failed, dtype=xp.float64),
                                                                 xp.asarray(pmin, dtype=xp.float64),
                                                                 xp.asarray(pmax, dtype=xp.float64)])))
    if failed or not pmin > 0:
        raise NotPositiveDefinite("B is not numerically positive definite: its Cholesky factorization met a pivot "
                                  "<= 0 or NaN")
    ratio = (pmin / pmax) ** 2
    if ratio < PIVOT_RATIO:
        raise NotPositiveDefinite(f"B is not numerically positive definite: its Cholesky pivots l_ii^2 range from "
                                  f"{pmin ** 2:.3g} to {pmax ** 2:.3g}, a ratio of {ratio:.3g} < eps = "
                                  f"{PIVOT_RATIO:.3g}, so cond(B) >= {1 / ratio:.3g}: B is singular to working "
                                  "precision")


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


def potrf_block(xp, a):
    """Lower Cholesky factor of the small SPD block a; NaNs (never an exception) if not SPD.

    cuSOLVER potrf reports failure through devInfo (CuPy then fills NaN or warns); numpy
    raises: both become NaNs so every rank can agree on the failure after the next Bcast."""
    if is_device(xp):
        import cupyx

        with cupyx.errstate(linalg="ignore"):  # GPU: no host sync for devInfo
            return xp.linalg.cholesky(a)
    try:
        return np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        return np.full_like(a, np.nan)


def potrf(B, desc: BlockCyclic, comm, xp, *, update_cols: int = UPDATE_COLS):
    """Overwrite the local columns B of the distributed symmetric positive definite matrix with
    those of its lower Cholesky factor L (zeros above the diagonal)."""
    if _whole_on_device(desc, xp, B):   # one rank: cuSOLVER's potrf of the whole matrix, in place
        failed = potrf_in_place(xp, B)
        zero_above_diagonal(B, desc, 0, xp)
        d = xp.diagonal(B)
        check_pivots(failed, d.min(), d.max(), xp)
        return B
    n, nb, rank = desc.n, desc.nb, comm.Get_rank()
    cols = desc.local_cols(rank)
    cols_x = xp.asarray(cols)
    failed = xp.zeros((), dtype=bool)
    pmin = xp.full((), np.inf)
    pmax = xp.zeros(())
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
        piv = xp.diagonal(Lp[:w])
        failed |= ~xp.all(piv > 0)                  # a NaN pivot compares False
        pmin = xp.minimum(pmin, piv.min())
        pmax = xp.maximum(pmax, piv.max())
        lt = int(np.searchsorted(cols, k1))
        if lt < cols.size:  # B22 -= L21 L21^T (lower part)
            lower_update(B, Lp[w:], Lp[w:], cols, cols_x, lt, k1, update_cols, xp)
    check_pivots(failed, pmin, pmax, xp)
    return B


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
