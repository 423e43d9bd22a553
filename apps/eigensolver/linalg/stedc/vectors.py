"""The eigenvectors of one merge's rank-one problem (LAPACK dlaed3): z recomputed from the roots
(Gu-Eisenstat), then the vectors' columns in chunks."""
from __future__ import annotations

import numpy as np

from .common import TPB, chunk_width, dc_kernel

def _zhat(d, origin, tau, z, rho, xp):
    """z recomputed from the roots (Gu-Eisenstat, as dlaed3): zhat_i^2 = prod_j (lam_j - d_i) /
    (rho prod_{j != i} (d_j - d_i)), a product of ratios (lam_j - d_i)/(d_j - d_i) near 1, times
    (lam_i - d_i); zhat_i takes z_i's sign.  Arrays of xp."""
    k = d.size
    zhat = xp.empty(k)
    if xp is not np:  # the product in one fused pass (dc_kernels.cu)
        kernel = dc_kernel("dc_zhat")
        kernel((k,), (TPB,), (d, origin, tau, z, np.float64(rho), np.int64(k), zhat))
        return zhat
    rows = chunk_width(k, np)
    lam_o = d[origin]
    for i0 in range(0, k, rows):
        i1 = min(i0 + rows, k)
        di = d[i0:i1, None]
        lam_minus_d = (lam_o[None, :] - di) + tau[None, :]                # [i, j] = lam_j - d_i
        eye = np.arange(i0, i1)[:, None] == np.arange(k)[None, :]
        ratio = np.where(eye, 1.0, lam_minus_d / np.where(eye, 1.0, d[None, :] - di))
        zhat2 = np.prod(ratio, axis=1) * lam_minus_d[eye] / rho
        zhat[i0:i1] = np.copysign(np.sqrt(np.abs(zhat2)), z[i0:i1])
    return zhat


def _u_rows(d, zhat, origin, tau, c0: int, c1: int, rowsL, rowsR, xp):
    """(U[rowsL], U[rowsR]) of U = _u_chunk(...) (None for rows None): on the GPU one kernel,
    a block per column, writing only those rows (dc_kernels.cu dc_vectors)."""
    if xp is np:
        U = _u_chunk(d, zhat, origin, tau, c0, c1, xp)
        return (None if rowsL is None else U[rowsL]), (None if rowsR is None else U[rowsR])
    empty = xp.empty(0, dtype=xp.int64)
    rL = empty if rowsL is None else rowsL
    rR = empty if rowsR is None else rowsR
    UL = xp.empty((rL.size, c1 - c0), order="F")
    UR = xp.empty((rR.size, c1 - c0), order="F")
    if c1 > c0:
        kernel = dc_kernel("dc_vectors")
        kernel((c1 - c0,), (TPB,), (d, zhat, origin, tau, np.int64(d.size), np.int64(c0), rL, np.int64(rL.size), UL,
                                    rR, np.int64(rR.size), UR))
    return (None if rowsL is None else UL), (None if rowsR is None else UR)


def _u_chunk(d, zhat, origin, tau, c0: int, c1: int, xp):
    """Columns c0 .. c1-1 of the rank-one problem's eigenvectors: u_j = zhat / (d - lam_j),
    normalized (k x (c1 - c0), arrays of xp)."""
    lam_minus_d = (d[origin[c0:c1]][None, :] - d[:, None]) + tau[None, c0:c1]
    U = -zhat[:, None] / lam_minus_d                  # zhat_i / (d_i - lam_j)
    U /= xp.sqrt((U * U).sum(axis=0))[None, :]
    return U
