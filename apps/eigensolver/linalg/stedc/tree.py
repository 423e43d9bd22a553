"""Symmetric tridiagonal eigensolver by divide and conquer (Cuppen; Gu-Eisenstat eigenvectors),
written once for NumPy and CuPy (`xp`), on one process or over the ranks of a communicator
that each compute a contiguous block of rows of the eigenvector matrix: the stedc step of the
solver without a dense solve and without an n x n matrix on any rank.

    T = [T1 0; 0 T2] + rho v v^T,   v = e_m + s e_{m+1},  s = sign(beta), rho = |beta|
    (beta = e[m-1]; T1, T2 with rho subtracted from their touching diagonal entries)
    T1 = Q1 L1 Q1^T, T2 = Q2 L2 Q2^T (recursively; leaves: dense eigh)
    T = Q (L + rho z z^T) Q^T,  z = Q^T v = [last row of Q1; s * first row of Q2]

The rank-one problem: deflation as LAPACK dlaed2 (tiny z components; nearly equal diagonal
entries, joined by Givens rotations), the secular equation f(lam) = 1 + rho sum z_i^2/(d_i - lam)
solved per root by bisection in coordinates relative to the nearer pole (so d_i - lam is
formed without cancellation), and the eigenvectors from z recomputed from the roots
(Gu-Eisenstat, as dlaed3), which keeps them numerically orthogonal.  Same arithmetic on host
and device, no atomics, reductions in a fixed order: bitwise reproducible run to run.

T is scaled to |T| ~ 1 (as dstedc: the merges' tolerances are then absolute) and torn at every
leaf boundary; the leaves are merged pairwise, bottom-up, left to right (an odd block out waits
for the next level).

Distributed (stedc_rows with a communicator): the leaves are dealt to the P ranks in contiguous
groups, and rank r keeps rows [row_starts[r], row_starts[r+1]) of every block's eigenvector
matrix on the way up: its leaves' eigenvectors, then its rows of each merge.  A merge needs
only the children's eigenvalues (replicated) and z, two rows of the children's Q.  Per level:

  one Allreduce of the level's z rows (each entry from the one rank that holds it, zeros from
  the others: an exact sum); at the first level it carries the leaves' eigenvalues too;
  the deflation, a sequential scan of k numbers, on every rank (the same bits in, the same
  decisions out);
  the secular equation's roots dealt to the ranks, one Allgather: every root is computed
  once, so every rank has the same eigenvalues, bit for bit;
  each rank its rows of the merged eigenvectors: (its rows x k) @ (k x k), the right factor
  generated from the roots in chunks of columns and never stored whole.

A rank holds at most two copies of its rows (rows x n at the top merge) and work arrays of
k x chunk_width(k) elements; the solver then delivers the eigenvectors by columns with one
Alltoallv (layout.rows_to_columns)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ._xp import _unit_rows, has_cusolver, kept_streams, raw_module, syev_batched, to_host, tridiagonal_matrix

LEAF = 64            # leaf size on the host (LAPACK eigh of each, batched by NumPy)
# Leaf size on the GPU (the leaves by LEAVES below): 256 rows was the fastest at n = 8192 on one
# H200 with the merge inputs staged per level (bench/dc_profile.py: 0.049 s against 0.070 for
# 512 and 0.069 for 128, whose leaves take 2 ms but whose two extra merge levels cost more).
LEAF_DEVICE = 256
# Where a GPU solve computes its leaves: "batched" (every equal-size leaf in one
# cusolverDnXsyevBatched, where the loaded cuSOLVER has it; else as "device"), "device" (cuSOLVER
# syevd, one leaf per call on STREAMS streams) or "host" (LAPACK's MRRR tridiagonal solver per
# leaf, then one upload); bench/dc_profile.py times each.
LEAVES = "batched"
# Device leaves go round-robin over this many streams: one syevd of a leaf is a chain of small
# kernels that leaves most of the GPU idle, and the leaves are independent (the same bits on
# any stream).
STREAMS = 4
SECULAR_STEPS = 64   # at most (every test matrix converged in <= 12); see _secular
# The work arrays of a merge with k poles (roots x poles in the secular equation, poles x
# columns of the eigenvectors) are k x chunk_width(k): on the host CHUNK_HOST roots or columns
# at a time, on the GPU about CHUNK_DEVICE elements.  A constant of the memory model
# (docs/eigensolver.md): it does not shrink with the rank count, so it is kept small.
CHUNK_HOST = 64
CHUNK_DEVICE = 1 << 22
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


def chunk_width(k: int, xp) -> int:
    """Roots, rows or columns per work array of a merge with k poles."""
    return CHUNK_HOST if xp is np else max(1, CHUNK_DEVICE // max(k, 1))


@dataclass
class Rows:
    """A rank's share of a tridiagonal eigensolution: w (every eigenvalue, ascending; the same
    bits on every rank), row_starts (P + 1 boundaries: rank r has rows [row_starts[r],
    row_starts[r+1])), and `rows`, this rank's rows of the eigenvector matrix (F order, the
    eigenvector of w[p] in column place[p]; take it with take_rows, which lets it go)."""

    w: object
    row_starts: list
    rows: object

    def take_rows(self):
        rows, self.rows = self.rows, None
        return rows


def eigh_tridiagonal_dc(d, e, xp=np, leaf: int | None = None):
    """(w ascending, Z) with T = Z diag(w) Z^T for the symmetric tridiagonal T = (d, e), on this
    process; float64.  d: (n,), e: (n-1,) arrays of module xp (numpy or cupy); results of the
    same module."""
    return _solved(stedc_rows(d, e, None, xp, leaf=leaf))


def _solved(res: Rows):
    return res.w, res.take_rows()


class _Team:
    """The ranks of a solve (comm None: this process alone) and the two collectives it uses."""

    def __init__(self, comm, xp):
        self.comm, self.xp = comm, xp
        self.rank, self.size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)

    def sum_disjoint(self, x):
        """x summed over the ranks, where every entry is nonzero on at most one rank (exact);
        the result is where x is (host or device)."""
        if self.size == 1:
            return x
        out = _module_of(x, self.xp).empty_like(x)
        self.comm.Allreduce(x, out)
        return out

    def gather(self, x):
        """(size, x.size): every rank's x, in rank order, where x is (host or device)."""
        if self.size == 1:
            return x[None]
        out = _module_of(x, self.xp).empty((self.size, x.size), dtype=x.dtype)
        self.comm.Allgather(x, out)
        return out


