"""Symmetric tridiagonal eigensolver by divide and conquer (Cuppen; Gu-Eisenstat eigenvectors),
written once for NumPy and CuPy (`xp`): the GPU path of the `stedc` step without a dense solve.

Why: on GPUs the solver's stedc step ran cuSOLVER syevd on the dense n x n tridiagonal T (0.55 s
at n = 8192 on an H200, as much as the whole one-GPU solve). Divide and conquer spends its time
in one GEMM per merge (n x k x k) and O(k^2) elementwise work; cuSOLVER's own tridiagonal D&C
(cusolverDnXstedc) is not in CUDA 13.0's cuSOLVER. Same arithmetic on host and device, no
atomics, reductions in a fixed order: bitwise reproducible run to run on the same hardware.

    T = [T1 0; 0 T2] + rho v v^T,   v = e_m + s e_{m+1},  s = sign(beta), rho = |beta|
    (beta = e[m-1]; T1, T2 with rho subtracted from their touching diagonal entries)
    T1 = Q1 L1 Q1^T, T2 = Q2 L2 Q2^T (recursively; leaves: dense eigh, batched)
    T = Q (L + rho z z^T) Q^T,  z = Q^T v = [last row of Q1; s * first row of Q2]

The rank-one problem: deflation as LAPACK dlaed2 (tiny z components; nearly equal diagonal
entries, joined by Givens rotations), the secular equation f(lam) = 1 + rho sum z_i^2/(d_i - lam)
solved per root by bisection in coordinates relative to the nearer pole (so d_i - lam is
formed without cancellation), and the eigenvectors from z recomputed from the roots
(Gu-Eisenstat, as dlaed3), which keeps them numerically orthogonal.

The tree can be cut at its top merge (split_tree -> DCTree; solve_half for each half;
merge_halves): the distributed solver (solver._stedc) solves the halves on two ranks and the
top merge on every rank, with the bits of eigh_tridiagonal_dc, which runs the same steps."""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np

from ._xp import env_int, kept_streams, raw_module, tridiagonal_matrix

LEAF = 64            # leaf size on the host (LAPACK eigh of each, batched by NumPy)
# leaf size on the GPU: cuSOLVER syevd of each leaf (CuPy's batched eigh uses syevjBatched, which
# takes matrices of at most 32 rows); HPCCOLL_DC_LEAF.  512 with 4 streams was the fastest at
# n = 8192 on 2xH200 (bench/dc_profile.py --leaf 128,256,512 --streams 1,4 at 49edb7b: random T
# 0.090 s against 0.132 for the earlier 256 on one stream)
LEAF_DEVICE = env_int("HPCCOLL_DC_LEAF", 512, 2, "rows per leaf of the GPU divide and conquer")
# Where a GPU solve computes its leaves: "device" (cuSOLVER syevd, one leaf per call) or
# "host" (LAPACK's MRRR tridiagonal solver per leaf, O(m^2), then one upload); see
# bench/dc_profile.py, which times both.
LEAVES = os.environ.get("HPCCOLL_DC_LEAVES", "device")
if LEAVES not in ("device", "host"):
    raise ValueError(f"HPCCOLL_DC_LEAVES={LEAVES!r}: use device or host")
# Device leaves go round-robin over this many streams: one syevd of 256 rows is a chain of small
# kernels that leaves most of the GPU idle, and the leaves are independent (the same bits on any
# stream).  HPCCOLL_DC_STREAMS; bench/dc_profile.py --streams compares.
STREAMS = env_int("HPCCOLL_DC_STREAMS", 4, 1, "CUDA streams for the leaves")
SECULAR_STEPS = 64   # at most (every test matrix converged in <= 12); see _secular
CHUNK = 1 << 24      # elements of the (roots x poles) work arrays materialized at once
EPS = float(np.finfo(np.float64).eps)

# Seconds per step, summed over a solve, when a dict is put here (bench/dc_profile.py); each
# step then ends with a device synchronize, so leave it None outside profiling.
PROFILE: dict | None = None


