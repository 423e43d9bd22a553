"""A subset of the tridiagonal eigenpairs, w[lo..hi] and their vectors, at a cost proportional
to k = hi - lo + 1: bisection (LAPACK dstebz) for the eigenvalues, inverse iteration (LAPACK
dstein) for the vectors, as LAPACK's dsyevx / dsygvx and ScaLAPACK's pdsyevx do.

Why bisection and inverse iteration, not MRRR (dstemr):
  - accuracy: bisection on Sturm counts finds each eigenvalue to the absolute accuracy
    eps ||T|| (ABSTOL = 0, dstebz's default and the accuracy of the full solve), whatever the
    subset; inverse iteration then gives residuals ||T z - w z|| = O(eps ||T||).
  - orthogonality: dstein reorthogonalizes (modified Gram-Schmidt, every iteration) each vector
    against the earlier ones of its cluster -- neighbours closer than 1e-3 ||T||_1 in one
    unreduced block -- so the vectors of tight clusters are orthogonal to O(eps), and the
    vectors of different clusters are orthogonal through the gap between them.  MRRR needs no
    reorthogonalization but its orthogonality rests on finding relatively robust
    representations, which fails on some matrices (glued Wilkinson-type and tightly clustered
    spectra: the problems this solver is tested on) with losses of orders of magnitude.
  - it is what SciPy's eigh(a, b, subset_by_index=...) runs (dsygvx): the reference the tests
    compare with.
  - distribution: eigenvalue j's vector needs only w and T, so the clusters are dealt to the
    ranks, each cluster whole to one rank (its reorthogonalization stays local).
  The price: a cluster of c vectors costs O(c^2 n), so a subset that is one huge cluster runs
  on one rank in O(k^2 n) time.

Distribution (P ranks, T = (d, e) replicated, the same bits on every rank):
  1. rank 0 runs dstebz once (ORDER='B': by unreduced block, ascending within each) and one
     Bcast of k + k + n values gives every rank w, the blocks of the eigenvalues and T's
     splitting: w is the same bits on every rank.
  2. the clusters (above) in that order are dealt to the ranks as contiguous runs of about k/P
     vectors; each rank calls dstein once per cluster on the cluster's block of T (each call
     starts dstein's random starting vectors afresh, so a vector depends on its cluster only,
     not on P).
  3. the eigenpairs are sorted ascending (stable) and one Alltoallv puts the k vectors into
     the owned columns of the n x k matrix in BlockCyclic(n, k, nb, P) -- the layout of the
     first k columns of the full solve's X.
This is the host path; on GPUs stein_device.stein_subset_device does the same steps with
device kernels (bisection, and inverse iteration with each cluster's vectors iterated together)
and the same dealing of clusters to ranks.  A vector that dstein does not converge (5 iterations) is
returned as NaN, which the driver's finiteness check reports on every rank."""
from __future__ import annotations

import numbers

import numpy as np

from ._xp import get_xp, to_host
from .layout import BlockCyclic

ORTHO_TOL = 1e-3   # dstein's ODM3: eigenvalues closer than this times ||T_block||_1 form a cluster


def subset_record(subset_by_index) -> tuple[float, float]:
    """(lo, hi) as floats for the ranks' agreement record: NaN where subset_by_index is not a
    pair of integers, -1 for None (no subset)."""
    if subset_by_index is None:
        return -1.0, -1.0
    try:
        lo, hi = subset_by_index
    except (TypeError, ValueError):
        return np.nan, np.nan
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in (lo, hi)):
        return np.nan, np.nan
    return float(lo), float(hi)


def subset_problem(lo: float, hi: float, n: int, given=None) -> str | None:
    """What is wrong with the subset (lo, hi) of subset_record for an n x n problem, or None."""
    shown = f"subset_by_index={given!r}" if given is not None else f"subset_by_index=({lo:g}, {hi:g})"
    if np.isnan(lo) or np.isnan(hi):
        return f"{shown}: pass a pair of integers (lo, hi), 0 <= lo <= hi <= n - 1 = {n - 1}"
    if lo > hi:
        return f"{shown}: lo > hi; pass 0 <= lo <= hi <= n - 1 = {n - 1} (both inclusive)"
    if lo < 0 or hi > n - 1:
        return f"{shown}: out of range for n = {n}; pass 0 <= lo <= hi <= {n - 1} (both inclusive)"
    return None