def _to_host_each(arrays, xp) -> list:
    """Host copies of the 1-D arrays (of xp), in one transfer for all of them."""
    if not arrays:
        return []
    flat = to_host(arrays[0] if len(arrays) == 1 else xp.concatenate(arrays))
    cuts = np.cumsum([a.size for a in arrays])[:-1]
    return np.split(flat, cuts)


def _module_of(x, xp):
    """numpy for a host array, else xp (the solve's array module)."""
    return np if isinstance(x, np.ndarray) else xp


class _Staged:
    """Host arrays (int64 or float64) bound for the device, sent in one transfer: `add` each
    (a handle back), `send`, then `arrays` gives each one's device array, a view of the one
    upload (on the host: the array itself).  A level's merges take their index and scalar
    arrays this way - one upload per level instead of about twenty per merge, each a CuPy call
    and a copy that the merges of the lower levels, with little GPU work, wait for."""

    def __init__(self, xp):
        self.xp, self.parts, self.out = xp, [], None

    def add(self, a, dtype) -> int:
        self.parts.append(np.ascontiguousarray(a, dtype=dtype).reshape(-1))
        return len(self.parts) - 1

    def send(self) -> None:
        if self.xp is np or not self.parts:
            self.out = self.parts
            return
        # each part from an even offset: every device array starts 16-byte aligned
        sizes = [p.size + p.size % 2 for p in self.parts]
        flat = np.zeros(sum(sizes), dtype=np.int64)
        at = 0
        for p, size in zip(self.parts, sizes):
            flat[at:at + p.size] = p.view(np.int64)
            at += size
        dev = self.xp.asarray(flat)
        self.out, at = [], 0
        for p, size in zip(self.parts, sizes):
            v = dev[at:at + p.size]
            self.out.append(v.view(self.xp.float64) if p.dtype == np.float64 else v)
            at += size

    def arrays(self, handles: dict) -> dict:
        """{name: device array} of {name: handle} (after send)."""
        return {name: self.out[h] for name, h in handles.items()}


@dataclass
class _Node:
    a: int            # rows and columns [a, b) of T
    b: int
    w: object         # eigenvalues (host, ascending; scaled), None until shared
    Q: object         # this rank's rows of the eigenvectors, rows [max(a, r0), min(b, r1)), or None


