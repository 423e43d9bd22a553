"""The tridiagonal subset of stein.py on the GPU: w[lo..hi] of T = (d, e) by bisection on Sturm
counts (LAPACK dstebz's arithmetic) and their vectors by inverse iteration (LAPACK dstein's),
kernels in stein_kernels.cu, their NumPy twin in stein_twin.py.

Eigenvalues (bisect_device): one thread per wanted eigenvalue j bisects (a, b], count(a) <= j <
count(b), where count(x) is the number of negative pivots of T' - x I (T' is T with dstebz's
negligible e_i, e_i^2 < |d_i d_i+1| ulp^2 + safemin, set to zero; pivots within pivmin =
safemin max(1, max e_i^2) of zero count as negative).  It starts from T's Gershgorin interval
widened as dstebz widens it and accepts an interval as dlaebz does, at width
    b - a < max(abstol, pivmin, 2 ulp max(|a|, |b|)),   abstol = ulp max(|gl|, |gu|)
(dstebz's ABSTOL = 0 criterion).  The counts in (a, b] block by block then name the unreduced
block the eigenvalue belongs to, and a second bisection on that block alone brings it to the
block's own tolerance (gl, gu the block's Gershgorin bounds), as dstebz bisects block by
block: a small block split off a large T gets its eigenvalues to its own scale, which its
vectors need.  w_j = (a + b) / 2, an absolute error of about one ulp ||T_block||.  Equal
eigenvalues come out right because the bisection is by index: each thread keeps the interval
holding its own index.  Values of different blocks closer than the whole matrix's tolerance
may come out of order and are sorted (stably).

Vectors (stein_device): as dstein per unreduced block of T' (the vectors zero outside it), with
dstein's clusters (neighbours in a block closer than 1e-3 ||T_block||_1, stein.ORTHO_TOL) and
its steps per vector: the LU factors of T_block - x_j I with partial pivoting (dlagtf; x_j
perturbed by 10 ulp |x_j| off an equal neighbour), a start vector (a fixed hash of the
eigenvalue's index: deterministic, the same on any rank), up to MAXITS solves (dlagts, JOB=-1)
each followed by the Gram-Schmidt of the cluster, accepted when the growth test
||x||_inf >= sqrt(0.1 / m) has passed EXTRA + 1 times, NaN where it has not.

Where it departs from dstein: dstein runs a cluster's vectors one after another (vector j
iterates against the final vectors before it), a chain of ~3 c sequential tridiagonal solves for
a cluster of c.  Clusters are large in practice (n = 16384: the lowest tenth of a random
tridiagonal's spectrum holds clusters of hundreds of vectors, that of problems.spread_spectrum
is one cluster) and a GPU thread runs a sequential solve far slower than a CPU core.  Here the
vectors of a cluster iterate together: each step solves all of them at once (one thread per
vector), then orthonormalizes the cluster's iterates in order -- the same Gram-Schmidt of each
iterate against the cluster's earlier vectors, now this step's -- modified Gram-Schmidt in one
block per cluster below QR_FROM vectors, Householder QR (cuSOLVER) from there.  A cluster
steps until every vector's growth test has passed EXTRA + 1 times (at most MAXITS steps).
The error analysis is dstein's: the last step's solve leaves each iterate's residual at
O(eps ||T||), removing the components along the cluster's other vectors changes it by
(overlap) x (eigenvalue gap) = O(eps ||T||), and the orthonormalization is the last operation.

Deterministic: no atomics, fixed reduction orders, no fused multiply-add in the kernels
(stein_kernels.cu), so the GPU's results are the twin's bits except where cuSOLVER's QR runs
(its own fixed order).  T must be scaled as the driver scales it (scaling.py): like dstebz,
bisection needs the e_i^2 finite."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._xp import raw_module, to_host
from .stein import ORTHO_TOL, _to_block_cyclic

# LAPACK's machine constants (dlamch) and the parameters of dstebz and dstein
ULP = 2.0 ** -52          # dlamch('P'): eps * base
EPS = 2.0 ** -53          # dlamch('E'): the unit roundoff (dlagtf, dlagts)
SAFEMIN = 2.0 ** -1022    # dlamch('S')
BIGNUM = 1.0 / SAFEMIN
FUDGE, RELFAC = 2.1, 2.0  # dstebz: the Gershgorin interval's widening, the relative tolerance's factor
MAXITS, EXTRA = 5, 2      # dstein: solves per vector at most; solves after the growth test first passes
DONE = EXTRA + 1          # growth tests passed by an accepted vector
ODM1 = 0.1                # dstein's growth threshold is sqrt(ODM1 / m)
# Clusters of at least this many vectors are orthonormalized by Householder QR (cuSOLVER) instead
# of one thread block's modified Gram-Schmidt (O(c^2 m) work on one multiprocessor).
QR_FROM = 32
# The LU factors of the vectors in flight take 33 n bytes each (four n x K doubles, the pivots);
# vectors go in batches of whole clusters within this budget; a larger cluster goes alone, its
# factors made again at each step for a budget's worth of vectors at a time.
WORK_BYTES = 1 << 30
TPB = 256                 # stein_orth's block (a power of two: its reduction tree)
THREADS = 128             # the one-thread-per-item kernels' block


# -- the setup both the kernels and the twin use ----------------------------------------------
@dataclass
class Sturm:
    """T' for the Sturm counts: e2 (e_i^2, 0 at dstebz's splits) and the bisection's scalars."""

    e2: object
    gl: float
    gu: float
    pivmin: float
    abstol: float
    reltol: float
    itmax: int