def stein_subset(d, e, lo: int, hi: int, nb: int, comm, xp, vectors: bool = True):
    """w[lo..hi] of T = (d, e) (replicated, ascending, the same bits on every rank) and, with
    vectors, the rank's columns (n x numroc(k, nb, rank, P), F order, arrays of xp) of the n x k
    eigenvector matrix Z in BlockCyclic(n, k, nb, P); else (w, None)."""
    rank, P = comm.Get_rank(), comm.Get_size()
    dh, eh = to_host(d).astype(np.float64), to_host(e).astype(np.float64)
    n, k = dh.shape[0], hi - lo + 1
    # one Bcast: w (k), the eigenvalues' blocks (k, 1-based), T's block ends (n; 0 past the last)
    table = np.zeros(2 * k + n)
    if rank == 0:
        table[:] = _bisect(dh, eh, lo, hi)
    buf = xp.asarray(table)
    comm.Bcast(buf, root=0)
    table = to_host(buf)
    wb, iblock, isplit = table[:k], table[k:2 * k].astype(np.int64), table[2 * k:].astype(np.int64)
    order = np.argsort(wb, kind="stable")          # block order -> ascending
    w = xp.asarray(wb[order])
    if not vectors:
        return w, None
    starts = np.concatenate([[0], isplit[:int(np.count_nonzero(isplit)) - 1]])   # block b's first row: starts[b - 1]
    clusters = _clusters(dh, eh, wb, iblock, starts, isplit)
    first = np.array([c0 for c0, _ in clusters], dtype=np.int64)
    who = first * P // k                            # rank of each cluster: contiguous runs of ~k/P vectors
    maker = np.empty(k, dtype=np.int64)              # the rank computing vector i (block order)
    for (c0, c1), r in zip(clusters, who):
        maker[c0:c1] = r
    Zmine = np.zeros((n, int(np.count_nonzero(maker == rank))), order="F")
    at = 0
    for (c0, c1), r in zip(clusters, who):
        if r != rank:
            continue
        b = int(iblock[c0])
        r0, r1 = int(starts[b - 1]), int(isplit[b - 1])
        Zmine[r0:r1, at:at + c1 - c0] = _stein_block(dh[r0:r1], eh[r0:r1 - 1], wb[c0:c1])
        at += c1 - c0
    return w, _to_block_cyclic(Zmine, order, maker, n, k, nb, comm, xp)


def _bisect(d, e, lo: int, hi: int) -> np.ndarray:
    """dstebz for eigenvalues lo..hi (0-based), ORDER='B', ABSTOL=0: the Bcast table of
    stein_subset.  Where dstebz cannot find eigenvalues lo..hi by index (INFO = 2 or 3: Sturm
    counts not monotonic in floating point, as in a cluster of eigenvalues a few ulp apart), all
    n eigenvalues (RANGE='A', LAPACK's documented cure) and those with ascending indices lo..hi
    among them, kept in block order."""
    from scipy.linalg.lapack import dstebz

    n, k = d.shape[0], hi - lo + 1
    if n == 1:
        return np.concatenate([d, [1.0], [1.0]])
    m, w, iblock, isplit, info = dstebz(d, e, 3, 0.0, 0.0, lo + 1, hi + 1, 0.0, "B")
    if info in (2, 3) or (info == 0 and m != k):
        m, w, iblock, isplit, info = dstebz(d, e, 0, 0.0, 0.0, 1, n, 0.0, "B")   # range 0: all
        if info == 0 and m == n:
            pick = np.sort(np.argsort(w[:n], kind="stable")[lo:hi + 1])   # indices lo..hi, block order
            w, iblock, m = w[pick], iblock[pick], k
    if info != 0 or m != k:
        raise ArithmeticError(f"stein_subset: LAPACK dstebz returned info={info}, {m} eigenvalues for {k} asked")
    ends = np.asarray(isplit[:int(np.argmax(isplit == n)) + 1], dtype=np.float64)
    out = np.zeros(2 * k + n)
    out[:k], out[k:2 * k], out[2 * k:2 * k + ends.size] = w[:k], iblock[:k], ends
    return out


