"""Distributed generalized symmetric-definite eigensolver A x = lambda B x (sygvd), float64.

Layout: 1-D column block-cyclic (layout.BlockCyclic); a local block holds full columns.
Steps and their collectives (P ranks, n columns, block nb):

  potrf   blocked right-looking Cholesky B = L L^T: the owner factors each panel,
          one Bcast of the panel per block column (n/nb Bcasts); every rank keeps the
          panels, so L ends up replicated; trailing updates are local GEMMs.
  sygst   C = L^-1 A L^-T = L^-1 (L^-1 A)^T (A symmetric): a local trsm on owned
          columns, one Allgather (the transpose), a second local trsm.
  sytrd   Householder tridiagonalization, LAPACK latrd style with panels V, W replicated:
          per column one Bcast of [v, d_j, tau, e_j] from the owner and one Allreduce of
          the n-j-1 partial products C v; V^T v and W^T v are local because V, W are
          replicated, so nothing else needs reducing. Trailing updates: local GEMMs.
  stedc   tridiagonal divide and conquer (LAPACK dstevd) on rank 0, one Bcast of [w, Z]:
          every rank gets the same bits without relying on identical LAPACK runs.
  ormtr   back-transformation Q Z with compact-WY blocks (larft), local GEMMs.
  trsm    X = L^-T (Q Z), local trsm with the replicated L.

Scalars stay in arrays (no per-column host sync); on GPU the only host syncs are the
phase boundaries, the positive-definiteness check after potrf and (if the counting proxy
is asked to) one around each collective."""
from __future__ import annotations

import numpy as np

from ._xp import get_xp, potrf, sync, to_host, trsm, tridiagonal_eigh
from .counting import PhaseTimer
from .layout import BlockCyclic, gather

PHASES = ("potrf", "sygst", "sytrd", "stedc", "ormtr", "trsm")


class NotPositiveDefinite(np.linalg.LinAlgError):
    """B is not (numerically) symmetric positive definite."""


def sygvd(A_local, B_local, desc: BlockCyclic, comm, *, eigvecs: bool = True,
          timer: PhaseTimer | None = None):
    """Eigenvalues w (ascending, replicated on every rank) and local columns of X with
    A X = B X diag(w), X^T B X = I, for block-cyclic A_local, B_local (numpy or cupy).

    Returns (w, X_local); X_local is None when eigvecs=False. A_local and B_local are not
    modified. `comm` is an hpccoll Communicator (or anything with its buffer methods)."""
    xp = get_xp(A_local, B_local)
    rank, size = comm.Get_rank(), comm.Get_size()
    if desc.m != desc.n:
        raise ValueError(f"sygvd: the matrix must be square, the descriptor says {desc.m} x {desc.n}")
    if desc.nprocs != size:
        raise ValueError(f"sygvd: the descriptor is for {desc.nprocs} ranks, the communicator has {size}")
    shape = (desc.n, desc.local_n(rank))
    for name, a in (("A_local", A_local), ("B_local", B_local)):
        if tuple(a.shape) != shape:
            raise ValueError(f"sygvd: {name} has shape {tuple(a.shape)}, rank {rank} owns {shape}")
    timer = timer if timer is not None else PhaseTimer(xp, comm)
    A = xp.array(A_local, dtype=xp.float64, order="F", copy=True)
    B = xp.array(B_local, dtype=xp.float64, order="F", copy=True)

    with timer.phase("potrf"):
        L = _potrf(B, desc, comm, xp)
    del B
    with timer.phase("sygst"):
        C = _sygst(A, L, desc, comm, xp)
    del A
    with timer.phase("sytrd"):
        d, e, V, tau = _sytrd(C, desc, comm, xp)
    del C
    with timer.phase("stedc"):
        w, Z_local = _stedc(d, e, desc, comm, xp, eigvecs)
    if not eigvecs:
        return w, None
    with timer.phase("ormtr"):
        QZ = _ormtr(V, tau, Z_local, desc, xp)
    del V, Z_local
    with timer.phase("trsm"):
        X = xp.asfortranarray(trsm(xp, L, QZ, trans=True))
    return w, X