def sturm_setup(xp, d, e) -> Sturm | None:
    """Sturm of T = (d, e) (arrays of xp, n >= 2), or None where T is not finite."""
    n = d.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        e2 = e * e
        split = xp.abs(d[1:] * d[:-1]) * (ULP * ULP) + SAFEMIN > e2     # dstebz's test, elementwise
        e2 = xp.where(split, 0.0, e2)
        ae = xp.where(split, 0.0, xp.abs(e))
        left = xp.concatenate([xp.zeros(1), ae])
        right = xp.concatenate([ae, xp.zeros(1)])
        gu = float(((d + left) + right).max())                      # Gershgorin of T'
        gl = float(((d - left) - right).min())
        pivmin = max(1.0, float(e2.max())) * SAFEMIN
    if not all(math.isfinite(v) for v in (gu, gl, pivmin)):
        return None
    tnorm = max(abs(gl), abs(gu))
    gl = gl - FUDGE * tnorm * ULP * n - FUDGE * 2.0 * pivmin            # dstebz's widening
    gu = gu + FUDGE * tnorm * ULP * n + FUDGE * pivmin
    span = gu - gl + pivmin                       # halvings to below pivmin (2100: any finite span)
    itmax = (int((math.log(span) - math.log(pivmin)) / math.log(2.0)) if math.isfinite(span) else 2100) + 2
    return Sturm(e2, gl, gu, pivmin, ULP * max(abs(gl), abs(gu)), ULP * RELFAC, itmax)


@dataclass
class Plan:
    """The vectors in block order (by block, ascending within): position p is eigenvalue
    asc[p] of the subset; pos is asc's inverse.  Per position: the block's rows [first, end),
    the shift, the global index (the start vector's seed), ||T_block||_1, dstein's growth
    threshold; the clusters are positions [cstart[c], cend[c])."""

    asc: np.ndarray
    pos: np.ndarray
    first: np.ndarray
    end: np.ndarray
    shift: np.ndarray
    index: np.ndarray
    onenrm: np.ndarray
    dtpcrt: np.ndarray
    cstart: np.ndarray
    cend: np.ndarray


