"""Householder tridiagonalization C = Q T Q^T (sytrd), with the reflectors distributed like C.

LAPACK latrd style, 1-D column block-cyclic: per column one Bcast of [v, d_j, tau, e_j] from
the owner and one Allreduce of the partial products C v.  The panel's V and W (n x 2 nb) are
replicated, so V^T v and W^T v are local; trailing updates are local GEMMs.  C is held as its
lower triangle with the strict upper triangle zero (as sygst leaves it), so C v is two local
GEMVs per rank - the rows of the lower part and, transposed, its columns - and C is exactly
symmetric.  On the GPU the column step runs as device kernels (sytrd_device.py, the same math);
here, and for sytrd="ops" on the GPU, as array operations; one host rank calls LAPACK's dsytrd
(sytrd_lapack).

When a panel is done its owner stores V's columns in the panel's own columns of C (column j
holds v_j: zeros above row j + 1, 1 there): the reflectors stay distributed, n^2 / P values
per rank, in memory C no longer needs; ormtr.py applies them."""
from __future__ import annotations

import numpy as np

from ._xp import is_device
from .householder import householder, w_update
from .layout import BlockCyclic, own_blocks

def sytrd(C, desc: BlockCyclic, comm, xp, mode: str = "auto", notify=()):
    """Tridiagonalize the distributed symmetric C (its lower triangle): C = Q T Q^T.  Returns
    d, e (T's diagonals) and tau (the reflectors' scalars), replicated; C's columns then hold
    the reflectors (see the module doc).  mode: sytrd_device.mode_for's choice on the GPU
    ("auto", "fused", "graph", "eager", "ops"); the host always runs the array operations.
    notify: [(rows, fn)], each fn(d, e) called once T's first `rows` rows are final (d[:rows]
    and e[:rows]; later entries unspecified): on the GPU from the host loop while the device
    reduces the remaining columns (sytrd_device), elsewhere at the end."""
    if is_device(xp):
        from . import sytrd_device

        mode = sytrd_device.mode_for(comm, desc.n, mode)
        if mode != "ops":
            return sytrd_device.sytrd_device(C, desc, comm, mode, notify=notify)
        d, e, tau = sytrd_ops(C, desc, comm, xp)
    elif desc.nprocs == 1:
        d, e, tau = sytrd_lapack(C)
    else:
        d, e, tau = sytrd_ops(C, desc, comm, xp)
    for _, fn in sorted(notify, key=lambda hook: hook[0]):
        fn(d, e)
    return d, e, tau


def sytrd_lapack(C):
    """sytrd on one host rank (every column local): LAPACK dsytrd (lower, blocked: half its
    flops in GEMMs) on C's own memory, its output then put in this module's storage: column j
    holds v_j with zeros above row j + 1 and 1 there (LAPACK keeps e_j there and d on the
    diagonal); tau padded to n.  C: NumPy, Fortran order, lower triangle (strict upper zero)."""
    from scipy.linalg.lapack import dsytrd, dsytrd_lwork

    n = C.shape[0]
    if not C.flags.f_contiguous or C.dtype != np.float64:
        raise ValueError("sytrd_lapack: `C` must be a Fortran-order float64 array (dsytrd works in place)")
    d, e, tau = np.zeros(n), np.zeros(max(n - 1, 0)), np.zeros(n)
    if n == 0:
        return d, e, tau
    work, info = dsytrd_lwork(n, lower=1)
    if info != 0:
        raise RuntimeError(f"dsytrd_lwork: argument {-int(info)} was rejected")
    c, d, e[:], tau[:n - 1], info = dsytrd(C, lower=1, lwork=max(1, int(work)), overwrite_a=1)
    if info != 0:
        raise RuntimeError(f"dsytrd: argument {-int(info)} was rejected")
    if c is not C:                                   # (not expected: C is Fortran-order float64)
        C[...] = c
    idx = np.arange(n)
    C[idx, idx] = 0.0
    C[idx[:-1] + 1, idx[:-1]] = 1.0
    return np.asarray(d, dtype=np.float64), e, tau