TPB = 256  # dc_kernels.cu's block


class _step:
    """`with _step("name", xp):` adds the block's wall time to PROFILE[name] (when profiling)."""

    def __init__(self, name, xp):
        self.name, self.xp = name, xp

    def __enter__(self):
        if PROFILE is not None:
            self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        if PROFILE is not None:
            if self.xp is not np:
                self.xp.cuda.get_current_stream().synchronize()
            PROFILE[self.name] = PROFILE.get(self.name, 0.0) + time.perf_counter() - self.t0


def eigh_tridiagonal_dc(d, e, xp=np, leaf: int | None = None):
    """(w ascending, Z) with T = Z diag(w) Z^T for the symmetric tridiagonal T = (d, e); float64.

    d: (n,), e: (n-1,) arrays of module xp (numpy or cupy); results of the same module.
    The tree's two halves and its top merge are split_tree / solve_half / merge_halves, which
    the distributed solver runs on two ranks; this is the same three steps on one."""
    d, e, scale = _checked_and_scale(d, e, xp)
    n = int(d.shape[0])
    if scale == 0.0:  # empty or zero T
        return xp.zeros(n), xp.eye(n)
    leaf = _leaf_size(leaf, xp)
    if n <= leaf:  # one leaf: no tree
        w, Z = _dense(d / scale, e / scale, xp)
        return w * scale, Z
    tree = _tree(d, e, scale, leaf, xp)
    return merge_halves(tree, solve_half(tree, 0, xp), solve_half(tree, 1, xp), xp)


@dataclass(frozen=True)
class DCTree:
    """The divide-and-conquer tree of T = (d, e), as eigh_tridiagonal_dc walks it.

    T is scaled to |T| ~ 1 (as dstedc: the tolerances of the merges are then absolute) and
    torn at every leaf boundary b, T = blockdiag + rho v v^T with rho = |e[b-1]| subtracted
    from the two diagonal entries it couples.  The leaves [bounds[i], bounds[i+1]) are solved
    dense and merged pairwise, bottom-up, left to right; so the last merge joins the first
    `top` leaves (the largest power of two below the leaf count: a perfect subtree) with the
    rest, and either half, merged on its own by the same pairwise loop, is the very block that
    loop would have built inside the whole tree (the left half's blocks come in even numbers
    at every level, so the right half's pairs are the same pairs)."""

    d: object                # scaled, torn diagonal (xp array)
    e: object                # scaled off-diagonal (xp array)
    bounds: tuple            # leaf boundaries, 0 = b_0 < ... < b_L = n
    tears: dict              # boundary -> (rho, sign of e[b-1]) of the coupling torn there
    top: int                 # leaves in the left half
    scale: float             # |T|: eigenvalues come back multiplied by it

    def half_rows(self, half: int) -> tuple[int, int]:
        """Rows [a, b) of half 0 (left) or 1 (right)."""
        split = self.bounds[self.top]
        return (0, split) if half == 0 else (split, self.bounds[-1])


def split_tree(d, e, xp=np, leaf: int | None = None) -> DCTree | None:
    """The tree of T = (d, e) when it has a top merge to split, else None (n <= leaf, or T = 0:
    solve with eigh_tridiagonal_dc).  Then merge_halves(tree, solve_half(tree, 0, xp),
    solve_half(tree, 1, xp), xp) is eigh_tridiagonal_dc(d, e, xp, leaf), bit for bit."""
    d, e, scale = _checked_and_scale(d, e, xp)
    leaf = _leaf_size(leaf, xp)
    if scale == 0.0 or int(d.shape[0]) <= leaf:
        return None
    return _tree(d, e, scale, leaf, xp)


def solve_half(tree: DCTree, half: int, xp=np):
    """(w, Q) of the scaled, torn block of half 0 (left) or 1 (right): its leaves, merged
    pairwise bottom-up (eigenvalues ascending, still scaled)."""
    a, b = tree.half_rows(half)
    bounds = tree.bounds[:tree.top + 1] if half == 0 else tree.bounds[tree.top:]
    with _step("leaves", xp):
        pieces = _leaves(tree.d[a:b], tree.e[a:b - 1], [x - a for x in bounds], xp)
    return _merge_pairwise(bounds, pieces, tree.tears, xp)