def make_plan(d, e, w, first, end, lo: int) -> Plan:
    """Plan of the host arrays w (ascending), first, end (bisect's blocks) for eigenvalues
    lo, lo + 1, ... of T = (d, e)."""
    n, k = d.shape[0], w.shape[0]
    asc = np.argsort(first, kind="stable")
    pos = np.empty(k, dtype=np.int64)
    pos[asc] = np.arange(k)
    f, en, wb = first[asc], end[asc], w[asc]
    # dstein's ONENRM: the largest row sum |d_i| + |e_i-1| + |e_i| of the block, its own e only
    cut = np.zeros(max(n - 1, 0), dtype=bool)
    cut[f[f > 0] - 1] = True
    cut[en[en < n] - 1] = True
    ae = np.abs(e)
    left = np.concatenate([[0.0], np.where(cut, 0.0, ae)])
    right = np.concatenate([np.where(cut, 0.0, ae), [0.0]])
    rowsum = (np.abs(d) + left) + right
    starts = np.unique(np.concatenate([[0], f, en[en < n]]))
    blockmax = np.maximum.reduceat(rowsum, starts)
    onenrm = np.where(en - f > 1, blockmax[np.searchsorted(starts, f)], 0.0)
    # dstein: an eigenvalue within 10 ulp |x| of its (perturbed) neighbour in the block is moved up
    shift = wb.copy()
    same = np.zeros(k, dtype=bool)
    same[1:] = f[1:] == f[:-1]
    if k > 1 and np.any(same[1:] & (wb[1:] - wb[:-1] < 10.0 * np.abs(ULP * wb[1:]))):
        x = shift.tolist()
        for j in range(1, k):
            pertol = 10.0 * abs(ULP * x[j])
            if same[j] and x[j] - x[j - 1] < pertol:
                x[j] = x[j - 1] + pertol
        shift = np.array(x)
    newc = ~same
    newc[1:] |= np.abs(shift[1:] - shift[:-1]) > ORTHO_TOL * onenrm[1:]
    cstart = np.flatnonzero(newc)
    cend = np.append(cstart[1:], k)
    dtpcrt = np.sqrt(ODM1 / (en - f).astype(np.float64))
    return Plan(asc, pos, f, en, shift, lo + asc, onenrm, dtpcrt, cstart, cend)


# -- the iteration, on either the kernels or the twin ----------------------------------------
def run_clusters(ops, d, e, plan: Plan, clusters, Y, qr_from: int = QR_FROM, cap: int | None = None) -> None:
    """The vectors of the clusters `clusters` (indices into plan's, consecutive positions) into
    Y's columns (n x K, F order, zeros; K their vectors, in block order), with ops the kernels
    (DeviceOps) or their twin.  The LU factors of at most `cap` vectors are held at a time: with
    more (one cluster larger than cap), each step factors and solves cap vectors at a time."""
    xp = ops.xp
    c0, c1 = plan.cstart[clusters[0]], plan.cend[clusters[-1]]
    sl = slice(c0, c1)
    cs, ce = plan.cstart[clusters] - c0, plan.cend[clusters] - c0
    first, end = plan.first[sl], plan.end[sl]
    K = int(c1 - c0)
    put = {name: xp.asarray(getattr(plan, name)[sl]) for name in ("first", "end", "shift", "index", "onenrm",
                                                                   "dtpcrt")}
    chunks = [(a, min(a + (cap or K), K)) for a in range(0, K, cap or K)]
    lu = ops.factor(d, e, put, Y, True) if len(chunks) == 1 else None
    put["cstart"], put["cend"] = xp.asarray(cs), xp.asarray(ce)
    nrmchk = xp.asarray(np.where(end - first == 1, DONE, 0).astype(np.int32))
    active = end[cs] - first[cs] > 1                 # a block of one row: its vector is e_r0 already
    sizes = ce - cs
    for step in range(MAXITS):
        if not active.any():
            break
        on = xp.asarray(np.repeat(active, sizes).astype(np.int32))
        if lu is not None:
            expo = ops.solve(put, lu, Y, on)
        else:                                        # factors of one chunk at a time, made again each step
            expo = xp.zeros(K, dtype=xp.int32)
            for a, b in chunks:
                part = {name: put[name][a:b] for name in ("first", "end", "shift", "index", "onenrm")}
                expo[a:b] = ops.solve(part, ops.factor(d, e, part, Y[:, a:b], step == 0), Y[:, a:b], on[a:b])
        ops.orth(put, xp.asarray(active.astype(np.int32)), qr_from, expo, nrmchk, Y)
        for c in np.flatnonzero(active & (sizes >= qr_from)):
            _qr_cluster(xp, Y, int(first[cs[c]]), int(end[cs[c]]), int(cs[c]), int(ce[c]), put["dtpcrt"], expo,
                        nrmchk)
        bad = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum((nrmchk < DONE).astype(xp.int64))])
        active = to_host(bad[put["cend"]] - bad[put["cstart"]] > 0)
    ops.finish(put, nrmchk, Y)