def _clusters(d, e, w, iblock, starts, ends) -> list[tuple[int, int]]:
    """[(c0, c1)] ranges of w (block order) that dstein would reorthogonalize together:
    neighbours in one block closer than ORTHO_TOL ||T_block||_1."""
    k = w.shape[0]
    tol = {}
    for b in np.unique(iblock):
        r0, r1 = int(starts[b - 1]), int(ends[b - 1])
        rowsum = np.abs(d[r0:r1]).copy()
        if r1 - r0 > 1:
            off = np.abs(e[r0:r1 - 1])
            rowsum[:-1] += off
            rowsum[1:] += off
        tol[int(b)] = ORTHO_TOL * float(rowsum.max())
    cuts = [0]
    for i in range(1, k):
        if iblock[i] != iblock[i - 1] or w[i] - w[i - 1] > tol[int(iblock[i])]:
            cuts.append(i)
    cuts.append(k)
    return list(zip(cuts[:-1], cuts[1:]))


def _stein_block(d, e, w) -> np.ndarray:
    """dstein's eigenvectors (len(d) x len(w)) of the unreduced tridiagonal block (d, e) for its
    eigenvalues w (ascending, one cluster); NaN columns where it did not converge."""
    from scipy.linalg.lapack import dstein

    nb = d.shape[0]
    if nb == 1:
        return np.ones((1, w.shape[0]))
    iblock = np.ones(nb, dtype=np.int32)
    isplit = np.zeros(nb, dtype=np.int32)
    isplit[0] = nb
    wpad = np.asarray(w, dtype=np.float64)
    z, info = dstein(d, e, wpad, iblock, isplit)
    z = np.asarray(z[:, :w.shape[0]])
    if info > 0:   # info vectors failed to converge (LAPACK lists them in ifail, not returned here)
        z = np.full_like(z, np.nan)
    elif info < 0:
        raise ValueError(f"stein_subset: LAPACK dstein argument {-info} is invalid")
    return z


def _to_block_cyclic(Zmine, order, maker, n: int, k: int, nb: int, comm, xp):
    """The rank's columns of the n x k matrix in BlockCyclic(n, k, nb, P) from the columns each
    rank computed: Zmine holds, in block order, the vectors i with maker[i] == rank; column j of
    the result is vector order[j].  One Alltoallv (none on one rank).  Zmine may be a host or a
    device array (stein_device computes it on the GPU)."""
    rank, P = comm.Get_rank(), comm.Get_size()
    zx = get_xp(Zmine)
    desc = BlockCyclic(n, k, nb, P)
    where = np.empty(k, dtype=np.int64)            # vector i (block order) -> its column in Zmine
    for r in range(P):
        ids = np.flatnonzero(maker == r)
        where[ids] = np.arange(ids.size)
    src = maker[order]                              # column j's maker
    if P == 1:
        return xp.asarray(zx.asfortranarray(Zmine[:, zx.asarray(where[order])]))
    # to rank q: the columns q owns that this rank made, ascending j
    sends = [order[desc.local_cols(q)[src[desc.local_cols(q)] == rank]] for q in range(P)]
    send = zx.asfortranarray(zx.concatenate([Zmine[:, zx.asarray(where[s])] for s in sends], axis=1)) if k else Zmine
    mycols = desc.local_cols(rank)
    recv_from = [np.flatnonzero(src[mycols] == r) for r in range(P)]   # my local positions, by maker
    sbuf = xp.asarray(send.reshape(-1, order="F"))
    rbuf = xp.empty(n * mycols.size, dtype=xp.float64)
    comm.Alltoallv((sbuf, [n * s.size for s in sends]), (rbuf, [n * p.size for p in recv_from]))
    del sbuf
    out = xp.empty((n, mycols.size), dtype=xp.float64, order="F")
    at = 0
    for pos in recv_from:
        if pos.size:
            out[:, xp.asarray(pos)] = rbuf[at:at + n * pos.size].reshape((n, pos.size), order="F")
        at += n * pos.size
    return out