def _merge_pairwise(bounds, pieces, tears, xp):
    """(w, Q) of the consecutive leaves [bounds[i], bounds[i+1]) with eigenpairs pieces[i],
    merged pairwise, bottom-up, left to right (an odd block out waits for the next level),
    each merge undoing the tear at the boundary between its two blocks."""
    blocks = [(bounds[i], bounds[i + 1], w, Q) for i, (w, Q) in enumerate(pieces)]
    while len(blocks) > 1:
        merged = []
        for i in range(0, len(blocks) - 1, 2):
            (a0, a1, w1, Q1), (_, b1, w2, Q2) = blocks[i], blocks[i + 1]
            rho, s = tears[a1]
            w, Q = _merge(w1, Q1, w2, Q2, rho, s, xp)
            merged.append((a0, b1, w, Q))
        if len(blocks) % 2:
            merged.append(blocks[-1])
        blocks = merged
    return blocks[0][2], blocks[0][3]


def merge_halves(tree: DCTree, left, right, xp=np):
    """(w ascending, Z) of T from the halves' (w, Q) (solve_half's): the tree's top merge, and
    the eigenvalues scaled back."""
    rho, s = tree.tears[tree.bounds[tree.top]]
    w, Z = _merge(*left, *right, rho, s, xp)
    return w * tree.scale, Z


def _checked_and_scale(d, e, xp):
    """d, e as float64 arrays of xp (e must have n - 1 entries) and |T| = max(|d|, |e|) (0.0 for n = 0)."""
    d = xp.asarray(d, dtype=xp.float64)
    e = xp.asarray(e, dtype=xp.float64)
    n = int(d.shape[0])
    if e.shape[0] != max(n - 1, 0):
        raise ValueError(f"eigh_tridiagonal_dc: e has {e.shape[0]} entries, d has {n}: need n - 1")
    if n == 0:
        return d, e, 0.0
    scale = float(xp.max(xp.abs(d)))
    if n > 1:
        scale = max(scale, float(xp.max(xp.abs(e))))
    return d, e, scale


def _leaf_size(leaf, xp) -> int:
    if leaf is None:
        leaf = LEAF if xp is np else LEAF_DEVICE
    return max(int(leaf), 2)   # >= 2: no diagonal entry is torn twice


def _tree(d, e, scale, leaf, xp) -> DCTree:
    """T scaled by 1/scale and torn at the multiples of `leaf` (n > leaf)."""
    n = int(d.shape[0])
    d, e = d / scale, e / scale
    bounds = tuple(range(0, n, leaf)) + (n,)
    cuts = np.array(bounds[1:-1])
    betas = _host(e[xp.asarray(cuts - 1)])          # one copy, not one per boundary
    rhos = np.abs(betas)
    tears = {int(b): (float(rho), 1.0 if beta >= 0 else -1.0) for b, rho, beta in zip(cuts, rhos, betas)}
    cut, rho_x = xp.asarray(cuts), xp.asarray(rhos)
    d[cut - 1] -= rho_x
    d[cut] -= rho_x
    leaves = len(bounds) - 1                         # >= 2
    top = 1 << ((leaves - 1).bit_length() - 1)       # the largest power of two below `leaves`
    return DCTree(d, e, bounds, tears, top, scale)


def _leaves(d, e, bounds, xp):
    """(w, Q) of every leaf [bounds[i], bounds[i+1]) of the torn (d, e), in order (bounds[0] = 0):
    on the host, or on the GPU by cuSOLVER or (HPCCOLL_DC_LEAVES=host) by LAPACK."""
    if xp is not np and LEAVES == "host":
        return _leaves_on_host(d, e, bounds, xp)
    return _dense_batch(d, e, bounds, xp)


