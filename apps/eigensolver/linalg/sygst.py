"""Reduction of A x = lambda B x to standard form, C = L^-1 A L^-T (sygst), on the 1 x P column
block-cyclic layout with L as potrf leaves it.

LAPACK dsygst's blocked algorithm (itype 1, lower).  Per panel the owner forms
C11 = L11^-1 A11 L11^-T and A21 L11^-T - 1/2 L21 C11, broadcasts it with L21, every rank
applies the symmetric rank-2nb update to its trailing columns, and the owner keeps
W = A21 L11^-T - L21 C11.  LAPACK then solves L22 X = W for the panel (C21 = X), a result that
feeds nothing later: so every panel's solve runs in one forward substitution at the end, L^-1
applied to the strictly block-lower part of C (a second pass of panel Bcasts of L).  Only C's
lower triangle is formed, and its strict upper triangle is zeroed: the tridiagonalization reads
nothing else, so C is exactly symmetric by construction (an unsymmetric L^-1 (L^-1 A)^T costs
accuracy in proportion to cond(B)).  A panel's Bcast carries at most (n - k) x 2 nb values."""
from __future__ import annotations

import numpy as np

from ._xp import gemm_acc, is_device, trsm
from .layout import BlockCyclic, panel_bcast
from .potrf import UPDATE_COLS, lower_update, panel_desc, zero_above_diagonal

# sygst's panel width on one GPU rank: wide panels make the trailing updates few large GEMMs,
# near the speed of two whole-matrix trsm without their loss of symmetry (and of eigenvalue
# accuracy at large cond(B))
SYGST_ONE_RANK_NB_DEVICE = 1024


def sygst_desc(desc: BlockCyclic, device: bool) -> BlockCyclic:
    """sygst's panels: panel_desc's, SYGST_ONE_RANK_NB_DEVICE columns wide on one GPU rank."""
    return panel_desc(desc, SYGST_ONE_RANK_NB_DEVICE if device else None)


def sygst_block(xp, a, L):
    """C = L^-1 a L^-T for a small symmetric block a (its lower triangle is read) and lower
    triangular L, returned symmetric (both triangles, from C's lower one).  Host: LAPACK dsygst
    (unblocked for a block this size, as inside LAPACK's blocked sygst); GPU: two triangular
    solves."""
    if is_device(xp):
        low = xp.tril(a)
        sym = low + xp.tril(a, -1).T
        c = trsm(xp, L, trsm(xp, L, sym).T)
    else:
        from scipy.linalg.lapack import dsygst

        c, info = dsygst(np.asfortranarray(a, dtype=np.float64), np.asfortranarray(L, dtype=np.float64),
                         itype=1, lower=1)
        if info != 0:
            raise RuntimeError(f"dsygst failed with info={info}")
    return xp.tril(c) + xp.tril(c, -1).T


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
