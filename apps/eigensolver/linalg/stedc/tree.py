"""The divide and conquer's tree (LAPACK dlaed0): scale and tear T, solve the leaves, merge
level by level over the ranks, join subtrees solved early (early.py)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._xp import to_host
from .common import _Node, _Team, _first_leaves, _leaf_size, _to_host_each, merge_tree
from .leaves import _leaves
from .merge import _merge_level, _share_level

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