def stedc_rows(d, e, comm, xp=np, *, leaf: int | None = None, place=None, early=None) -> Rows:
    """Every eigenvalue, and this rank's block of rows of the eigenvectors, of the symmetric
    tridiagonal T = (d, e) (the same d, e on every rank); see the module doc.

    comm: an hpccoll Communicator, or None for this process alone (then the rows are all of Z).
    leaf: rows per leaf (default LEAF on the host, LEAF_DEVICE on the GPU; at most n / P, so
    that every rank has a leaf).  place: a permutation of range(n), the column of `rows`
    that receives the eigenvector of w[p] (default: p).  early (one rank only): {(a, b): (w, Q)},
    subtrees of the merge tree already solved by solve_range (early_ranges names them), which
    join the tree at their level instead of being solved again; the dict is emptied (its
    arrays are then freed as their merges finish)."""
    team = _Team(comm, xp)
    d, e, scale = _checked_and_scale(d, e, xp)
    n = int(d.shape[0])
    if n == 0:
        return Rows(xp.zeros(0), [0] * (team.size + 1), xp.zeros((0, 0), order="F"))
    if scale == 0.0:
        scale = 1.0          # T = 0 (or empty): the leaves give Q = I and every merge just sorts
    leaf = _leaf_size(leaf, xp, n, team.size)
    bounds, tears, dt, et = _tear(d, e, scale, leaf, xp)
    first = _first_leaves(len(bounds) - 1, team.size)
    row_starts = [bounds[i] for i in first]
    r0, r1 = row_starts[team.rank], row_starts[team.rank + 1]
    mine = range(first[team.rank], first[team.rank + 1])
    joining = _early_nodes(early or {}, bounds, scale, team.size, xp)   # {level: [node]}
    if early:
        early.clear()     # the nodes hold the arrays now, and drop them once merged
    spans = [(node.a, node.b) for nodes in joining.values() for node in nodes]
    covered = [any(a <= bounds[i] < b for a, b in spans) for i in range(len(bounds) - 1)]
    nodes = [_Node(bounds[i], bounds[i + 1], None, None) for i in range(len(bounds) - 1) if not covered[i]]
    at = {node.a: node for node in nodes}
    for run in _runs([i for i in mine if not covered[i]]):      # consecutive leaves to solve
        a, b = bounds[run[0]], bounds[run[-1] + 1]
        with _step("leaves", xp):
            pieces = _leaves(dt[a:b], et[a:max(b - 1, a)], [bounds[i] - a for i in run] + [b - a], xp)
        for i, (_, Q), w in zip(run, pieces, _to_host_each([w for w, _ in pieces], xp)):
            at[bounds[i]].w, at[bounds[i]].Q = w, Q
    place = np.arange(n) if place is None else np.asarray(place)
    shared = False       # are the leaves' eigenvalues known to every rank yet?
    level = 0
    while len(nodes) > 1 or not shared or joining:
        nodes = sorted(nodes + joining.pop(level, []), key=lambda node: node.a)
        pairs = [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
        zs = _share_level(team, nodes, pairs, n, r0, r1, shared, xp)
        shared = True
        level += 1
        if not pairs:
            if joining:
                continue
            break
        last = len(nodes) == 2 and not joining                # the root's merge: columns in place
        merged = _merge_level(team, pairs, zs, tears, r0, r1, place if last else None, xp)
        nodes = merged + ([nodes[-1]] if len(nodes) % 2 else [])
    top = nodes[0]
    Z = top.Q
    if len(bounds) == 2 and Z is not None:   # one leaf, never merged: put its columns in place
        Z = _placed(Z, place, xp)
    if Z is None:
        Z = xp.zeros((0, n), order="F")
    return Rows(xp.asarray(top.w * scale), row_starts, Z)


# One rank can start the divide and conquer before T is whole: the tridiagonalization finishes
# T's rows in order, so a subtree of the merge tree whose rows [a, b) are done can be solved
# while the rest of T is still being reduced (solver.sygvd, from sytrd's host loop while the GPU
# works on the last columns), and joins the tree at its level.  The subtrees are the left
# children along the path from the root to the last leaf, [0, n/2), [n/2, 3n/4), ... for 2^k
# leaves: whole subtrees before the last leaf, each finished once T's rows up to its end are.
# EARLY_LEAVES: the fewest leaves of a subtree solved early (0: none early).  EARLY_START: the
# share of T's rows sytrd must have finished before any subtree is solved (0: each as soon as
# its rows are done; later starts leave sytrd's bandwidth-bound columns to themselves, at the
# risk of work left for after sytrd).
EARLY_LEAVES = 2
EARLY_START = 0.0


def merge_tree(bounds) -> list:
    """The nodes (a, b) that enter each level of stedc_rows's merges, for leaf bounds `bounds`:
    pairs left to right, an odd last node passed up to the next level."""
    level = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    levels = [level]
    while len(level) > 1:
        up = [(level[i][0], level[i + 1][1]) for i in range(0, len(level) - 1, 2)]
        level = up + ([level[-1]] if len(level) % 2 else [])
        levels.append(level)
    return levels


def early_ranges(n: int, *, device: bool, leaf: int | None = None, min_leaves: int | None = None) -> list:
    """The subtrees [a, b) of a one-rank stedc_rows that can be solved before T is whole (the
    comment above EARLY_LEAVES), in the order T's rows complete them; those of at least
    min_leaves leaves (default EARLY_LEAVES; 0: none)."""
    min_leaves = EARLY_LEAVES if min_leaves is None else min_leaves
    if n < 2 or min_leaves <= 0:
        return []
    leaf = _leaf_size(leaf, None if device else np, n, 1)
    levels = merge_tree(tuple(range(0, n, leaf)) + (n,))
    out, node = [], levels[-1][0]
    for below in reversed(levels[:-1]):
        if node in below:                           # passed up unmerged at this level
            continue
        i = next(i for i, x in enumerate(below) if x[0] == node[0])
        left, node = below[i], below[i + 1]
        if (left[1] - left[0]) // leaf >= min_leaves:
            out.append(left)
    return out


def solve_range(d, e, a: int, b: int, xp=np, leaf: int | None = None):
    """(w, Q) of rows [a, b) of T = (d, e) torn from its neighbours as stedc_rows tears it (the
    couplings' |e| subtracted from the end rows): a subtree for stedc_rows(early=...).  w is in
    T's units (stedc_rows scales it with the whole T); Q is (b - a) x (b - a)."""
    n = int(d.shape[0])
    if not 0 <= a < b <= n:
        raise ValueError(f"solve_range: rows [{a}, {b}) are not inside T's {n}")
    dd = xp.array(d[a:b], dtype=xp.float64, copy=True)
    if a > 0:
        dd[0] -= abs(e[a - 1])
    if b < n:
        dd[-1] -= abs(e[b - 1])
    return eigh_tridiagonal_dc(dd, e[a:b - 1], xp, leaf=leaf)


class Early:
    """The early subtrees of one one-rank solve of order n: `hooks` for the tridiagonalization,
    [(rows, fn)] with fn(d, e) to be called once T's first `rows` rows are final (d[:rows] and
    e[:rows], the coupling to the next row included: the reduction of column rows - 1 gives
    both), each solving its subtree on the caller's stream; `solved` then goes to
    stedc_rows(early=...)."""

    def __init__(self, n: int, xp, leaf: int | None = None):
        self.xp, self.leaf, self.solved = xp, leaf, {}
        ranges = early_ranges(n, device=xp is not np, leaf=leaf)
        start = min(n, math.ceil(EARLY_START * n))
        self.hooks = [(max(b, start), self._solver(a, b)) for a, b in ranges]

    def _solver(self, a: int, b: int):
        def solve(d, e):
            self.solved[(a, b)] = solve_range(d, e, a, b, self.xp, self.leaf)
        return solve


def _early_nodes(early: dict, bounds, scale: float, nranks: int, xp) -> dict:
    """{level: [node]} of the solved subtrees `early` ({(a, b): (w, Q)}), each at the level of
    stedc_rows's loop where its range enters (merge_tree), w scaled like the rest of T."""
    if not early:
        return {}
    if nranks != 1:
        raise ValueError("stedc_rows: early subtrees are for one rank (a rank holds all rows of one)")
    levels = merge_tree(bounds)
    out: dict = {}
    for (a, b), (w, Q) in sorted(early.items()):
        level = next((k for k, nodes in enumerate(levels) if (a, b) in nodes), None)
        if level is None or level == len(levels) - 1:
            raise ValueError(f"stedc_rows: rows [{a}, {b}) are not a subtree below the root of this merge tree")
        if tuple(Q.shape) != (b - a, b - a):
            raise ValueError(f"stedc_rows: the eigenvectors of rows [{a}, {b}) are {tuple(Q.shape)}")
        out.setdefault(level, []).append(_Node(a, b, np.asarray(to_host(w), dtype=np.float64) / scale, Q))
    spans = sorted((node.a, node.b) for nodes in out.values() for node in nodes)
    if any(b0 > a1 for (_, b0), (a1, _) in zip(spans, spans[1:])):
        raise ValueError("stedc_rows: early subtrees overlap")
    return out


def _runs(items: list) -> list:
    """Consecutive runs of the ascending integers `items`: [[3, 4, 5], [8, 9]]."""
    runs = []
    for i in items:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _placed(Z, place, xp):
    """Z's columns moved to columns place[p]."""
    out = xp.empty(Z.shape, dtype=Z.dtype, order="F")
    out[:, xp.asarray(place)] = Z
    return out


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


def row_starts_of(n: int, nranks: int, *, device: bool = False, leaf: int | None = None) -> list:
    """The row blocks stedc_rows gives the ranks: rank r computes rows [starts[r], starts[r+1])."""
    leaf = _leaf_size(leaf, None if device else np, n, nranks)
    bounds = list(range(0, n, leaf)) + [n]
    return [bounds[i] for i in _first_leaves(len(bounds) - 1, nranks)]


def _first_leaves(nleaves: int, nranks: int) -> list:
    """The first leaf of each rank (and nleaves): contiguous groups, as even as they go."""
    return [(r * nleaves) // nranks for r in range(nranks + 1)]


def _leaf_size(leaf, xp, n: int, nranks: int) -> int:
    """Rows per leaf: the default of the array module, at most n / nranks (every rank gets a
    leaf), at least 2 (no diagonal entry is torn twice)."""
    if leaf is None:
        leaf = LEAF if xp is np else LEAF_DEVICE
    return max(min(int(leaf), -(-n // nranks)), 2)   # (xp None: the GPU's)


def _tear(d, e, scale, leaf, xp):
    """(bounds, tears, d, e) of T scaled by 1/scale and torn at the multiples of `leaf`: bounds
    the leaf boundaries 0 = b_0 < ... < b_L = n; tears {b: (rho, sign of e[b-1])} of each
    coupling torn, rho = |e[b-1]| subtracted from the two diagonal entries it couples."""
    n = int(d.shape[0])
    d, e = d / scale, e / scale
    bounds = tuple(range(0, n, leaf)) + (n,)
    cuts = np.array(bounds[1:-1], dtype=np.int64)
    if not cuts.size:
        return bounds, {}, d, e
    betas = to_host(e[xp.asarray(cuts - 1)])          # one copy, not one per boundary
    rhos = np.abs(betas)
    tears = {int(b): (float(rho), 1.0 if beta >= 0 else -1.0) for b, rho, beta in zip(cuts, rhos, betas)}
    cut, rho_x = xp.asarray(cuts), xp.asarray(rhos)
    d[cut - 1] -= rho_x
    d[cut] -= rho_x
    return bounds, tears, d, e


def _share_level(team: _Team, nodes, pairs, n: int, r0: int, r1: int, shared: bool, xp):
    """The z vectors of the level's merges (host), from the ranks that hold their rows: one
    Allreduce, which at the first level (shared False) also gives every rank the leaves'
    eigenvalues (stored in the nodes).  Host buffers: a few n numbers, through MPI."""
    head = 0 if shared else n
    buf = np.zeros(head + sum(R.b - L.a for L, R in pairs))
    if not shared:
        for node in nodes:
            if node.Q is not None:
                buf[node.a:node.b] = node.w
    at, spans, rows, dest = head, [], [], []
    for L, R in pairs:
        m, width = L.b, R.b - L.a
        if r0 <= m - 1 < r1:                         # the last row of the left child's Q
            rows.append(L.Q[m - 1 - max(L.a, r0)])
            dest.append(at)
        if r0 <= m < r1:                             # the first row of the right child's Q
            rows.append(R.Q[m - max(R.a, r0)])
            dest.append(at + m - L.a)
        spans.append((at, at + width))
        at += width
    for a, row in zip(dest, _to_host_each(rows, xp)):
        buf[a:a + row.size] = row
    buf = team.sum_disjoint(buf)
    if not shared:
        for node in nodes:
            node.w = buf[node.a:node.b].copy()
    return [buf[a:b] for a, b in spans]


@dataclass
class _Plan:
    """The rank-one problem of one merge after deflation (the same on every rank)."""

    n1: int           # rows of the left child
    perm: object      # sorted position -> column of blockdiag(Q1, Q2)
    D: object         # the poles in sorted order (after the deflation's rotations)
    keep: object      # positions kept for the secular equation, ordered by their pole
    gone: object      # positions deflated
    rots: list        # deflation rotations (a, b, c, s) on sorted positions
    top: object       # per position: has entries in the left child's rows
    bot: object       # ... in the right child's rows
    dk: object        # kept poles, ascending
    zk: object        # their z
    rho: float

    @property
    def k(self) -> int:
        return int(self.keep.size)


def _deflation(L: _Node, R: _Node, z, tear) -> _Plan:
    """dlaed2's deflation of the merge of L and R with the torn coupling tear = (rho, s)."""
    rho, s = tear
    n1 = L.b - L.a
    D = np.concatenate([L.w, R.w])
    z = z.copy()
    z[n1:] *= s
    perm = np.argsort(D, kind="stable")
    D = D[perm]
    top = perm < n1
    bot = ~top
    if rho == 0.0:   # no coupling: the merge only sorts
        none = np.zeros(0, dtype=np.int64)
        return _Plan(n1, perm, D, none, np.arange(D.size), [], top, bot, D[:0], D[:0], 0.0)
    # z has norm sqrt(2) (two unit rows): scale to a unit vector, rho to match (dlaed2)
    z = z[perm] / np.sqrt(2.0)
    rho = 2.0 * rho
    tol = 8.0 * EPS * max(np.max(np.abs(D)), np.max(np.abs(z)))
    keep, gone, rots = _deflate(D, z, rho, tol)
    # rows each column has entries in: the left child's (top) or the right's (bottom); a rotation mixes
    for a, b, _, _ in rots:
        top[a] = top[b] = top[a] | top[b]
        bot[a] = bot[b] = bot[a] | bot[b]
    keep = np.array(keep, dtype=np.int64)
    dk, zk = D[keep], z[keep]
    order = np.argsort(dk, kind="stable")         # rotations can reorder the kept poles slightly
    return _Plan(n1, perm, D, keep[order], np.array(gone, dtype=np.int64), rots, top, bot, dk[order], zk[order], rho)


def _roots(team: _Team, plans, poles, xp):
    """(origin, tau) of every root of every merge of the level (host arrays): each rank solves
    a contiguous share of each merge's roots (kernels queued back to back, one copy of all of
    them to the host), one Allgather of all shares.  poles: per merge its "dk" and "z2" (zk^2)
    as arrays of xp (_merge_level stages them)."""
    P, q = team.size, team.rank
    segs = [-(-p.k // P) for p in plans]
    if not sum(segs):
        return [(np.zeros(0, dtype=np.int64), np.zeros(0)) for _ in plans]
    share = xp.zeros(2 * sum(segs))   # filled where the roots are solved: one copy to the host
    at = 0
    with _step("secular", xp):
        for p, s, dev in zip(plans, segs, poles):
            j0, j1 = min(q * s, p.k), min(q * s + s, p.k)
            if j1 > j0:
                origin, tau = _secular(p.dk, p.zk, p.rho, xp, j0, j1, staged=(dev["dk"], dev["z2"]))
                share[at:at + j1 - j0] = origin
                share[at + s:at + s + j1 - j0] = tau
            at += 2 * s
        mine = to_host(share)
    every = team.gather(mine)
    out, at = [], 0
    for p, s in zip(plans, segs):
        # shares are contiguous ranges of the roots in rank order, padded at the end only
        origin = every[:, at:at + s].reshape(-1)[:p.k].astype(np.int64)
        tau = every[:, at + s:at + 2 * s].reshape(-1)[:p.k].copy()
        out.append((origin, tau))
        at += 2 * s
    return out


def _merge_level(team: _Team, pairs, zs, tears, r0: int, r1: int, place, xp):
    """The merged nodes of one level: eigenvalues on every rank, this rank's rows of the
    eigenvectors where it has rows.  place: the storage columns of the top merge (else None)."""
    with _step("deflate", xp):
        plans = [_deflation(L, R, z, tears[L.b]) for (L, R), z in zip(pairs, zs)]
    poles = _Staged(xp)     # the level's poles and weights, for the roots and then the merges
    handles = [{"dk": poles.add(p.dk, np.float64), "zk": poles.add(p.zk, np.float64),
                "z2": poles.add(p.zk * p.zk, np.float64)} for p in plans]
    poles.send()
    poles = [poles.arrays(h) for h in handles]
    roots = _roots(team, plans, poles, xp)
    staged = _Staged(xp)
    todo = []
    for (L, R), plan, (origin, tau) in zip(pairs, plans, roots):
        lam = np.concatenate([plan.dk[origin] + tau, plan.D[plan.gone]])
        order = np.argsort(lam, kind="stable")
        inputs = None
        if min(R.b, r1) > max(L.a, r0):
            rank_of = np.empty(lam.size, dtype=np.int64)
            rank_of[order] = np.arange(lam.size)          # item -> its place in ascending order
            cols = rank_of if place is None else place[rank_of]
            inputs = _merge_inputs(plan, origin, tau, cols, staged)
        todo.append((lam[order], inputs))
    staged.send()
    out = []
    for (L, R), plan, (w, inputs), dev in zip(pairs, plans, todo, poles):
        Q = None
        if inputs is not None:
            names, counts = inputs
            Q = _merge_rows(L, R, plan, {**staged.arrays(names), **dev}, counts, r0, r1, xp)
        L.Q = R.Q = None
        out.append(_Node(L.a, R.b, w, Q))
    return out


def _merge_inputs(plan: _Plan, origin, tau, cols, staged: _Staged):
    """The host arrays of one merge that its device work reads (besides its poles), staged:
    ({name: handle}, counts).  Item t (the kept roots in order, then the deflated positions)
    goes to column cols[t]."""
    perm, keep, n1 = plan.perm, plan.keep, plan.n1
    topk, botk = np.nonzero(plan.top[keep])[0], np.nonzero(plan.bot[keep])[0]
    i64, f64 = np.int64, np.float64
    arrays = {"cols": (cols, i64), "origin": (origin, i64), "tau": (tau, f64), "topk": (topk, i64),
              "botk": (botk, i64)}
    if not plan.rots:
        # every column comes from one child: the kept ones' and the deflated ones' columns are
        # read straight from the children's Q (_merge_rows builds no sorted blockdiag(Q1, Q2))
        k, gone = keep.size, plan.gone
        fromL = perm[gone] < n1
        arrays.update({"srcKL": (perm[keep[topk]], i64), "srcKR": (perm[keep[botk]] - n1, i64),
                       "dstGL": (cols[k:][fromL], i64), "srcGL": (perm[gone[fromL]], i64),
                       "dstGR": (cols[k:][~fromL], i64), "srcGR": (perm[gone[~fromL]] - n1, i64)})
        handles = {name: staged.add(a, t) for name, (a, t) in arrays.items()}
        return handles, {"nL": topk.size, "nR": botk.size, "ngone": gone.size, "nGL": int(fromL.sum()),
                         "nGR": int((~fromL).sum())}
    posL, posR = np.nonzero(perm < n1)[0], np.nonzero(perm >= n1)[0]
    arrays.update({"posL": (posL, i64), "srcL": (perm[posL], i64), "posR": (posR, i64),
                   "srcR": (perm[posR] - n1, i64), "keepL": (keep[topk], i64), "keepR": (keep[botk], i64),
                   "gone": (plan.gone, i64)})
    for name, a in zip(("ra", "rb", "rc", "rs"), _rotation_arrays(plan.rots)):
        arrays[name] = (a, a.dtype)
    handles = {name: staged.add(a, t) for name, (a, t) in arrays.items()}
    return handles, {"nL": topk.size, "nR": botk.size, "ngone": plan.gone.size}


def _merge_rows(L: _Node, R: _Node, plan: _Plan, dev: dict, counts: dict, r0: int, r1: int, xp):
    """This rank's rows of the merged eigenvectors; dev: the merge's arrays of xp by name
    (_merge_inputs' and its poles), counts: _merge_inputs'."""
    m = L.b
    hL = max(0, min(m, r1) - max(L.a, r0))
    hR = max(0, min(R.b, r1) - max(m, r0))
    h, kn = hL + hR, R.b - L.a
    k = plan.k
    cols_x = dev["cols"]
    if plan.rots:
        QkL, QkR, Z = _rotated_columns(L, R, plan, dev, counts, hL, hR, xp)
    else:  # the children's columns as they are (_merge_inputs): a deflated one in its child's rows only
        with _step("rotate", xp):
            # the left rows meet only the columns with entries there (likewise the right): two
            # GEMMs of about half the flops of one
            QkL = _copy_cols(None, None, L.Q, dev["srcKL"], xp) if hL and counts["nL"] else None
            QkR = _copy_cols(None, None, R.Q, dev["srcKR"], xp) if hR and counts["nR"] else None
            Z = xp.zeros((h, kn), order="F") if counts["ngone"] else xp.empty((h, kn), order="F")
            if hL and counts["nGL"]:
                _copy_cols(Z[:hL], dev["dstGL"], L.Q, dev["srcGL"], xp)
            if hR and counts["nGR"]:
                _copy_cols(Z[hL:], dev["dstGR"], R.Q, dev["srcGR"], xp)
            L.Q = R.Q = None
    if k:
        dx, ox, tx = dev["dk"], dev["origin"], dev["tau"]
        with _step("vectors", xp):
            zhat = _zhat(dx, ox, tx, dev["zk"], plan.rho, xp)
        width = chunk_width(k, xp)
        for c0 in range(0, k, width):
            c1 = min(c0 + width, k)
            with _step("vectors", xp):
                UL, UR = _u_rows(dx, zhat, ox, tx, c0, c1, dev["topk"] if QkL is not None else None,
                                 dev["botk"] if QkR is not None else None, xp)
            with _step("gemm", xp):
                dst = cols_x[c0:c1]
                if hL:
                    _place_product(Z[:hL], dst, QkL, UL, xp)
                if hR:
                    _place_product(Z[hL:], dst, QkR, UR, xp)
    return Z


def _place_product(Zrows, dst, Qk, U, xp) -> None:
    """Zrows[:, dst] = Qk @ U (0 where Qk is None).  On the GPU the product is formed
    column-major, as the transpose of U^T Qk^T, and placed by dc_copy_cols."""
    if Qk is None:
        Zrows[:, dst] = 0.0
    elif xp is np:
        Zrows[:, dst] = Qk @ U
    else:
        _copy_cols(Zrows, dst, (U.T @ Qk.T).T, None, xp)


def _copy_cols(dst, didx, src, sidx, xp):
    """dst[:, didx] = src[:, sidx] for matrices of the same rows (None for an index: every
    column in order; dst None: a new column-major array of the gathered columns), returned.  On
    the GPU, for column-major operands, one dc_copy_cols launch: CuPy's advanced indexing costs
    tens of microseconds of Python per call, and a merge makes several."""
    idx = sidx if sidx is not None else didx
    cols = src.shape[1] if idx is None else idx.size
    if dst is None:
        dst = xp.empty((src.shape[0], cols), order="F")
    rows = src.shape[0]
    if xp is np or src.dtype != np.float64 or dst.dtype != np.float64 or not (_unit_rows(src) and _unit_rows(dst)):
        dst[:, slice(None) if didx is None else didx] = src[:, slice(None) if sidx is None else sidx]
        return dst
    if not rows or not cols:
        return dst
    kernel = raw_module("dc_kernels.cu").get_function("dc_copy_cols")
    null = np.uint64(0)
    kernel((min(-(-rows // TPB), 64), min(cols, 65535)), (TPB,),
           (src, np.int64(src.strides[1] // 8), null if sidx is None else sidx, dst, np.int64(dst.strides[1] // 8),
            null if didx is None else didx, np.int64(rows), np.int64(cols)))
    return dst


def _rotated_columns(L: _Node, R: _Node, plan: _Plan, dev: dict, counts: dict, hL: int, hR: int, xp):
    """(QkL, QkR, Z) of a merge with deflation rotations: the rows of blockdiag(Q1, Q2) with
    sorted columns, rotated; its kept columns' left and right rows (None where none); Z with
    the deflated columns in place (_merge_rows fills the kept ones)."""
    h, kn = hL + hR, R.b - L.a
    with _step("rotate", xp):
        Qs = xp.zeros((h, kn), order="F")            # rows of blockdiag(Q1, Q2), columns sorted
        if hL:
            _copy_cols(Qs[:hL], dev["posL"], L.Q, dev["srcL"], xp)
        if hR:
            _copy_cols(Qs[hL:], dev["posR"], R.Q, dev["srcR"], xp)
        L.Q = R.Q = None
        _rotate(Qs, plan.rots, xp, staged=tuple(dev[q] for q in ("ra", "rb", "rc", "rs")))
    QkL = _copy_cols(None, None, Qs[:hL], dev["keepL"], xp) if hL and counts["nL"] else None
    QkR = _copy_cols(None, None, Qs[hL:], dev["keepR"], xp) if hR and counts["nR"] else None
    G = _copy_cols(None, None, Qs, dev["gone"], xp) if counts["ngone"] else None
    del Qs                                           # before Z: the two are never held at once
    Z = xp.empty((h, kn), order="F")
    if G is not None:
        _copy_cols(Z, dev["cols"][plan.k:], G, None, xp)
    return QkL, QkR, Z


def _leaves(d, e, bounds, xp):
    """(w, Q) of every leaf [bounds[i], bounds[i+1]) of the torn (d, e), in order (bounds[0] = 0):
    on the host, or on the GPU by cuSOLVER or (LEAVES = "host") by LAPACK."""
    if xp is not np and LEAVES == "host":
        return _leaves_on_host(d, e, bounds, xp)
    return _dense_batch(d, e, bounds, xp)


def _dense(d, e, xp):
    return xp.linalg.eigh(tridiagonal_matrix(xp, d, e))


def _dense_batch(d, e, bounds, xp):
    """eigh of every leaf [bounds[i], bounds[i+1]) (d already torn): the equal-size leaves in one
    batched call - on the host NumPy's, on the GPU below 33 rows CuPy's (syevjBatched), above
    it cusolverDnXsyevBatched (LEAVES = "batched", where cuSOLVER has it) - and one call each
    otherwise (a shorter last leaf; on the GPU LEAVES = "device": one syevd per leaf on STREAMS
    streams)."""
    out = []
    sizes = [bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)]
    m = sizes[0]                                  # every leaf but maybe the last has m rows
    nb = len(sizes) if sizes[-1] == m else len(sizes) - 1
    if xp is np or m <= 32:
        how = "eigh"
    elif LEAVES == "batched" and has_cusolver("cusolverDnXsyevBatched"):
        how = "syev_batched"
    else:
        how = None
    if how and m >= 2:
        T = xp.zeros((nb, m, m))
        idx = xp.arange(m)
        T[:, idx, idx] = d[:nb * m].reshape(nb, m)
        ep = xp.concatenate([e, xp.zeros(1)])            # e has n - 1 entries: pad the last leaf's
        ee = ep[:nb * m].reshape(nb, m)[:, :m - 1]
        T[:, idx[1:], idx[:-1]] = ee
        T[:, idx[:-1], idx[1:]] = ee
        w, Q = xp.linalg.eigh(T) if how == "eigh" else syev_batched(xp, T)
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

    dh, eh = to_host(d), to_host(e)
    parts = [sl.eigh_tridiagonal(dh[a:b], eh[a:b - 1]) if b - a > 1 else (dh[a:b], np.ones((1, 1)))
             for a, b in zip(bounds[:-1], bounds[1:])]
    flat = xp.asarray(np.concatenate([np.concatenate([w, Q.ravel()]) for w, Q in parts]))
    out, at = [], 0
    for w, Q in parts:
        m = w.size
        out.append((flat[at:at + m], flat[at + m:at + m + m * m].reshape(m, m)))
        at += m + m * m
    return out


def _deflate(Dh, zh, rho, tol):
    """dlaed2's scan over the sorted poles (Dh, zh updated in place): a tiny z component
    deflates its pole; two poles closer than tol (in the rotated sense) are joined by a Givens
    rotation that moves the first one's weight into the second.  Returns (keep, gone, rots):
    positions kept for the secular equation (ascending), positions deflated (in the scan's
    order), rotations (a, b, c, s).

    The scan is sequential only through rotations: a pole's tiny-z test reads its own z, which
    no rotation has touched yet, and the closeness test of two consecutive candidates reads
    values that a rotation changed only when the first of them was the previous rotation's
    target.  So both tests run on whole arrays first (the closeness test with a margin of a
    relative 1e-12 for its rounding), and the scan itself (on Python floats: NumPy scalar
    arithmetic costs ~10x more) walks only the chains of rotations, each from a flagged pair to
    the first pair after it that does not rotate: the same decisions and bits as the scan over
    every pole."""
    big = rho * np.abs(zh) > tol
    cand = np.nonzero(big)[0]
    tiny = np.nonzero(~big)[0]
    a, b = cand[:-1], cand[1:]
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = np.hypot(zh[b], zh[a])
        flagged = np.abs((Dh[b] - Dh[a]) * (zh[b] / tau) * (zh[a] / tau)) <= tol * (1.0 + 1e-12)
    if not flagged.any():
        return cand.tolist(), tiny.tolist(), []
    D, z, at = Dh.tolist(), zh.tolist(), cand.tolist()
    kept = np.ones(cand.size, dtype=bool)
    rots, gone_at = [], []               # gone_at: the scan position at which a rotated pole left
    m, free = cand.size, 0
    for i in np.nonzero(flagged)[0].tolist():
        if i < free:                     # inside a chain already walked
            continue
        while i < m - 1:
            p, j = at[i], at[i + 1]
            sa, cb = z[p], z[j]
            t = math.hypot(cb, sa)
            c, sn = cb / t, -sa / t
            if abs((D[j] - D[p]) * c * sn) > tol:
                break
            z[j], z[p] = t, 0.0
            rots.append((p, j, c, sn))
            dp = D[p] * c * c + D[j] * sn * sn
            D[j] = D[p] * sn * sn + D[j] * c * c
            D[p] = dp
            kept[i] = False
            gone_at.append(j)
            i += 1
        free = i + 1
    Dh[:], zh[:] = D, z
    # deflated positions in the order the sequential scan appends them: a tiny pole at its own
    # position, a rotated one at its partner's
    gone = np.concatenate([tiny, cand[~kept]])
    when = np.concatenate([tiny, np.array(gone_at, dtype=np.int64)])
    return cand[kept].tolist(), gone[np.argsort(when, kind="stable")].tolist(), rots


def _rotate(Q, rots, xp, staged=None):
    """Apply the deflation rotations to the columns of Q in place, in order, as dlaed2's DROT:
    column a <- c a + s b, column b <- c b - s a (so that z_a becomes 0 and z_b becomes tau).

    The rotations come in chains (each one's b is the next one's a).  A chain of L columns is
    one L x L orthogonal matrix, built on the host; all chains together are one block-diagonal
    matrix applied with one GEMM - a clustered spectrum deflates thousands of pairs per merge,
    which one-rotation-at-a-time column updates would pay for in launches.  On the GPU the
    rotations run as listed, a thread per row (dc_kernels.cu dc_rotate: a dense M x M G of the
    M chained columns cost an M^2 host build and a GEMM of M^2 per row, 57 ms of a clustered
    n = 8192 solve); both ways need the rotations to chain as dlaed2's do (_chained).  staged:
    the rotations' a, b, c, s as device arrays (_Staged), else copied here."""
    if xp is not np and Q.shape[0]:
        if not _chained(rots) or not _unit_rows(Q):
            raise ValueError("tridiag_dc._rotate: the rotations must chain as dlaed2's do (_chained) "
                             "and Q must be column-major")
        if staged is None:
            staged = tuple(xp.asarray(a) for a in _rotation_arrays(rots))
        kernel = raw_module("dc_kernels.cu").get_function("dc_rotate")
        h, threads = Q.shape[0], 64
        kernel((-(-h // threads),), (threads,), (Q, np.int64(h), np.int64(Q.strides[1] // 8), *staged,
                                                 np.int64(len(rots))))
        return Q
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
    Q[:, idx] = Q[:, idx] @ xp.asarray(G)
    return Q


def _rotation_arrays(rots) -> tuple:
    """The rotations' a, b (int64) and c, s (float64) as four host arrays: dc_rotate's operands."""
    return tuple(np.array([r[q] for r in rots], dtype=np.int64 if q < 2 else np.float64) for q in range(4))


def _chained(rots) -> bool:
    """True when every column is the b of at most one rotation and untouched before it, and
    every a is the previous rotation's b or untouched before: what dc_rotate's early loads need
    (dlaed2's rotations always are: a deflated pole's weight moves on to the next candidate)."""
    seen = set()
    prev_b = None
    for a, b, _, _ in rots:
        if b in seen or a == b or (a != prev_b and a in seen):
            return False
        seen.add(a)
        seen.add(b)
        prev_b = b
    return True


def _secular(d, z, rho, xp, j0: int = 0, j1: int | None = None, staged=None):
    """Roots j0 .. j1-1 of f(lam) = 1 + rho sum z_i^2 / (d_i - lam) (d strictly increasing,
    rho > 0; host arrays d, z): one in each (d_j, d_{j+1}), the last in (d_k, d_k + rho |z|^2].
    staged: d and z * z already as arrays of xp (_Staged), else copied here.
    Returned as (origin, tau) (arrays of xp) with lam_j = d[origin_j] + tau_j, origin the nearer
    pole, so d_i - lam_j = (d_i - d_origin) - tau is formed without cancellation.

    Each iteration proposes two steps from the current t and keeps, per root, the one with the
    smaller |f| (both inside the root's bracket; else a geometric bisection on the origin's side):
      - "middle way" (LAPACK dlaed4): the poles left of the root (i <= j) and right of it
        (i >= j+1) each modelled by one pole at the interval's end, matching value and slope;
        fast when the root is far from both interval poles;
      - "origin exact": the origin's pole with its true weight, the rest linear in tau; fast
        when the root sits within ~1e-14 of a pole whose weight is tiny (Wilkinson matrices),
        where the middle way only halves the distance per step.
    Stops when f is zero to within its rounding error at every root (same inputs, same steps);
    a root's iteration does not depend on which other roots are solved with it."""
    k = d.size
    j1 = k if j1 is None else j1
    dx, z2 = staged if staged is not None else (xp.asarray(d), xp.asarray(z * z))
    if xp is not np:  # the same iteration, one block per root, no host round trip (dc_kernels.cu)
        count = j1 - j0
        origin, tau = xp.empty(count, dtype=xp.int64), xp.empty(count)
        secular = raw_module("dc_kernels.cu").get_function("dc_secular")
        secular((count,), (TPB,), (dx, z2, np.int64(k), np.int64(j0), np.float64(rho),
                                   np.float64(rho * float((z * z).sum())), np.float64(EPS),
                                   np.int32(SECULAR_STEPS), origin, tau))
        return origin, tau
    width = np.empty(k)
    width[:-1] = d[1:] - d[:-1]
    width[-1] = rho * float((z * z).sum())
    roots = np.arange(j0, j1)
    last = roots == k - 1
    Delta = width[j0:j1]
    mid = Delta / 2.0
    psi, _, phi, _ = _parts(dx, z2, roots, roots, mid, xp)
    right = (1.0 + rho * (psi + phi) <= 0.0) & ~last     # f(mid) <= 0: the root is in the right half
    origin = np.where(right, roots + 1, roots)
    lo = np.where(right, -mid, 0.0)
    hi = np.where(right, 0.0, np.where(last, Delta, mid))
    t = (lo + hi) / 2.0
    pL = np.where(right, -Delta, 0.0)                    # the interval's poles, relative to the origin
    pR = np.where(right, 0.0, Delta)
    c_o = rho * z2[origin]                               # the origin's pole weight
    parts = _parts(dx, z2, roots, origin, t, xp)
    for _ in range(SECULAR_STEPS):
        psi, dpsi, phi, dphi = parts
        f = 1.0 + rho * (psi + phi)
        # converged (as LAPACK dlaed4): |f| within a few rounding errors of its terms (psi <= 0
        # <= phi, sums of one sign) plus eps |tau| f', the change of f over a relative error
        # eps of tau
        done = np.abs(f) <= EPS * (8.0 * (1.0 + rho * (np.abs(psi) + np.abs(phi))) + np.abs(t) * rho * (dpsi + dphi))
        if bool(done.all()):
            break
        lo = np.where(f < 0.0, t, lo)                    # f increases with lam
        hi = np.where(f >= 0.0, t, hi)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            s_mid = _middle_way(psi, dpsi, phi, dphi, t, pL, pR, Delta, rho, right, last, np)
            s_org = _origin_exact(psi, dpsi, phi, dphi, t, c_o, rho, right, np)
        floor = EPS * EPS * Delta                        # geometric bisection on the origin's side
        split = np.sqrt(np.maximum(np.abs(lo), floor) * np.maximum(np.abs(hi), floor))
        split = np.where(right, -split, split)
        cands = [np.where((s >= lo) & (s <= hi) & np.isfinite(s), s, split) for s in (s_mid, s_org)]
        evals = [_parts(dx, z2, roots, origin, c, xp) for c in cands]
        fs = [np.abs(1.0 + rho * (e[0] + e[2])) for e in evals]
        pick = fs[1] < fs[0]
        t_new = np.where(pick, cands[1], cands[0])
        t = np.where(done, t, t_new)
        parts = [np.where(done, p0, np.where(pick, p2, p1)) for p0, p1, p2 in zip(parts, evals[0], evals[1])]
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


def _parts(d, z2, roots, origin, tau, xp):
    """psi, psi', phi, phi' at lam = d[origin] + tau for the given roots j: psi sums
    z_i^2 / (d_i - lam) over the poles i <= j, phi over i >= j+1; differences d_i - lam formed
    as (d_i - d_origin) - tau.  In chunks of roots x poles (host)."""
    k = d.size
    out = [np.empty(roots.size) for _ in range(4)]
    rows = chunk_width(k, np)
    cols = np.arange(k)
    for r0 in range(0, roots.size, rows):
        o = origin[r0:r0 + rows]
        t = tau[r0:r0 + rows]
        j = roots[r0:r0 + rows]
        delta = (d[None, :] - d[o][:, None]) - t[:, None]
        q = z2[None, :] / delta
        q2 = q / delta
        left = cols[None, :] <= j[:, None]
        out[0][r0:r0 + rows] = np.where(left, q, 0.0).sum(axis=1)
        out[1][r0:r0 + rows] = np.where(left, q2, 0.0).sum(axis=1)
        out[2][r0:r0 + rows] = np.where(left, 0.0, q).sum(axis=1)
        out[3][r0:r0 + rows] = np.where(left, 0.0, q2).sum(axis=1)
    return out


def _zhat(d, origin, tau, z, rho, xp):
    """z recomputed from the roots (Gu-Eisenstat, as dlaed3): zhat_i^2 = prod_j (lam_j - d_i) /
    (rho prod_{j != i} (d_j - d_i)), a product of ratios (lam_j - d_i)/(d_j - d_i) near 1, times
    (lam_i - d_i); zhat_i takes z_i's sign.  Arrays of xp."""
    k = d.size
    zhat = xp.empty(k)
    if xp is not np:  # the product in one fused pass (dc_kernels.cu)
        kernel = raw_module("dc_kernels.cu").get_function("dc_zhat")
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
        kernel = raw_module("dc_kernels.cu").get_function("dc_vectors")
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
