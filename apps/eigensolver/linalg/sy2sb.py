"""Stage one of the two-stage tridiagonalization: dense symmetric C -> band of half-bandwidth b,
C = Q1 B Q1^T, by blocked Householder transformations (LAPACK dsytrd_sy2sb's algorithm on the
1-D column block-cyclic layout; b divides the layout's nb, so a panel lies on one rank).

Per panel of b columns [p0, p1 = p0 + b), right-looking (every trailing update applied at once):
  - the owner QR-factors the panel below the band, C[p1:, p0:p1] = Q_p R (geqrf): R is the
    panel's part of the band, Q_p = I - V T V^T (T from the UT transform, as ormtr.py);
  - ONE Bcast gives every rank [V | T | tau] (m x b, b x b, b; m = n - p1);
  - each rank forms its owned trailing columns' share of Y = C22 V (C22 = C[p1:, p1:], held as
    its lower triangle: the rows of the owned columns and, transposed, their columns, as sytrd.py
    does for a vector) and ONE Allreduce sums the shares (m x b values);
  - every rank then has X = Y T and W = X - 1/2 V (T^T V^T X) and updates its owned trailing
    columns, C22 -= V W^T + W V^T, one GEMM per run of owned columns (BLAS-3 throughout).
So 2 collectives per panel, n / b panels, against sytrd's 2 per column; the symmetric
trailing matrix is read twice per panel of b columns instead of once per column.  One GPU rank
holds every trailing column: the panel's QR, V and T are one kernel (sy2sb_device.PanelQR), Y is
one cuBLAS symm and the update one cuBLAS syr2k on C22's lower triangle, or from
UPDATE_BLOCKED_ROWS rows on Y by blocks (symm_blocked) and the update one GEMM per block of
UPDATE_COLUMNS columns from the block's diagonal down (update_lower; the blocks' strict upper
triangles get the product too and are zeroed once, at the end).

The panel's geqrf output stays in its columns until the end; then every rank copies its columns'
band (rows c..c+b of column c: the diagonal block's lower part and R's upper part) into a
(b + 1) x local_n band array (LAPACK's lower band storage) and turns the columns into the
reflectors ormtr.ormtr(offset=b) applies: column c holds v_c, zero above row c + b, 1 there."""
from __future__ import annotations

from ._xp import (gemm_acc, geqrf, geqrf_in_place, geqrf_work, is_device, symm_lower, syr2k_lower, trsm,
                  zero_strict_upper)
from .layout import BlockCyclic

#: owned trailing columns per update GEMM on one run: the product's upper part (computed, then
#: discarded) stays a few panels' worth of the trailing triangle
RUN_COLUMNS = 256
#: one GPU rank's trailing update of m >= UPDATE_BLOCKED_ROWS rows: C22 -= V W^T + W V^T as one
#: GEMM (inner dimension 2b) per block of UPDATE_COLUMNS columns, over the block's rows from its
#: diagonal down, about m^2 b (2 + UPDATE_COLUMNS / m) flops.  On an H100 cuBLAS syr2k ran at
#: 17.6 TFLOP/s of its 2 m^2 b flops at m = 16320, b = 64 (1.94 ms), a GEMM of the whole
#: m x m x 2b at 29; the band reduction took 0.445 s with the blocks against 0.481 s with syr2k
#: at n = 16384 (docs/performance.md).  Below it one syr2k: at n = 8192 the panel loop is bound
#: by its launches, which the blocks multiply
UPDATE_COLUMNS = 2048
UPDATE_BLOCKED_ROWS = 8192


def check_band(desc: BlockCyclic, b: int) -> None:
    """sy2sb's condition on b: 1 <= b and b divides the layout's nb (a panel on one rank)."""
    if b < 1 or desc.nb % b:
        raise ValueError(f"sy2sb: half-bandwidth b={b} must divide the layout's block nb={desc.nb}")