def _dense(d, e, xp):
    return xp.linalg.eigh(tridiagonal_matrix(xp, d, e))


def _dense_batch(d, e, bounds, xp):
    """eigh of every leaf [bounds[i], bounds[i+1]) (d already torn); equal-size leaves in one
    batched call.  Whether a leaf goes through the batched call depends on its size alone, never
    on how many leaves come with it: a half of the tree (solve_half) then gets the same bits
    for its leaves as the whole tree (NumPy's batched eigh is LAPACK per matrix; CuPy's is
    syevjBatched, a different method from the syevd of one matrix)."""
    out = []
    sizes = [bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)]
    m = sizes[0]                                  # every leaf but maybe the last has m rows
    nb = len(sizes) if sizes[-1] == m else len(sizes) - 1
    batched = xp is np or m <= 32   # CuPy batches eigh through syevjBatched (<= 32 rows)
    if batched:
        T = xp.zeros((nb, m, m))
        idx = xp.arange(m)
        T[:, idx, idx] = d[:nb * m].reshape(nb, m)
        ep = xp.concatenate([e, xp.zeros(1)])            # e has n - 1 entries: pad the last leaf's
        ee = ep[:nb * m].reshape(nb, m)[:, :m - 1]       # m >= 2 (leaf sizes are)
        T[:, idx[1:], idx[:-1]] = ee
        T[:, idx[:-1], idx[1:]] = ee
        w, Q = xp.linalg.eigh(T)
        out = [(w[i], Q[i]) for i in range(nb)]
        rest = range(nb, len(sizes))
    else:
        rest = range(len(sizes))
    ranges = [(bounds[i], bounds[i + 1]) for i in rest]
    if xp is not np and STREAMS > 1 and len(ranges) > 1:
        return out + _dense_on_streams(d, e, ranges, xp)
    for a, b in ranges:
        out.append(_dense(d[a:b], e[a:b - 1], xp))
    return out


def _dense_on_streams(d, e, ranges, xp):
    """_dense of every (a, b) leaf, round-robin over STREAMS streams that start after the
    current stream's work and that it then waits for (no host sync)."""
    cur = xp.cuda.get_current_stream()
    streams = kept_streams("dc leaves", STREAMS)
    ready = cur.record()
    used = streams[:len(ranges)]
    for s in used:
        s.wait_event(ready)
    out = []
    for i, (a, b) in enumerate(ranges):
        with used[i % len(used)]:
            out.append(_dense(d[a:b], e[a:b - 1], xp))
    for s in used:
        cur.wait_event(s.record())
    return out


def _leaves_on_host(d, e, bounds, xp):
    """(w, Q) per leaf [bounds[i], bounds[i+1]) of the torn T, by LAPACK on the host (MRRR,
    scipy.linalg.eigh_tridiagonal), uploaded in one copy."""
    import scipy.linalg as sl

    dh, eh = _host(d), _host(e)
    parts = [sl.eigh_tridiagonal(dh[a:b], eh[a:b - 1]) if b - a > 1 else (dh[a:b], np.ones((1, 1)))
             for a, b in zip(bounds[:-1], bounds[1:])]
    flat = xp.asarray(np.concatenate([np.concatenate([w, Q.ravel()]) for w, Q in parts]))
    out, at = [], 0
    for w, Q in parts:
        m = w.size
        out.append((flat[at:at + m], flat[at + m:at + m + m * m].reshape(m, m)))
        at += m + m * m
    return out