# -- potrf ---------------------------------------------------------------------------
def _potrf(B, desc: BlockCyclic, comm, xp):
    """Replicated lower Cholesky factor L (n x n, F order) of the distributed B (overwritten)."""
    n, nb, rank = desc.n, desc.nb, comm.Get_rank()
    cols = desc.local_cols(rank)
    cols_x = xp.asarray(cols)
    L = xp.zeros((n, n), dtype=xp.float64, order="F")
    for k0 in range(0, n, nb):
        k1 = min(k0 + nb, n)
        wdt = k1 - k0
        owner = desc.owner(k0)
        panel = xp.empty((wdt, n - k0), dtype=xp.float64)  # C order: panel.T is (n-k0) x wdt, F order
        if rank == owner:
            lj = desc.local_index(k0)
            blk = B[k0:, lj:lj + wdt]
            L11 = potrf(xp, blk[:wdt])
            panel[:, :wdt] = L11.T
            if k1 < n:  # L21 L11^T = B21  <=>  L11 L21^T = B21^T
                panel[:, wdt:] = trsm(xp, L11, blk[wdt:].T)
        comm.Bcast(panel, root=owner)
        Lp = panel.T
        L[k0:, k0:k1] = Lp
        lt = int(np.searchsorted(cols, k1))
        if lt < cols.size:
            L21 = Lp[wdt:]
            B[k1:, lt:] -= L21 @ L21[cols_x[lt:] - k1].T
    if not bool(xp.isfinite(L.diagonal()).all()):  # one host sync; L is replicated so all ranks agree
        raise NotPositiveDefinite("sygvd: B is not positive definite (Cholesky failed)")
    return L


# -- sygst ---------------------------------------------------------------------------
def _sygst(A, L, desc: BlockCyclic, comm, xp):
    """Owned columns of C = L^-1 A L^-T for symmetric A: one Allgather transposes L^-1 A."""
    cols = xp.asarray(desc.local_cols(comm.Get_rank()))
    Y = xp.asfortranarray(trsm(xp, L, A))            # (L^-1 A)[:, cols]
    Yg = gather(Y, desc, comm)                       # L^-1 A, replicated
    # C[:, cols] = L^-1 (L^-1 A)^T[:, cols] = L^-1 ((L^-1 A)[cols, :])^T
    return xp.asfortranarray(trsm(xp, L, Yg[cols, :].T))


# -- sytrd ---------------------------------------------------------------------------
def _householder(xp, x, out, m: int):
    """LAPACK dlarfg on x (length m >= 1): out[:m] = v (v[0] = 1), out[m+1] = tau, out[m+2] = beta.

    Branch-free (xp.where) so the scalars never leave the device."""
    alpha = x[0]
    xnorm = xp.linalg.norm(x[1:]) if m > 1 else xp.zeros((), dtype=x.dtype)
    flat = xnorm == 0                               # H = I
    beta = xp.where(flat, alpha, -xp.copysign(xp.hypot(alpha, xnorm), alpha))
    safe_beta = xp.where(flat, 1.0, beta)
    tau = xp.where(flat, 0.0, (beta - alpha) / safe_beta)
    scale = xp.where(flat, 0.0, 1.0 / xp.where(flat, 1.0, alpha - beta))
    out[0] = 1.0
    if m > 1:
        out[1:m] = x[1:] * scale
    out[m + 1] = tau
    out[m + 2] = beta