def trailing_runs(desc: BlockCyclic, rank: int, start: int, width: int = RUN_COLUMNS):
    """(g0, g1, l0, l1): `rank`'s owned columns from global column `start` on, in runs of
    consecutive global columns (a run continues across blocks where the rank owns the next
    block too: on one rank, all of them) cut to at most `width` columns.  Global [g0, g1) are
    local [l0, l1)."""
    step = desc.nb * desc.nprocs
    b0 = (start // desc.nb) * desc.nb                 # the block holding `start`
    first = rank * desc.nb
    if b0 > first:
        first += -(-(b0 - first) // step) * step
    run = None
    for g0 in range(first, desc.n, step):
        g0c = max(g0, start)
        g1 = min(g0 + desc.nb, desc.n)
        if g0c >= g1:
            continue
        l0 = desc.local_index(g0) + g0c - g0
        if run is not None and run[1] == g0c:
            run = (run[0], g1, run[2], l0 + g1 - g0c)
        else:
            if run is not None:
                yield from _cut(run, width)
            run = (g0c, g1, l0, l0 + g1 - g0c)
    if run is not None:
        yield from _cut(run, width)


def _cut(run, width: int):
    g0, g1, l0, _ = run
    for a in range(g0, g1, width):
        e = min(a + width, g1)
        yield a, e, l0 + a - g0, l0 + e - g0


def block_reflector(xp, V, tau):
    """T with I - V T V^T = H_0 H_1 ... H_{k-1} (H_i = I - tau_i v_i v_i^T, V unit lower
    trapezoidal): T = M^-1 for M = striu(V^T V) + diag(1/tau) (the UT transform); a reflector
    with tau = 0 is left out (its column of V zeroed, M's diagonal 1)."""
    live = tau != 0
    Vl = V * live[None, :]
    M = xp.triu(Vl.T @ Vl, 1)
    M[xp.diag_indices(M.shape[0])] = 1.0 / xp.where(live, tau, 1.0)
    return trsm(xp, M, xp.eye(M.shape[0]), lower=False) * live[None, :]


def sy2sb(C, desc: BlockCyclic, comm, xp, b: int):
    """Reduce the distributed symmetric C (its lower triangle, strict upper part zero) to a band
    of half-bandwidth b: C = Q1 B Q1^T.  Returns (band, tau): band the (b + 1) x local_n lower
    band storage of B's owned columns (band[d, k] = B[c + d, c] for the rank's k-th column c;
    zero past row n), tau (length n, replicated) the reflectors' scalars, reflector c's vector
    in C's column c from row c + b (the module doc); tau[c] = 0 where there is none."""
    check_band(desc, b)
    n, rank = desc.n, comm.Get_rank()
    tau = xp.zeros(n, dtype=xp.float64)
    if is_device(xp) and desc.nprocs == 1:
        _sy2sb_one_device(C, n, b, xp, tau)
        return _band_and_reflectors_one_device(C, n, b, xp), tau
    for p0 in range(0, max(n - b - 1, 0), b):           # a panel has entries below its band
        p1 = p0 + b
        m = n - p1
        owner = desc.owner(p0)
        buf = xp.empty((b, m + b + 1), dtype=xp.float64)   # row t: [v_t (m) | T[:, t] (b) | tau_t]
        if rank == owner:
            lj = desc.local_index(p0)
            qr, t = geqrf(xp, C[p1:, lj:lj + b])
            C[p1:, lj:lj + b] = qr
            k = t.shape[0]                               # min(m, b)
            taus = xp.zeros(b, dtype=xp.float64)
            taus[:k] = t
            V = xp.tril(qr, -1)
            V[xp.arange(k), xp.arange(k)] = 1.0
            buf[:, :m] = V.T
            buf[:, m + b] = taus
            buf[:, m:m + b] = block_reflector(xp, V, taus).T
        comm.Bcast(buf, root=owner)
        V = buf[:, :m].T
        T = buf[:, m:m + b].T
        tau[p0:p1] = buf[:, m + b]
        # Y = C22 V: this rank's columns' share, then one Allreduce
        Y = xp.zeros((m, b), dtype=xp.float64, order="F")
        runs = list(trailing_runs(desc, rank, p1))
        for g0, g1, l0, l1 in runs:
            r0, r1 = g0 - p1, g1 - p1
            Cr = C[g0:, l0:l1]
            Y[r0:] += Cr @ V[r0:r1]
            Y[r0:r1] += Cr.T @ V[r0:] - xp.diagonal(Cr)[:, None] * V[r0:r1]
        S = xp.empty_like(Y)
        comm.Allreduce(Y, S)
        X = S @ T
        W = X - 0.5 * (V @ (T.T @ (V.T @ X)))
        VW = xp.concatenate([V, W], axis=1)              # [V | W] and [W | V]: one GEMM per run
        WV = xp.concatenate([W, V], axis=1)
        for g0, g1, l0, l1 in runs:
            r0, r1 = g0 - p1, g1 - p1
            C[g0:, l0:l1] -= VW[r0:] @ WV[r0:r1].T
            C[g0:g1, l0:l1] = xp.tril(C[g0:g1, l0:l1])
    return _band_and_reflectors(C, desc, rank, b, xp), tau


def update_lower(xp, C22, V, W, width: int | None = None) -> None:
    """C22 -= V W^T + W V^T on C22's lower triangle (column-major), one GEMM of inner dimension
    2 k per block of `width` columns [j0, j1) (default UPDATE_COLUMNS), over rows j0 ..: the
    blocks' strict upper triangles get the product too (the caller zeroes them); the rest of the
    upper triangle is not touched."""
    m = C22.shape[0]
    width = width or UPDATE_COLUMNS
    VW = xp.concatenate([V, W], axis=1)                 # [V | W] [W | V]^T = V W^T + W V^T
    WV = xp.concatenate([W, V], axis=1)
    for j0 in range(0, m, width):
        j1 = min(j0 + width, m)
        gemm_acc(xp, C22[j0:, j0:j1], VW[j0:], WV[j0:j1].T, -1.0)


def symm_blocked(xp, C22, V, Y, width: int | None = None) -> None:
    """Y := C22 V for the symmetric C22 given by its lower triangle (column-major; nothing above
    the diagonal blocks' diagonals is read), by blocks of `width` columns [j0, j1) (default
    UPDATE_COLUMNS): each diagonal block by a symm into Y's rows j0.., then each block below a
    diagonal block B = C22[j1:, j0:j1] twice, Y[j1:] += B V[j0:j1] and Y[j0:j1] += B^T V[j1:] (one
    GEMM each).  On an H100 at b = 64 (GPU time): 0.707 against 0.863 ms for one cuBLAS symm at
    m = 12288, the same at 16320, 0.357 against 0.295 ms at 8192; the band reduction 0.331
    against 0.345 s at n = 16384 (docs/performance.md)."""
    m = C22.shape[0]
    width = width or UPDATE_COLUMNS
    for j0 in range(0, m, width):
        j1 = min(j0 + width, m)
        symm_lower(xp, C22[j0:j1, j0:j1], V[j0:j1], Y[j0:j1])
    for j0 in range(0, m, width):
        j1 = min(j0 + width, m)
        if j1 < m:
            B = C22[j1:, j0:j1]
            gemm_acc(xp, Y[j1:], B, V[j0:j1], 1.0)
            gemm_acc(xp, Y[j0:j1], B.T, V[j1:], 1.0)


def _sy2sb_one_device(C, n: int, b: int, xp, tau) -> None:
    """sy2sb's panels on one GPU, every column local: per panel the QR factorization in the
    panel's own columns with its V and T (sy2sb_device.PanelQR: one launch; where the panel does
    not fit it, cuSOLVER's geqrf and block_reflector), then Y = C22 V and the update by
    symm_blocked and update_lower from UPDATE_BLOCKED_ROWS rows on (else one symm and one syr2k);
    C's strict upper triangle zeroed at the end.  The work queues on the stream: no host sync per panel."""
    from .sy2sb_device import PanelQR

    qr = PanelQR(n, b)
    work = None if qr.fits else xp.empty(max(1, geqrf_work((max(n - b, 1), b))), dtype=xp.float64)
    for p0 in range(0, max(n - b - 1, 0), b):
        p1 = p0 + b
        m = n - p1
        panel = C[p1:, p0:p1]
        if qr.fits:
            V = xp.empty((m, b), dtype=xp.float64, order="F")
            T = xp.empty((b, b), dtype=xp.float64, order="F")
            qr(panel, tau[p0:p1], V, T)
        else:
            geqrf_in_place(xp, panel, tau[p0:p1], work)
            k = min(m, b)                                # tau[p0 + k:p1] stays 0: no reflector
            V = panel.copy(order="F")                    # unit lower trapezoidal, column-major
            V[:k] = xp.tril(V[:k], -1)
            V[xp.arange(k), xp.arange(k)] = 1.0
            T = block_reflector(xp, V, tau[p0:p1])
        C22 = C[p1:, p1:]
        Y = xp.empty((m, b), dtype=xp.float64, order="F")
        blocked = m >= UPDATE_BLOCKED_ROWS
        (symm_blocked if blocked else symm_lower)(xp, C22, V, Y)
        X = Y @ T
        W = X - 0.5 * (V @ (T.T @ (V.T @ X)))
        if blocked:
            update_lower(xp, C22, V, W)
        else:
            syr2k_lower(xp, C22, V, xp.asfortranarray(W))
    zero_strict_upper(xp, C)


def _band_and_reflectors(C, desc: BlockCyclic, rank: int, b: int, xp):
    """Copy the band out of the owned columns of C, then leave each column c as reflector v_c
    (zero above row c + b, 1 at row c + b; columns without one hold zeros and a 1 that their
    tau = 0 masks)."""
    n = desc.n
    band = xp.zeros((b + 1, C.shape[1]), dtype=xp.float64)
    for g0, g1, l0, l1 in trailing_runs(desc, rank, 0, desc.nb):
        blk = C[g0:min(g1 + b, n), l0:l1]
        for d in range(min(b, n - 1 - g0) + 1):
            diag = xp.diagonal(blk, -d)
            band[d, l0:l0 + diag.shape[0]] = diag
        C[g0:min(g1 + b, n), l0:l1] = xp.tril(blk, -b)
        k = min(g1, n - b) - g0                        # columns whose row c + b exists
        if k > 0:
            C[g0 + b + xp.arange(k), l0 + xp.arange(k)] = 1.0
    return band


def _band_and_reflectors_one_device(C, n: int, b: int, xp):
    """_band_and_reflectors for one rank holding every column, by index arrays: one gather of
    the band, one scatter of zeros over its rows c .. c + b - 1 of column c (the strict upper
    triangle is zero already: sy2sb never writes it) and one of the 1 at row c + b."""
    c = xp.broadcast_to(xp.arange(n), (b + 1, n))
    r = c + xp.arange(b + 1)[:, None]
    rr = xp.minimum(r, n - 1)                      # past row n - 1: a band entry of the same column
    band = xp.where(r < n, C[rr, c], 0.0)
    C[rr[:b], c[:b]] = 0.0
    k = max(n - b, 0)
    C[xp.arange(k) + b, xp.arange(k)] = 1.0
    return band


def gather_band(band, desc: BlockCyclic, comm, xp):
    """The whole (b + 1) x n band on every rank from the ranks' columns (one Allgather, blocks
    padded to the largest local width); one rank's band is already whole (returned as is)."""
    if desc.nprocs == 1:
        return band
    nb1 = band.shape[0]
    w = desc.max_local_n
    send = xp.zeros((w, nb1), dtype=xp.float64)
    send[:band.shape[1]] = band.T
    recv = xp.empty((desc.nprocs, w, nb1), dtype=xp.float64)
    comm.Allgather(send, recv)
    out = xp.empty((nb1, desc.n), dtype=xp.float64)
    for r in range(desc.nprocs):
        cols = desc.local_cols(r)
        if cols.size:
            out[:, xp.asarray(cols)] = recv[r, :cols.size].T
    return out


__all__ = ["RUN_COLUMNS", "UPDATE_BLOCKED_ROWS", "UPDATE_COLUMNS", "block_reflector", "check_band", "gather_band",
           "sy2sb", "symm_blocked", "trailing_runs", "update_lower"]