def _merge(w1, Q1, w2, Q2, rho, s, xp):
    """Eigen-decomposition of blockdiag(Q1 diag(w1) Q1^T, Q2 diag(w2) Q2^T) + rho v v^T."""
    n1, n2 = int(w1.shape[0]), int(w2.shape[0])
    n = n1 + n2
    with _step("assemble", xp):
        Q = xp.zeros((n, n))
        Q[:n1, :n1] = Q1
        Q[n1:, n1:] = Q2
        D = xp.concatenate([w1, w2])
        z = xp.concatenate([Q1[n1 - 1, :], s * Q2[0, :]])
    if rho == 0.0:
        order = xp.argsort(D, kind="stable") if xp is np else xp.argsort(D)
        return D[order], Q[:, order]
    with _step("deflate", xp):
        # the rank-one problem, on the host: n numbers (deflation is a sequential scan)
        Dh = _host(D)
        zh = _host(z)
        # z has norm sqrt(2) (two unit rows): scale to a unit vector, rho to match (dlaed2)
        zh = zh / np.sqrt(2.0)
        rho = 2.0 * rho
        perm = np.argsort(Dh, kind="stable")
        Dh, zh = Dh[perm], zh[perm]
        tol = 8.0 * EPS * max(np.max(np.abs(Dh)), np.max(np.abs(zh)))
        keep, gone, rots = _deflate(Dh, zh, rho, tol)
        # rows each column of Qs has entries in: Q1's (top) or Q2's (bottom); a rotation mixes
        top = perm < n1
        bot = ~top
        for a, b, _, _ in rots:
            top[a] = top[b] = top[a] | top[b]
            bot[a] = bot[b] = bot[a] | bot[b]
    with _step("rotate", xp):
        Qs = Q[:, xp.asarray(perm)]
        if rots:
            Qs = _rotate(Qs, rots, xp)
    k = len(keep)
    lam_parts, vec_parts = [], []
    if k:
        dk, zk = Dh[keep], zh[keep]
        order_k = np.argsort(dk, kind="stable")   # rotations can reorder the kept poles slightly
        keep = np.array(keep)[order_k]
        dk, zk = dk[order_k], zk[order_k]
        with _step("secular", xp):
            origin, tau = _secular(dk, zk, rho, xp)
            lam = _host(xp.asarray(dk)[origin] + tau)
        with _step("vectors", xp):
            U = _vectors(dk, zk, rho, origin, tau, xp)
        with _step("gemm", xp):
            # Q1's rows meet only the columns with entries there (likewise Q2's): two GEMMs of
            # about half the flops of one n x k x k product
            Zk = xp.empty((n, k))
            for rows, has in ((slice(0, n1), top[keep]), (slice(n1, n), bot[keep])):
                cols = np.nonzero(has)[0]
                if cols.size:
                    Zk[rows] = Qs[rows, xp.asarray(keep[cols])] @ U[xp.asarray(cols)]
                else:
                    Zk[rows] = 0.0
        lam_parts.append(lam)
        vec_parts.append(Zk)
    with _step("finish", xp):
        if gone:
            gone_arr = np.array(gone)
            lam_parts.append(Dh[gone_arr])
            vec_parts.append(Qs[:, xp.asarray(gone_arr)])
        lam = np.concatenate(lam_parts)
        order = np.argsort(lam, kind="stable")
        Z = xp.concatenate(vec_parts, axis=1)[:, xp.asarray(order)]
    return xp.asarray(lam[order]), Z


def _deflate(Dh, zh, rho, tol):
    """dlaed2's scan over the sorted poles (Dh, zh updated in place): a tiny z component
    deflates its pole; two poles closer than tol (in the rotated sense) are joined by a Givens
    rotation that moves the first one's weight into the second.  Returns (keep, gone, rots):
    positions kept for the secular equation, positions deflated, rotations (a, b, c, s).
    On Python floats: the scan is sequential, and NumPy scalar arithmetic costs ~10x more."""
    D, z = Dh.tolist(), zh.tolist()
    keep, gone, rots = [], [], []
    prev = -1
    for j in range(len(D)):
        if rho * abs(z[j]) <= tol:
            gone.append(j)
            continue
        if prev >= 0:
            sa, cb = z[prev], z[j]
            tau = math.hypot(cb, sa)
            c, sn = cb / tau, -sa / tau
            t = D[j] - D[prev]
            if abs(t * c * sn) <= tol:   # nearly equal poles: rotate prev's weight into j
                z[j], z[prev] = tau, 0.0
                rots.append((prev, j, c, sn))
                dp = D[prev] * c * c + D[j] * sn * sn
                D[j] = D[prev] * sn * sn + D[j] * c * c
                D[prev] = dp
                gone.append(prev)
                prev = j
                continue
            keep.append(prev)
        prev = j
    if prev >= 0:
        keep.append(prev)
    Dh[:], zh[:] = D, z
    return keep, gone, rots


