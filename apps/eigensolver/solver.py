"""Distributed generalized symmetric-definite eigensolver A x = lambda B x (sygvd), float64.

Layout: 1-D column block-cyclic (layout.BlockCyclic); a local block holds full columns.
Steps and their collectives (P ranks, n columns, block nb):

  potrf   Cholesky B = L L^T, L replicated: one Allgather of B, then every rank factors
          all of it with one library potrf (same bits in, same deterministic routine: the
          same L; a digest of L checks it).  HPCCOLL_EIG_POTRF=panels: blocked right-looking,
          the owner factors each panel, one Bcast per block column (n/nb Bcasts), trailing
          updates as local GEMMs.
  sygst   C = L^-1 A L^-T = L^-1 (L^-1 A)^T (A symmetric): a local trsm on owned
          columns, one Allgather (the transpose), a second local trsm.
  sytrd   Householder tridiagonalization, LAPACK latrd style with panels V, W replicated:
          per column one Bcast of [v, d_j, tau, e_j] from the owner and one Allreduce of
          the partial products C v (rows j+1.. from an even row, so device buffers stay
          16-byte aligned and need no staging); V^T v and W^T v are local because V, W are
          replicated, so nothing else needs reducing. Trailing updates: local GEMMs.
          On the GPU the column step is device kernels with the column index in device
          memory, one CUDA graph per panel (sytrd_device.py; fixed-size collectives).
  stedc   tridiagonal eigensolver.  stedc="host" (LAPACK dstevd) or "gpu" (cuSOLVER syevd
          of the dense tridiagonal): on rank 0, one Bcast of [w, Z], so every rank gets the
          same bits without relying on identical LAPACK runs.  stedc="dc" (tridiag_dc.py)
          on >= 2 ranks: rank 0 solves the divide-and-conquer tree's left half, rank 1 its
          right half, two Bcasts of [w, Q] of a half, and every rank runs the top merge
          (deterministic; a digest of w and Z checks that the ranks agree, else rank 0's
          [w, Z] is Bcast).
  ormtr   back-transformation Q Z with compact-WY blocks (larft), local GEMMs.
  trsm    X = L^-T (Q Z), local trsm with the replicated L.

Scalars stay in arrays (no per-column host sync); on GPU the only host syncs are the
phase boundaries, the positive-definiteness check after potrf, the digests that check that
redundantly computed results agree across ranks (each a host allgather of 32 bytes through
the MPI communicator underneath) and (if the counting proxy is asked to) one around each
collective."""
from __future__ import annotations

import hashlib
import os
import warnings

import numpy as np

from ._xp import (get_xp, householder, is_device, potrf, sync, to_host, tridiagonal_eigh, tridiagonal_matrix,
                  trsm, w_update)
from .counting import PhaseTimer
from .layout import BlockCyclic, gather

PHASES = ("potrf", "sygst", "sytrd", "stedc", "ormtr", "trsm")


class NotPositiveDefinite(np.linalg.LinAlgError):
    """B is not (numerically) symmetric positive definite."""


def sygvd(A_local, B_local, desc: BlockCyclic, comm, *, eigvecs: bool = True,
          timer: PhaseTimer | None = None, stedc: str = "auto"):
    """Eigenvalues w (ascending, replicated on every rank) and local columns of X with
    A X = B X diag(w), X^T B X = I, for block-cyclic A_local, B_local (numpy or cupy).

    Returns (w, X_local); X_local is None when eigvecs=False. A_local and B_local are not
    modified. `comm` is an hpccoll Communicator (or anything with its buffer methods).
    stedc: the tridiagonal solver, "host" (LAPACK on rank 0), "gpu" (cuSOLVER on rank 0) or "dc"
    (tridiag_dc, its halves on ranks 0 and 1); "auto": for device arrays dc from DC_MIN_N rows
    (with eigenvectors) and gpu below, else host.  potrf: see potrf_variant."""
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
        w, Z_local = _stedc(d, e, desc, comm, xp, eigvecs, stedc)
    if not eigvecs:
        return w, None
    with timer.phase("ormtr"):
        QZ = _ormtr(V, tau, Z_local, desc, xp)
    del V, Z_local
    with timer.phase("trsm"):
        X = xp.asfortranarray(trsm(xp, L, QZ, trans=True))
    return w, X


