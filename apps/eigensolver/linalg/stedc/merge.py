"""One level of merges (LAPACK dlaed1): the z vectors from the ranks that hold them, deflation,
the roots, and each rank's rows of the merged eigenvectors, the children's rows times the
rank-one problem's vectors."""
from __future__ import annotations

import numpy as np

from .._xp import _unit_rows
from .common import TPB, _Node, _Team, _to_host_each, chunk_width, dc_kernel
from .deflation import _Plan, _deflation, _rotate, _rotation_arrays
from .secular import _roots
from .vectors import _u_rows, _zhat

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


def _merge_level(team: _Team, pairs, zs, tears, r0: int, r1: int, place, xp):
    """The merged nodes of one level: eigenvalues on every rank, this rank's rows of the
    eigenvectors where it has rows.  place: the storage columns of the top merge (else None)."""
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
        zhat = _zhat(dx, ox, tx, dev["zk"], plan.rho, xp)
        width = chunk_width(k, xp)
        for c0 in range(0, k, width):
            c1 = min(c0 + width, k)
            UL, UR = _u_rows(dx, zhat, ox, tx, c0, c1, dev["topk"] if QkL is not None else None,
                             dev["botk"] if QkR is not None else None, xp)
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
    kernel = dc_kernel("dc_copy_cols")
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