def sytrd_ops(C, desc: BlockCyclic, comm, xp):
    """sytrd as array operations (NumPy, or CuPy for mode "ops").

    Written for few, large device operations per column (each CuPy call costs microseconds of CPU):
    the panel's V and W sit side by side in one C-order array P = [V_p | W_p] (n x 2 pw,
    unfilled columns zero), so P[j:] is contiguous and the two rank-k corrections become one
    GEMV pair with the halves of the row swapped; the broadcast buffers of a panel are rows of
    one array, whose scalars (d, tau, e) are gathered once per panel."""
    n, nb, rank = desc.n, desc.nb, comm.Get_rank()
    cols = desc.local_cols(rank)
    cols_x = xp.asarray(cols)
    nloc = cols.size
    d = xp.zeros(n, dtype=xp.float64)
    e = xp.zeros(max(n - 1, 0), dtype=xp.float64)
    tau = xp.zeros(n, dtype=xp.float64)
    ybuf = xp.zeros(n, dtype=xp.float64)             # C v partial products (full height)
    cvbuf = xp.empty(n, dtype=xp.float64)            # their sum over ranks
    scale = xp.empty(1, dtype=xp.float64)            # Householder scratch
    ld = n + 3 + (n + 3) % 2                         # even: every buffer row starts 16-byte aligned
    lidx = xp.arange(nloc)
    swap = None
    for p0 in range(0, n, nb):
        p1 = min(p0 + nb, n)
        pw = p1 - p0
        owner = desc.owner(p0)
        P = xp.zeros((n, 2 * pw), dtype=xp.float64)  # [V_p | W_p], C order
        if swap is None or swap.size != 2 * pw:      # [W_p | V_p]'s columns (the last panel may be narrower)
            swap = xp.asarray(np.r_[np.arange(pw, 2 * pw), np.arange(pw)])
        bufs = xp.empty((pw, ld), dtype=xp.float64)  # row k: [v (m), d_j, tau_j, e_j] of column p0+k
        done = 0
        for j in range(p0, p1):
            k, m = j - p0, n - j - 1
            buf = bufs[k, :m + 3]
            if rank == owner:
                col = C[j:, desc.local_index(j)]
                if k:  # the panel's delayed rank-2k update, on this column only
                    col = col - P[j:] @ P[j, swap]
                if m > 0:
                    householder(xp, col, buf, scale)
                else:
                    buf[0] = col[0]
                    buf[1:] = 0.0
            comm.Bcast(buf, root=owner)
            done = k + 1
            if m == 0:
                break
            v = buf[:m]
            P[j + 1:, k] = v
            if m == 1:  # a one-element reflector has tau = 0: nothing to update
                continue
            lt = int(np.searchsorted(cols, j + 1))
            j2 = (j + 1) & ~1                        # even start: the Allreduce buffers stay aligned
            if lt < nloc:
                # the lower triangle's rows, then its columns (transposed) without the diagonal;
                # rows <= j of the trailing columns lie in the zero upper triangle
                Ct = C[:, lt:]
                vc = P[cols_x[lt:], k]
                xp.matmul(Ct, vc, out=ybuf)
                ybuf[cols_x[lt:]] += Ct[j + 1:].T @ v - C[cols_x[lt:], lidx[lt:]] * vc
            else:
                ybuf[j2:] = 0.0
            comm.Allreduce(ybuf[j2:], cvbuf[j2:])    # the only reduction of the column
            Cv = cvbuf[j + 1:]
            if k:
                Pj = P[j + 1:]
                Cv -= Pj @ (Pj.T @ v)[swap]
            t = buf[m + 1:m + 2]
            w_update(xp, t * Cv, t, v, P[j + 1:, pw + k])
        # the panel's scalars, one gather each
        kk = np.arange(done)
        mm = n - (p0 + kk) - 1
        flat_idx = xp.asarray(kk * ld + mm)
        flat = bufs.reshape(-1)
        d[p0:p0 + done] = flat[flat_idx]
        ne = min(done, n - 1 - p0)
        if ne > 0:
            tau[p0:p0 + ne] = flat[flat_idx[:ne] + 1]
            e[p0:p0 + ne] = flat[flat_idx[:ne] + 2]
        if rank == owner:                            # the reflectors, where C's panel was
            lj = desc.local_index(p0)
            C[:, lj:lj + pw] = P[:, :pw]
        # C -= V W^T + W V^T on the lower triangle of the owned trailing blocks, one GEMM
        # each ([V | W] [W_g | V_g]^T); the diagonal block's strict upper part is zeroed again
        for g0, g1, l0, l1 in own_blocks(desc, rank, p1):
            C[g0:, l0:l1] -= P[g0:] @ P[g0:g1][:, swap].T
            C[g0:g1, l0:l1] = xp.tril(C[g0:g1, l0:l1])
    return d, e, tau