# -- potrf ---------------------------------------------------------------------------
POTRF_ENV = "HPCCOLL_EIG_POTRF"
POTRF_VARIANTS = ("replicated", "panels")


def potrf_variant() -> str:
    """How potrf factors B: "replicated" (the default: one Allgather of B, then every rank
    factors all of it) or "panels" (the blocked algorithm, one Bcast per panel): $HPCCOLL_EIG_POTRF."""
    want = os.environ.get(POTRF_ENV, POTRF_VARIANTS[0])
    if want not in POTRF_VARIANTS:
        raise ValueError(f"{POTRF_ENV}={want!r}: use {' or '.join(POTRF_VARIANTS)}")
    return want


def _potrf(B, desc: BlockCyclic, comm, xp):
    """Replicated lower Cholesky factor L (n x n, F order) of the distributed B (which the panel
    variant overwrites)."""
    if potrf_variant() == "panels":
        L = _potrf_panels(B, desc, comm, xp)
    else:
        L = _potrf_replicated(B, desc, comm, xp)
    # One host sync; L is replicated so all ranks agree.  A failed potrf leaves a diagonal
    # entry <= 0 (cuSOLVER/LAPACK store the offending pivot) or NaN (numpy path): both fail here.
    dg = L.diagonal()
    if not bool(((dg > 0) & xp.isfinite(dg)).all()):
        raise NotPositiveDefinite("sygvd: B is not positive definite (Cholesky failed)")
    return L


def _potrf_replicated(B, desc: BlockCyclic, comm, xp):
    """L from all of B on every rank: one Allgather, then one library potrf per rank.

    Why: L ends up replicated anyway, and one cuSOLVER potrf of the whole matrix (a few ms at
    n = 8192 on an H200) beats n/nb panel steps, each a host sync, a trsm, a Bcast and a GEMM
    (65-80 ms on 2 x H200).  Every rank factors the same bits with the same deterministic
    routine, so the factors agree; a digest of L's diagonal and last row (which depends on
    every pivot) checks that they do."""
    L = xp.asfortranarray(potrf(xp, gather(B, desc, comm)))
    digests = _digests(comm, xp, L.diagonal(), L[-1:])
    if len(set(digests)) > 1:
        raise RuntimeError(
            "sygvd: the ranks' Cholesky factors of the same B differ (SHA-256 of diag(L) and "
            f"L's last row per rank: {', '.join(d[:12] for d in digests)}): their LAPACK/cuSOLVER "
            f"builds or devices compute differently; use {POTRF_ENV}=panels (each panel factored once)")
    return L


def _potrf_panels(B, desc: BlockCyclic, comm, xp):
    """L by blocked right-looking Cholesky: the owner factors each panel and Bcasts it, every rank
    keeps the panels and updates its own trailing columns."""
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
    return L


def _digests(comm, xp, *arrays) -> list[str]:
    """Every rank's SHA-256 of the bits of `arrays` (one small copy to the host), rank by rank:
    a host allgather of 32 bytes through the MPI communicator under comm (as sytrd_device's
    capture agreement), not one of the solver's counted collectives."""
    if comm.Get_size() == 1:
        return []
    host = to_host(xp.concatenate([a.ravel() for a in arrays]))
    digest = hashlib.sha256(np.ascontiguousarray(host).tobytes()).digest()
    return [d.hex() for d in comm.mpi_comm.allgather(digest)]


# -- sygst ---------------------------------------------------------------------------
def _sygst(A, L, desc: BlockCyclic, comm, xp):
    """Owned columns of C = L^-1 A L^-T for symmetric A: one Allgather transposes L^-1 A."""
    cols = xp.asarray(desc.local_cols(comm.Get_rank()))
    Y = xp.asfortranarray(trsm(xp, L, A))            # (L^-1 A)[:, cols]
    Yg = gather(Y, desc, comm)                       # L^-1 A, replicated
    # C[:, cols] = L^-1 (L^-1 A)^T[:, cols] = L^-1 ((L^-1 A)[cols, :])^T
    return xp.asfortranarray(trsm(xp, L, Yg[cols, :].T))