def _host(a):
    return a if isinstance(a, np.ndarray) else a.get()


def _rotate(Q, rots, xp):
    """Apply the deflation rotations to the columns of Q, in order, as dlaed2's DROT:
    column a <- c a + s b, column b <- c b - s a (so that z_a becomes 0 and z_b becomes tau).

    The rotations come in chains (each one's b is the next one's a).  A chain of L columns is
    one L x L orthogonal matrix, built on the host; all chains together are one block-diagonal
    matrix applied with one GEMM - a clustered spectrum deflates thousands of pairs per merge,
    which one-rotation-at-a-time column updates would pay for in launches."""
    chains, coeffs = [], []
    for a, b, c, sn in rots:
        if chains and chains[-1][-1] == a:
            chains[-1].append(b)
            coeffs[-1].append((c, sn))
        else:
            chains.append([a, b])
            coeffs.append([(c, sn)])
    cols = [i for ch in chains for i in ch]
    M = len(cols)
    G = np.zeros((M, M))
    at = 0
    for ch, cs in zip(chains, coeffs):
        L = len(ch)
        g = np.eye(L)
        for i, (c, sn) in enumerate(cs):   # the same column operations, on the identity
            gi, gj = g[:, i].copy(), g[:, i + 1].copy()
            g[:, i] = c * gi + sn * gj
            g[:, i + 1] = c * gj - sn * gi
        G[at:at + L, at:at + L] = g
        at += L
    idx = xp.asarray(np.array(cols))
    Q = Q.copy()
    Q[:, idx] = Q[:, idx] @ xp.asarray(G)
    return Q


