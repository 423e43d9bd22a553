"""Deflation of one merge (LAPACK dlaed2): sort the children's eigenvalues, drop the poles with
a tiny z component, join nearly equal poles by Givens rotations, and apply those rotations to the
eigenvector columns."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._xp import _unit_rows
from .common import EPS, _Node, dc_kernel

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
    relative 1e-12 for its rounding), and the scan itself (on Python floats, far cheaper than
    NumPy scalars) walks only the chains of rotations, each from a flagged pair to
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
    M chained columns would cost an M^2 host build and a GEMM of M^2 per row); both ways need the rotations to chain as dlaed2's do (_chained).  staged:
    the rotations' a, b, c, s as device arrays (_Staged), else copied here."""
    if xp is not np and Q.shape[0]:
        if not _chained(rots) or not _unit_rows(Q):
            raise ValueError("stedc: _rotate: the rotations must chain as dlaed2's do (_chained) "
                             "and Q must be column-major")
        if staged is None:
            staged = tuple(xp.asarray(a) for a in _rotation_arrays(rots))
        kernel = dc_kernel("dc_rotate")
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