# -- sytrd ---------------------------------------------------------------------------
def _sytrd(C, desc: BlockCyclic, comm, xp):
    """Tridiagonalize the distributed symmetric C (overwritten): C = Q T Q^T.  On the GPU the
    column step runs as device kernels replayed in CUDA graphs (sytrd_device); on the host,
    or with HPCCOLL_EIG_SYTRD=ops, as array operations (_sytrd_ops)."""
    if is_device(xp):
        from . import sytrd_device

        mode = sytrd_device.mode_for(comm, desc.n)
        if mode != "ops":
            return sytrd_device.sytrd_device(C, desc, comm, mode)
    return _sytrd_ops(C, desc, comm, xp)


def _sytrd_ops(C, desc: BlockCyclic, comm, xp):
    """Tridiagonalize the distributed symmetric C (overwritten): C = Q T Q^T.

    Returns d, e (the tridiagonal, replicated), V (n x n, F order, column j = v_j with
    v_j[j+1] = 1 and zeros above; replicated) and tau (replicated).

    Written for few, large device operations per column (each CuPy call costs ~7 us of CPU):
    the panel's V and W sit side by side in one C-order array P = [V_p | W_p] (n x 2 pw,
    unfilled columns zero), so P[j:] is contiguous (cuBLAS takes it without a copy) and the
    two rank-k corrections become one GEMV pair with the halves of the row swapped;
    the broadcast buffers of a panel are rows of one array, whose scalars (d, tau, e) are
    gathered once per panel; C v uses full-height columns C[:, lt:] (contiguous, no copy)."""
    n, nb, rank = desc.n, desc.nb, comm.Get_rank()
    cols = desc.local_cols(rank)
    cols_x = xp.asarray(cols)
    d = xp.zeros(n, dtype=xp.float64)
    e = xp.zeros(max(n - 1, 0), dtype=xp.float64)
    tau = xp.zeros(n, dtype=xp.float64)
    V = xp.zeros((n, n), dtype=xp.float64, order="F")
    ybuf = xp.zeros(n, dtype=xp.float64)             # C v partial products (full height)
    cvbuf = xp.empty(n, dtype=xp.float64)            # their sum over ranks
    scale = xp.empty(1, dtype=xp.float64)            # Householder scratch
    ld = n + 3 + (n + 3) % 2                         # even: every buffer row starts 16-byte aligned
    for p0 in range(0, n, nb):
        p1 = min(p0 + nb, n)
        pw = p1 - p0
        P = xp.zeros((n, 2 * pw), dtype=xp.float64)  # [V_p | W_p], C order
        swap = xp.asarray(np.r_[np.arange(pw, 2 * pw), np.arange(pw)])
        bufs = xp.empty((pw, ld), dtype=xp.float64)  # row k: [v (m), d_j, tau_j, e_j] of column p0+k
        done = 0
        for j in range(p0, p1):
            k, m = j - p0, n - j - 1
            owner = desc.owner(j)
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
            j2 = (j + 1) & ~1                            # even start: the Allreduce buffers stay aligned
            if lt < cols.size:
                xp.matmul(C[:, lt:], P[cols_x[lt:], k], out=ybuf)
            else:
                ybuf[j2:] = 0.0
            comm.Allreduce(ybuf[j2:], cvbuf[j2:])      # the only reduction of the column
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
        V[:, p0:p1] = P[:, :pw]
        lt = int(np.searchsorted(cols, p1))
        if lt < cols.size:
            # V W_g^T + W V_g^T as one GEMM: [V | W] [W_g | V_g]^T
            C[p1:, lt:] -= P[p1:] @ P[cols_x[lt:]][:, swap].T
    return d, e, V, tau


# -- stedc -----------------------------------------------------------------------------
DC_MIN_N = 4096   # stedc="auto" on GPUs: tridiag_dc from this n on (measured there), syevd below


def stedc_choice(where: str, n: int, device: bool, eigvecs: bool = True) -> str:
    """The tridiagonal solver stedc=`where` means for order n: "auto" is dc on GPUs from
    DC_MIN_N rows (2xH200, f47ea81: stedc at 4096 0.073 s vs the dense syevd's 0.112, at 8192
    0.157 vs 0.552), gpu below, host without GPUs."""
    if where not in ("auto", "host", "gpu", "dc"):
        raise ValueError(f"sygvd: stedc={where!r}: use 'auto', 'host', 'gpu' or 'dc'")
    if where != "auto":
        return where
    return ("dc" if n >= DC_MIN_N and eigvecs else "gpu") if device else "host"