def _secular(d, z, rho, xp):
    """Roots of f(lam) = 1 + rho sum z_i^2 / (d_i - lam) (d strictly increasing, rho > 0): one in
    each (d_j, d_{j+1}), the last in (d_k, d_k + rho |z|^2].  Returned as (origin, tau) with
    lam_j = d[origin_j] + tau_j, origin the nearer pole, so d_i - lam_j = (d_i - d_origin) - tau
    is formed without cancellation.

    Each iteration proposes two steps from the current t and keeps, per root, the one with the
    smaller |f| (both inside the root's bracket; else a geometric bisection on the origin's side):
      - "middle way" (LAPACK dlaed4): the poles left of the root (i <= j) and right of it
        (i >= j+1) each modelled by one pole at the interval's end, matching value and slope;
        fast when the root is far from both interval poles;
      - "origin exact": the origin's pole with its true weight, the rest linear in tau; fast
        when the root sits within ~1e-14 of a pole whose weight is tiny (Wilkinson matrices),
        where the middle way only halves the distance per step.
    Stops when f is zero to within its rounding error at every root (same inputs, same steps)."""
    k = d.size
    dx, z2 = xp.asarray(d), xp.asarray(z * z)
    if xp is not np:  # the same iteration, one block per root, no host round trip (dc_kernels.cu)
        origin, tau = xp.empty(k, dtype=xp.int64), xp.empty(k)
        secular = raw_module("dc_kernels.cu").get_function("dc_secular")
        secular((k,), (TPB,), (dx, z2, np.int64(k), np.float64(rho), np.float64(rho * float((z * z).sum())),
                               np.float64(EPS), np.int32(SECULAR_STEPS), origin, tau))
        return origin, tau
    width = np.empty(k)
    width[:-1] = d[1:] - d[:-1]
    width[-1] = rho * float((z * z).sum())
    last = xp.asarray(np.arange(k) == k - 1)
    Delta = xp.asarray(width)
    left0 = xp.arange(k)
    mid = Delta / 2.0
    psi, _, phi, _ = _parts(dx, z2, left0, mid, xp)
    right = (1.0 + rho * (psi + phi) <= 0.0) & ~last     # f(mid) <= 0: the root is in the right half
    origin = xp.where(right, left0 + 1, left0)
    lo = xp.where(right, -mid, 0.0)
    hi = xp.where(right, 0.0, xp.where(last, Delta, mid))
    t = (lo + hi) / 2.0
    pL = xp.where(right, -Delta, 0.0)                    # the interval's poles, relative to the origin
    pR = xp.where(right, 0.0, Delta)
    c_o = rho * z2[origin]                               # the origin's pole weight
    parts = _parts(dx, z2, origin, t, xp)
    for _ in range(SECULAR_STEPS):
        psi, dpsi, phi, dphi = parts
        f = 1.0 + rho * (psi + phi)
        # converged (as LAPACK dlaed4): |f| within a few rounding errors of its terms (psi <= 0
        # <= phi, sums of one sign) plus eps |tau| f', the change of f over a relative error
        # eps of tau.  (8 k eps |terms| before 2026-11-30 stopped up to ~k eps / f' away from
        # the root: 880 eps on one random matrix in 400, the last root of a merge of 128)
        done = xp.abs(f) <= EPS * (8.0 * (1.0 + rho * (xp.abs(psi) + xp.abs(phi))) + xp.abs(t) * rho * (dpsi + dphi))
        if bool(done.all()):
            break
        lo = xp.where(f < 0.0, t, lo)                    # f increases with lam
        hi = xp.where(f >= 0.0, t, hi)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            s_mid = _middle_way(psi, dpsi, phi, dphi, t, pL, pR, Delta, rho, right, last, xp)
            s_org = _origin_exact(psi, dpsi, phi, dphi, t, c_o, rho, right, xp)
        floor = EPS * EPS * Delta                        # geometric bisection on the origin's side
        split = xp.sqrt(xp.maximum(xp.abs(lo), floor) * xp.maximum(xp.abs(hi), floor))
        split = xp.where(right, -split, split)
        cands = [xp.where((s >= lo) & (s <= hi) & xp.isfinite(s), s, split) for s in (s_mid, s_org)]
        evals = [_parts(dx, z2, origin, c, xp) for c in cands]
        fs = [xp.abs(1.0 + rho * (e[0] + e[2])) for e in evals]
        pick = fs[1] < fs[0]
        t_new = xp.where(pick, cands[1], cands[0])
        t = xp.where(done, t, t_new)
        parts = [xp.where(done, p0, xp.where(pick, p2, p1)) for p0, p1, p2 in zip(parts, evals[0], evals[1])]
    return origin, t


def _middle_way(psi, dpsi, phi, dphi, t, pL, pR, Delta, rho, right, last, xp):
    """The root in (0, Delta) of a + C1/(pL - tau) + C2/(pR - tau), the model matching psi and
    phi (value and slope at t) by one pole at each end of the interval."""
    S1 = (pL - t) ** 2 * dpsi
    S2 = (pR - t) ** 2 * dphi
    a = 1.0 + rho * (psi - S1 / (pL - t) + phi - S2 / (pR - t))
    C1, C2 = rho * S1, rho * S2
    # a s^2 - (a D + c0 + c1) s + c0 D = 0 for s in (0, D), s measured from the origin towards
    # the other pole (mirrored for a right origin: a -> -a, C1 <-> C2)
    am = xp.where(right, -a, a)
    c0 = xp.where(right, C2, C1)
    c1 = xp.where(right, C1, C2)
    bq = am * Delta + c0 + c1
    disc = xp.sqrt(xp.abs(bq * bq - 4.0 * am * c0 * Delta))
    sig = xp.where(bq <= 0.0, (bq - disc) / (2.0 * am), 2.0 * c0 * Delta / (bq + disc))
    return xp.where(last, C1 / a, xp.where(right, -sig, sig))   # last: no pole on the right