def _qr_cluster(xp, Y, r0: int, r1: int, j0: int, j1: int, dtpcrt, expo, nrmchk) -> None:
    """stein_orth's step for the large cluster of columns [j0, j1) (rows [r0, r1)) by
    Householder QR: Q R = Y, the iterates after Gram-Schmidt are R_jj q_j (q_j signed so that
    R_jj > 0), and ||R_jj q_j||_inf is the growth test's norm."""
    Q, R = xp.linalg.qr(Y[r0:r1, j0:j1])
    rjj = xp.diagonal(R)
    Q *= xp.where(rjj < 0, -1.0, 1.0)
    grown = xp.abs(rjj) * xp.abs(Q).max(axis=0) >= xp.ldexp(dtpcrt[j0:j1], -expo[j0:j1])
    nrmchk[j0:j1] += grown.astype(xp.int32)
    Y[r0:r1, j0:j1] = Q


class DeviceOps:
    """The kernels of stein_kernels.cu on the current device (CuPy arrays)."""

    def __init__(self):
        import cupy

        self.xp = cupy
        self.mod = raw_module("stein_kernels.cu")

    def _grid(self, count: int):
        return (max(1, -(-count // THREADS)),), (THREADS,)

    def bisect(self, d, e, st: Sturm, lo: int, k: int):
        cp = self.xp
        w = cp.empty(k)
        first, end = cp.zeros(k, dtype=cp.int64), cp.zeros(k, dtype=cp.int64)
        flag = cp.zeros(k, dtype=cp.int32)
        self.mod.get_function("stein_bisect")(
            *self._grid(k), (d, e, st.e2, np.int64(d.shape[0]), np.int64(lo), np.int64(k), np.float64(st.gl),
                             np.float64(st.gu), np.float64(st.pivmin), np.float64(st.abstol), np.float64(st.reltol),
                             np.float64(ULP), np.float64(FUDGE), np.int32(st.itmax), w, first, end, flag))
        return w, first, end, flag

    def factor(self, d, e, put, Y, start: bool):
        cp = self.xp
        n, K = d.shape[0], put["first"].shape[0]
        lu = {name: cp.empty(n * K) for name in ("A", "B", "C", "DD")}
        lu["piv"] = cp.empty(n * K, dtype=cp.int8)
        lu["tol"], lu["ulast"] = cp.empty(K), cp.empty(K)
        self.mod.get_function("stein_factor")(
            *self._grid(K), (d, e, np.int64(n), np.int64(K), put["first"], put["end"], put["shift"], put["index"],
                             np.int32(start), np.float64(EPS), lu["A"], lu["B"], lu["C"], lu["DD"], lu["piv"],
                             lu["tol"], lu["ulast"], Y))
        return lu

    def solve(self, put, lu, Y, active):
        cp = self.xp
        n, K = Y.shape
        expo = cp.zeros(K, dtype=cp.int32)
        self.mod.get_function("stein_solve")(
            *self._grid(K), (np.int64(n), np.int64(K), put["first"], put["end"], lu["A"], lu["B"], lu["C"], lu["DD"],
                             lu["piv"], lu["tol"], lu["ulast"], put["onenrm"], active, np.float64(ULP),
                             np.float64(SAFEMIN), np.float64(BIGNUM), Y, expo))
        return expo

    def orth(self, put, active, qr_from: int, expo, nrmchk, Y):
        count = put["cstart"].shape[0]
        self.mod.get_function("stein_orth")(
            (count,), (TPB,), (np.int64(Y.shape[0]), put["cstart"], put["cend"], active, np.int64(qr_from),
                               put["first"], put["end"], put["dtpcrt"], expo, nrmchk, Y), shared_mem=TPB * 8)

    def finish(self, put, nrmchk, Y):
        n, K = Y.shape
        self.mod.get_function("stein_finish")(
            *self._grid(K), (np.int64(n), np.int64(K), put["first"], put["end"], nrmchk, np.int32(DONE), Y))


# -- the entry points ------------------------------------------------------------------------
def _check_range(n: int, lo: int, hi: int, who: str) -> None:
    if not (0 <= lo <= hi <= n - 1):
        raise ValueError(f"{who}: lo={lo}, hi={hi} for n = {n}: pass 0 <= lo <= hi <= n - 1 (both inclusive)")


def bisect_blocks(ops, d, e, lo: int, hi: int, blocks: bool = True):
    """(w, first, end) of eigenvalues lo..hi of T = (d, e) (arrays of ops.xp): w ascending, and
    with blocks the rows [first, end) of each one's unreduced block (else None, None).  NaN
    eigenvalues where T is not finite; ArithmeticError where the bisection failed (flag)."""
    xp, n, k = ops.xp, d.shape[0], hi - lo + 1
    _check_range(n, lo, hi, "bisect")
    d, e = xp.ascontiguousarray(d, dtype=xp.float64), xp.ascontiguousarray(e, dtype=xp.float64)
    if n == 1:                                       # dstebz's special case: w = d
        one = xp.ones(k, dtype=xp.int64)
        return xp.array(d[lo:hi + 1], dtype=xp.float64), one - 1, one
    st = sturm_setup(xp, d, e)
    if st is None:
        return xp.full(k, xp.nan), xp.zeros(k, dtype=xp.int64), xp.full(k, n, dtype=xp.int64)
    w, first, end, flag = ops.bisect(d, e, st, lo, k)
    bad = int(flag.max())
    if bad:
        why = {1: "the widened Gershgorin interval does not hold every eigenvalue",
               2: f"an interval did not converge in {st.itmax} halvings",
               4: "an eigenvalue was found in no block",
               8: "a block's interval does not hold its eigenvalue"}
        raise ArithmeticError("bisect: " + "; ".join(v for b, v in why.items() if bad & b))
    # each block's eigenvalues are ascending; blocks' values within the whole matrix's tolerance
    # of each other may not be: a stable sort (the identity where they are)
    order = xp.argsort(w, kind="stable") if xp is np else xp.argsort(w)   # CuPy's sort is stable
    w = w[order]
    return (w, first[order], end[order]) if blocks else (w, None, None)


def bisect_device(d, e, lo: int, hi: int):
    """Eigenvalues lo..hi (0-based, inclusive) of T = (d, e), CuPy float64, ascending (CuPy)."""
    return bisect_blocks(DeviceOps(), d, e, lo, hi, blocks=False)[0]


def stein_device(d, e, w, first, end, lo: int, *, qr_from: int = QR_FROM, work_bytes: int = WORK_BYTES):
    """n x k eigenvectors (CuPy, F order; NaN columns that did not converge) of T = (d, e) for
    its eigenvalues w = lo, lo + 1, ... (ascending) and their blocks [first, end), all as
    bisect_blocks(DeviceOps(), d, e, lo, hi) returns them."""
    return eigenvectors(DeviceOps(), d, e, w, first, end, lo, qr_from=qr_from, work_bytes=work_bytes)


def eigenvectors(ops, d, e, w, first, end, lo: int, *, qr_from: int = QR_FROM, work_bytes: int = WORK_BYTES):
    """stein_device on ops (the kernels or their twin)."""
    d, e = ops.xp.ascontiguousarray(d, dtype=ops.xp.float64), ops.xp.ascontiguousarray(e, dtype=ops.xp.float64)
    plan = make_plan(to_host(d), to_host(e), to_host(w), to_host(first), to_host(end), lo)
    everything = np.arange(plan.cstart.shape[0])
    return _ascending(ops.xp, _run_batches(ops, d, e, plan, everything, work_bytes, qr_from), plan.pos)


def _ascending(xp, Z, pos):
    """Z's columns (block order) in ascending order: column j is Z's column pos[j]."""
    if np.array_equal(pos, np.arange(pos.shape[0])):
        return Z
    return xp.asfortranarray(Z[:, xp.asarray(pos)])


def _run_batches(ops, d, e, plan: Plan, clusters, work_bytes: int, qr_from: int):
    """The vectors of `clusters` (consecutive), n x (their vectors) in block order, in batches
    of whole clusters of at most work_bytes // (33 n) vectors (a larger cluster alone, its
    factors made in chunks of that many)."""
    xp, n = ops.xp, d.shape[0]
    count = int(plan.cend[clusters].sum() - plan.cstart[clusters].sum()) if len(clusters) else 0
    Z = xp.zeros((n, count), order="F")
    cap, at, i = max(1, work_bytes // (33 * n)), 0, 0
    while i < len(clusters):
        j = i + 1
        while j < len(clusters) and plan.cend[clusters[j]] - plan.cstart[clusters[i]] <= cap:
            j += 1
        size = int(plan.cend[clusters[j - 1]] - plan.cstart[clusters[i]])
        run_clusters(ops, d, e, plan, clusters[i:j], Z[:, at:at + size], qr_from, cap)
        at, i = at + size, j
    return Z


def stein_subset_device(d, e, lo: int, hi: int, nb: int = 1, comm=None, xp=None, vectors: bool = True, *,
                        ops=None, qr_from: int = QR_FROM, work_bytes: int = WORK_BYTES):
    """stein.stein_subset on the GPU: w[lo..hi] of T = (d, e) (replicated, ascending, the same
    bits on every rank) and, with vectors, the rank's columns of the n x k eigenvector matrix in
    BlockCyclic(n, k, nb, P) (comm None: this process alone, all k columns); else (w, None).
    xp is accepted for stein_subset's call shape (the arrays are CuPy's); ops: the kernels
    (default) or their twin (stein_twin.TwinOps, host arrays).

    Rank 0 bisects and one Bcast of 3k values gives every rank w and the blocks; the clusters
    are dealt to the ranks as stein_subset deals them; each rank computes its clusters' vectors
    on its GPU (a vector's bits do not depend on P) and _to_block_cyclic's Alltoallv places
    them."""
    ops = ops or DeviceOps()
    rank, P = (0, 1) if comm is None else (comm.Get_rank(), comm.Get_size())
    n, k = d.shape[0], hi - lo + 1
    _check_range(n, lo, hi, "stein_subset_device")
    d, e = ops.xp.ascontiguousarray(d, dtype=ops.xp.float64), ops.xp.ascontiguousarray(e, dtype=ops.xp.float64)
    table = ops.xp.zeros(3 * k)
    if rank == 0:
        w, first, end = bisect_blocks(ops, d, e, lo, hi, blocks=True)
        table[:k], table[k:2 * k], table[2 * k:] = w, first, end
    if P > 1:
        comm.Bcast(table, root=0)
    w = table[:k]
    if not vectors:
        return w, None
    host = to_host(table)
    if np.isfinite(host[:k]).all():
        plan = make_plan(to_host(d), to_host(e), host[:k], host[k:2 * k].astype(np.int64),
                         host[2 * k:].astype(np.int64), lo)
        who = plan.cstart * P // k                    # rank of each cluster: contiguous runs of ~k/P vectors
        maker = np.repeat(who, plan.cend - plan.cstart)   # the rank computing vector p (block order)
        order = plan.pos
        Zmine = _run_batches(ops, d, e, plan, np.flatnonzero(who == rank), work_bytes, qr_from)
    else:                                             # T not finite: NaN vectors, as on the host
        maker, order = np.arange(k) * P // k, np.arange(k)
        Zmine = ops.xp.full((n, int(np.count_nonzero(maker == rank))), np.nan, order="F")
    if comm is None:
        return w, _ascending(ops.xp, Zmine, order)
    return w, _to_block_cyclic(Zmine, order, maker, n, k, nb, comm, ops.xp)