def _stedc(d, e, desc: BlockCyclic, comm, xp, eigvecs: bool, where: str = "auto"):
    """w (replicated) and the owned columns of Z for T = Z diag(w) Z^T.

    where="host": LAPACK dstevd (divide and conquer) through scipy; "gpu" (device arrays only):
    cupy.linalg.eigh (cuSOLVER syevd) of the dense tridiagonal on rank 0's GPU; "dc": this
    package's divide and conquer (tridiag_dc.py) on the arrays' device (GEMMs and elementwise
    work instead of a dense solve).  "host" and "gpu" solve on rank 0 and Bcast [w, Z]; so does
    "dc" without eigenvectors, on one rank, or when T is one leaf.  Otherwise "dc" splits the
    tree's top merge over the ranks (_stedc_split)."""
    n, rank = desc.n, comm.Get_rank()
    where = stedc_choice(where, n, is_device(xp), eigvecs)
    if where == "dc" and eigvecs and comm.Get_size() >= 2:
        from .tridiag_dc import split_tree

        tree = split_tree(d, e, xp)   # d, e are replicated: every rank decides the same
        if tree is not None:
            return _stedc_split(tree, desc, comm, xp)
    if rank == 0:
        buf = xp.asarray(_pack_eigenpairs(*_solve_tridiagonal(d, e, xp, eigvecs, where)))
    else:
        buf = xp.empty(n + (n * n if eigvecs else 0), dtype=xp.float64)
    comm.Bcast(buf, root=0)
    return _owned_eigenpairs(buf, desc, rank, xp, eigvecs)


def _solve_tridiagonal(d, e, xp, eigvecs: bool, where: str):
    """(w, Z or None) of T = (d, e) on this rank alone: where = "dc", "gpu" or "host"."""
    n = d.shape[0]
    if where == "dc" and n > 1:
        from .tridiag_dc import eigh_tridiagonal_dc

        w, Z = eigh_tridiagonal_dc(d, e, xp)
        return w, (Z if eigvecs else None)
    if where == "gpu" and is_device(xp) and n > 1:
        if eigvecs:
            return xp.linalg.eigh(tridiagonal_matrix(xp, d, e))
        return xp.linalg.eigvalsh(tridiagonal_matrix(xp, d, e)), None
    if eigvecs:
        return tridiagonal_eigh(to_host(d), to_host(e))
    from scipy.linalg import eigh_tridiagonal

    return (eigh_tridiagonal(to_host(d), to_host(e), eigvals_only=True) if n > 1 else to_host(d)), None


def _stedc_split(tree, desc: BlockCyclic, comm, xp):
    """stedc="dc" on >= 2 ranks: rank 0 solves the tree's left half, rank 1 its right half (at
    the same time), each Bcasts its (w, Q), then every rank runs the top merge on the same bits
    and keeps its columns.  Against one rank solving all and Bcasting [w, Z]: the halves'
    solves overlap, and the two Bcasts carry about n^2 / 2 doubles instead of n^2.

    The merge is deterministic (tridiag_dc: fixed-order reductions, no atomics), so the ranks
    should agree; a digest of w and of Z's first and last rows checks it.  If they do not,
    every rank takes rank 0's full [w, Z] by one more Bcast (the old path) and warns: the
    result is never silently different across ranks."""
    from .tridiag_dc import merge_halves, solve_half

    rank = comm.Get_rank()
    rows = [b - a for a, b in (tree.half_rows(half) for half in (0, 1))]
    # rank h solves half h before either Bcast, so ranks 0 and 1 solve at the same time
    bufs = [_pack_eigenpairs(*solve_half(tree, half, xp)) if half == rank
            else xp.empty(m * (m + 1), dtype=xp.float64) for half, m in enumerate(rows)]
    halves = []
    for half, buf in enumerate(bufs):
        comm.Bcast(buf, root=half)
        halves.append(_unpack_eigenpairs(buf, rows[half]))
    del bufs
    w, Z = merge_halves(tree, *halves, xp)
    del halves
    digests = _digests(comm, xp, w, Z[0], Z[-1])
    if len(set(digests)) > 1:
        warnings.warn(f"sygvd: stedc's top merge gave different bits on the ranks (SHA-256 per rank: "
                      f"{', '.join(d[:12] for d in digests)}); using rank 0's [w, Z], one more Bcast",
                      RuntimeWarning, stacklevel=2)
        buf = _pack_eigenpairs(w, Z)
        del w, Z
        comm.Bcast(buf, root=0)
        return _owned_eigenpairs(buf, desc, rank, xp, True)
    return w, _owned_columns(Z, desc, rank, xp)