def _sytrd(C, desc: BlockCyclic, comm, xp):
    """Tridiagonalize the distributed symmetric C (overwritten): C = Q T Q^T.

    Returns d, e (the tridiagonal, replicated), V (n x n, F order, column j = v_j with
    v_j[j+1] = 1 and zeros above; replicated) and tau (replicated)."""
    n, nb, rank = desc.n, desc.nb, comm.Get_rank()
    cols = desc.local_cols(rank)
    cols_x = xp.asarray(cols)
    d = xp.zeros(n, dtype=xp.float64)
    e = xp.zeros(max(n - 1, 0), dtype=xp.float64)
    tau = xp.zeros(n, dtype=xp.float64)
    V = xp.zeros((n, n), dtype=xp.float64, order="F")
    for p0 in range(0, n, nb):
        p1 = min(p0 + nb, n)
        Vp = V[:, p0:p1]                               # view: filled in place
        Wp = xp.zeros((n, p1 - p0), dtype=xp.float64, order="F")
        for j in range(p0, p1):
            k, m = j - p0, n - j - 1
            owner = desc.owner(j)
            buf = xp.empty(m + 3, dtype=xp.float64)    # [v (m), d_j, tau_j, e_j]
            if rank == owner:
                col = C[j:, desc.local_index(j)]
                if k:  # the panel's delayed rank-2k update, on this column only
                    col = col - Vp[j:, :k] @ Wp[j, :k] - Wp[j:, :k] @ Vp[j, :k]
                buf[m] = col[0]
                if m > 0:
                    _householder(xp, col[1:], buf, m)
                else:
                    buf[m + 1:] = 0.0
            comm.Bcast(buf, root=owner)
            d[j] = buf[m]
            if m == 0:
                break
            tau[j] = buf[m + 1]
            e[j] = buf[m + 2]
            v = buf[:m]
            Vp[j + 1:, k] = v
            if m == 1:  # a one-element reflector has tau = 0: nothing to update
                continue
            lt = int(np.searchsorted(cols, j + 1))
            if lt < cols.size:
                y = C[j + 1:, lt:] @ v[cols_x[lt:] - (j + 1)]
            else:
                y = xp.zeros(m, dtype=xp.float64)
            Cv = xp.empty_like(y)
            comm.Allreduce(y, Cv)                      # the only reduction of the column
            if k:
                Vk, Wk = Vp[j + 1:, :k], Wp[j + 1:, :k]
                Cv -= Vk @ (Wk.T @ v) + Wk @ (Vk.T @ v)
            t = buf[m + 1]
            wv = t * Cv
            wv += (-0.5 * t * (wv @ v)) * v
            Wp[j + 1:, k] = wv
        lt = int(np.searchsorted(cols, p1))
        if lt < cols.size:
            g = cols_x[lt:]
            C[p1:, lt:] -= Vp[p1:] @ Wp[g].T + Wp[p1:] @ Vp[g].T
    return d, e, V, tau


# -- stedc -----------------------------------------------------------------------------
def _stedc(d, e, desc: BlockCyclic, comm, xp, eigvecs: bool):
    """w (replicated) and the owned columns of Z for T = Z diag(w) Z^T: solved on rank 0, one Bcast."""
    n, rank = desc.n, comm.Get_rank()
    nz = n * n if eigvecs else 0
    host = np.empty(n + nz, dtype=np.float64)
    if rank == 0:
        if eigvecs:
            w, Z = tridiagonal_eigh(to_host(d), to_host(e))
            host[n:] = Z.ravel(order="F")
        else:
            from scipy.linalg import eigh_tridiagonal

            w = eigh_tridiagonal(to_host(d), to_host(e), eigvals_only=True) if n > 1 else to_host(d)
        host[:n] = w
    buf = xp.asarray(host)
    comm.Bcast(buf, root=0)
    w = buf[:n].copy()
    if not eigvecs:
        return w, None
    Z = buf[n:].reshape((n, n), order="F")
    return w, xp.asfortranarray(Z[:, xp.asarray(desc.local_cols(rank))])


# -- ormtr -----------------------------------------------------------------------------
def _larft(xp, V, tau):
    """Upper-triangular T with H_0 ... H_{b-1} = I - V T V^T (LAPACK larft, forward, columnwise)."""
    b = tau.size
    S = V.T @ V
    T = xp.zeros((b, b), dtype=V.dtype)
    for i in range(b):
        T[i, i] = tau[i]
        if i:
            T[:i, i] = -tau[i] * (T[:i, :i] @ S[:i, i])
    return T


def _ormtr(V, tau, Z, desc: BlockCyclic, xp):
    """Q Z for Q = H_0 H_1 ... H_{n-2} on the owned columns Z (local, no communication)."""
    n, nb = desc.n, desc.nb
    Z = Z.copy(order="F")
    starts = list(range(0, max(n - 1, 0), nb))
    for p0 in reversed(starts):
        p1 = min(p0 + nb, n - 1)
        Vb = V[p0 + 1:, p0:p1]
        T = _larft(xp, Vb, tau[p0:p1])
        Zb = Z[p0 + 1:]
        Zb -= Vb @ (T @ (Vb.T @ Zb))
    return Z


def solve_distributed(A_global, B_global, comm, *, nb: int = 64, eigvecs: bool = True, timer=None):
    """Convenience: distribute replicated A, B, solve, and return (w, X_local, desc)."""
    from .layout import distribute

    desc = BlockCyclic(A_global.shape[0], A_global.shape[1], nb, comm.Get_size())
    rank = comm.Get_rank()
    w, X = sygvd(distribute(A_global, desc, rank), distribute(B_global, desc, rank), desc, comm,
                 eigvecs=eigvecs, timer=timer)
    return w, X, desc


__all__ = ["sygvd", "solve_distributed", "PHASES", "NotPositiveDefinite", "sync"]