def _origin_exact(psi, dpsi, phi, dphi, t, c_o, rho, right, xp):
    """The root on the origin's side of A + B (tau - t) - c_o / tau: the origin's pole exact
    (f = A - c_o/tau near it), the other poles linear in tau."""
    A = 1.0 + rho * (psi + phi) + c_o / t               # drop the origin's term -c_o/t from f
    B = rho * (dpsi + dphi) - c_o / (t * t)              # and its slope
    # B tau^2 + (A - B t) tau - c_o = 0: roots of opposite signs; take the origin's side
    p = A - B * t
    sq = xp.sqrt(p * p + 4.0 * B * c_o)
    up = xp.where(p <= 0.0, (sq - p) / (2.0 * B), 2.0 * c_o / (p + sq))       # the root > 0
    down = xp.where(p >= 0.0, -(p + sq) / (2.0 * B), -2.0 * c_o / (sq - p))   # the root < 0
    return xp.where(right, down, up)


def _parts(d, z2, origin, tau, xp):
    """psi, psi', phi, phi' at lam = d[origin] + tau for every root j at once: psi sums
    z_i^2 / (d_i - lam) over the poles i <= j, phi over i >= j+1; differences d_i - lam formed
    as (d_i - d_origin) - tau.  In chunks of roots x poles."""
    k = d.size
    out = [xp.empty(origin.size) for _ in range(4)]
    rows = max(1, CHUNK // max(k, 1))
    cols = xp.arange(k)
    for r0 in range(0, origin.size, rows):
        o = origin[r0:r0 + rows]
        t = tau[r0:r0 + rows]
        j = xp.arange(r0, r0 + o.size)
        delta = (d[None, :] - d[o][:, None]) - t[:, None]
        q = z2[None, :] / delta
        q2 = q / delta
        left = cols[None, :] <= j[:, None]
        out[0][r0:r0 + rows] = xp.where(left, q, 0.0).sum(axis=1)
        out[1][r0:r0 + rows] = xp.where(left, q2, 0.0).sum(axis=1)
        out[2][r0:r0 + rows] = xp.where(left, 0.0, q).sum(axis=1)
        out[3][r0:r0 + rows] = xp.where(left, 0.0, q2).sum(axis=1)
    return out


def _vectors(d, z, rho, origin, tau, xp):
    """Eigenvectors of diag(d) + rho z z^T from the roots: z recomputed from them (Gu-Eisenstat,
    as dlaed3), u_j = zhat / (d - lam_j) normalized."""
    dx = xp.asarray(d)
    k = d.size
    # zhat_i^2 = prod_j (lam_j - d_i) / (rho prod_{j != i} (d_j - d_i)): a product of ratios
    # (lam_j - d_i)/(d_j - d_i) near 1, times (lam_i - d_i)
    lam_minus_d = (dx[origin][None, :] - dx[:, None]) + tau[None, :]      # [i, j] = lam_j - d_i
    if xp is not np:  # the product in one fused pass (dc_kernels.cu)
        zhat = xp.empty(k)
        zhat_kernel = raw_module("dc_kernels.cu").get_function("dc_zhat")
        zhat_kernel((k,), (TPB,), (dx, origin.astype(xp.int64, copy=False), tau, xp.asarray(z, dtype=xp.float64),
                                   np.float64(rho), np.int64(k), zhat))
    else:
        dd = dx[None, :] - dx[:, None]                                      # [i, j] = d_j - d_i
        eye = xp.eye(k, dtype=bool)
        ratio = xp.where(eye, 1.0, lam_minus_d / xp.where(eye, 1.0, dd))
        zhat2 = xp.prod(ratio, axis=1) * xp.diagonal(lam_minus_d) / rho
        zhat = xp.copysign(xp.sqrt(xp.abs(zhat2)), xp.asarray(z))
    U = -zhat[:, None] / lam_minus_d                  # zhat_i / (d_i - lam_j)
    U /= xp.sqrt((U * U).sum(axis=0))[None, :]
    return U