def _pack_eigenpairs(w, Z=None):
    """[w, Z in F order] in one buffer of w's array module: what a Bcast of eigenpairs carries."""
    xp = get_xp(w)
    n = w.shape[0]
    buf = xp.empty(n + (n * n if Z is not None else 0), dtype=xp.float64)
    buf[:n] = w
    if Z is not None:
        buf[n:].reshape((n, n), order="F")[...] = Z
    return buf


def _unpack_eigenpairs(buf, n: int):
    """(w, Z) views of a _pack_eigenpairs buffer with n eigenpairs."""
    return buf[:n], buf[n:].reshape((n, n), order="F")


def _owned_eigenpairs(buf, desc: BlockCyclic, rank: int, xp, eigvecs: bool):
    """w (a copy) and rank's columns of Z (F order; None without eigvecs) from a packed buffer."""
    if not eigvecs:
        return buf[:desc.n].copy(), None
    w, Z = _unpack_eigenpairs(buf, desc.n)
    return w.copy(), _owned_columns(Z, desc, rank, xp)


def _owned_columns(Z, desc: BlockCyclic, rank: int, xp):
    """rank's columns of the replicated Z, F order."""
    return xp.asfortranarray(Z[:, xp.asarray(desc.local_cols(rank))])


# -- ormtr -----------------------------------------------------------------------------
ORMTR_BLOCK = 256  # reflectors per compact-WY block: nb = 64 made 128 skinny GEMM pairs at 8192


def _ormtr(V, tau, Z, desc: BlockCyclic, xp, block: int = ORMTR_BLOCK):
    """Q Z for Q = H_0 H_1 ... H_{n-2} on the owned columns Z (local, no communication).

    V is replicated, so the blocks need not follow the layout's nb: `block` reflectors at a
    time (wider blocks, fatter GEMMs; the triangular solve stays block x block).
    Per block of reflectors (unit lower trapezoidal Vb, scalars tau): H_p0 ... H_p1-1 =
    I - Vb T Vb^T with T^-1 = diag(1/tau) + striu(Vb^T Vb) (the UT transform: the inverse of
    LAPACK larft's recurrence, step for step), so Z -= Vb (M^-1 (Vb^T Z)) with one triangular
    solve by M = T^-1 - all on the arrays' device, no host round trip per panel (the larft
    recurrence on the host cost a device sync and ~64 small host products per panel).  A
    reflector with tau = 0 is the identity: its column of Vb is zeroed and its diagonal of M
    set to 1, which leaves it out."""
    n = desc.n
    if block < 1:
        raise ValueError(f"_ormtr: block={block}: use a positive number of reflectors")
    Z = Z.copy(order="F")
    starts = list(range(0, max(n - 1, 0), block))
    for p0 in reversed(starts):
        p1 = min(p0 + block, n - 1)
        t = tau[p0:p1]
        live = t != 0
        Vb = V[p0 + 1:, p0:p1] * live[None, :]
        M = xp.triu(Vb.T @ Vb, 1)
        M[xp.diag_indices(p1 - p0)] = 1.0 / xp.where(live, t, 1.0)
        Zb = Z[p0 + 1:]
        Zb -= Vb @ trsm(xp, M, Vb.T @ Zb, lower=False)
    return Z


def solve_distributed(A_global, B_global, comm, *, nb: int = 64, eigvecs: bool = True, timer=None,
                      stedc: str = "auto"):
    """Convenience: distribute replicated A, B, solve, and return (w, X_local, desc)."""
    from .layout import distribute

    desc = BlockCyclic(A_global.shape[0], A_global.shape[1], nb, comm.Get_size())
    rank = comm.Get_rank()
    w, X = sygvd(distribute(A_global, desc, rank), distribute(B_global, desc, rank), desc, comm,
                 eigvecs=eigvecs, timer=timer, stedc=stedc)
    return w, X, desc


__all__ = ["sygvd", "solve_distributed", "PHASES", "NotPositiveDefinite", "sync"]
