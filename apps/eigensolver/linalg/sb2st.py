"""Stage two of the two-stage tridiagonalization: symmetric band (half-bandwidth b) -> tridiagonal
T by bulge chasing, B = Q2 T Q2^T, with Q2's Householder reflectors kept for the
back-transformation (the scheme of LAPACK dsytrd_sb2st / dsb2st_kernels and of Haidar, Ltaief
and Dongarra's "cache-friendly bulge chasing").

Sweep j (j = 0 .. n - 3) removes column j below its subdiagonal and chases the bulge it makes
down the band, step k = 0, 1, ... on the rows R = [s, e), s = j + 1 + k b, e = min(s + b, n):
  - a reflector H_jk = I - tau v v^T (v: length e - s, v[0] = 1) annihilates the pivot column
    lo (lo = j at k = 0, else s - b: the first column of the bulge that step k - 1 made) in rows
    s + 1 .. e - 1, and is applied from the left to the rest of the block A[R, lo:s];
  - then two-sided to the diagonal block A[R, R];
  - then from the right to the b rows below, A[e:e + b, R]: the fill there is the next bulge.
Each step touches three blocks of at most b x b within 2b of the diagonal (step_blocks); every
update is mirrored, so the band is held symmetric (both triangles, half-bandwidth 2b: room for
the bulge).  Steps of different sweeps run in a wavefront: sweep j's step k may run once sweep
j - 1 has finished its step k + LAG (steps_needed).  LAG = 1, with the last row of the rows
below deferred: the entry A[s + 2b - 1, s + b - 1] (s the step's first row) in that last row is
the pivot (alpha) of sweep j - 1's step k + 2, which the update from the right reads and
changes.  So where sweep j has a step k + 1, step k updates its rows below but the last
(defers), and step k + 1, which waits for sweep j - 1's step k + 2, applies step k's reflector
to that row first (it is the last row of its pivot block).  Without the deferral the rule would
need LAG = 2: the critical path of the wavefront, about (LAG + 1) n steps, is 2n steps, not 3n.
The CPU tests check that this rule orders every pair of steps of different sweeps that touch a
common entry (one writing it), and that interleavings it permits give the serial result bit for
bit; sb2st_device's kernel waits by it.

Reflectors are kept by groups of g consecutive sweeps: H_jk for j in [j0, j0 + g) act on the
rows r0 + t .. r0 + t + b - 1 (t = j - j0, r0 = j0 + 1 + k b), a (b + g - 1) x g trapezoid, so
they apply to Z as one compact-WY block (apply_q2).  In the product Q2 = prod_j prod_k H_jk
(sweeps ascending, steps ascending), H_jk overlaps only H_j'k' with j' > j and k' <= k; so
Q2 Z is the groups last to first, within a group the steps k ascending, each block one
I - V T V^T: order-preserving for every overlapping pair."""
from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .sy2sb import block_reflector


def sweep_steps(n: int, b: int, j: int) -> int:
    """Steps of sweep j with a reflector of length >= 2 (rows j + 1 + k b .. <= n - 1)."""
    return (n - 3 - j) // b + 1 if j <= n - 3 else 0


def n_sweeps(n: int) -> int:
    return max(n - 2, 0)


class _SymmetricBand:
    """An n x n symmetric matrix of half-bandwidth <= w, both triangles, column-major band
    storage (leading dimension 2w + 1): A[r, c] at c (2w + 1) + r - c + w.  blk(r0, r1, c0, c1)
    is a writable strided view of the dense block A[r0:r1, c0:c1] (all its entries within w of
    the diagonal)."""

    def __init__(self, lower, w: int):
        b1, n = lower.shape
        self.n, self.w, self.ld = n, w, 2 * w + 1
        self.buf = np.zeros(n * self.ld + w + 1)
        full = self.buf[:n * self.ld].reshape(n, self.ld)   # row c: column c, rows c - w .. c + w
        for d in range(min(b1, n)):
            full[:n - d, w + d] = lower[d, :n - d]           # A[c + d, c]
            full[d:, w - d] = lower[d, :n - d]               # A[c - d, c] = A[c, c - d]
        step = self.buf.strides[0]
        # every block within w of the diagonal is a slice of this one skewed n x n view (offsets
        # c (ld - 1) + r + w, inside buf for all 0 <= r, c < n; entries farther than w from the
        # diagonal alias other ones and are never read)
        self.view = as_strided(self.buf[w:], shape=(n, n), strides=(step, step * (self.ld - 1)))

    def blk(self, r0: int, r1: int, c0: int, c1: int):
        return self.view[r0:r1, c0:c1]

    def diagonals(self):
        full = self.buf[:self.n * self.ld].reshape(self.n, self.ld)
        return full[:, self.w].copy(), full[:self.n - 1, self.w + 1].copy()


LAG = 1   # sweep j's step k waits for sweep j - 1's step k + LAG (module doc)


def steps_needed(n: int, b: int, j: int, k: int, lag: int = LAG) -> int:
    """How many steps of sweep j - 1 must be finished before step k of sweep j runs (the
    wavefront rule; 0 for sweep 0): its steps 0 .. k + lag, or all of them (lag: LAG, the
    rule; others for the tests that show which lags fail)."""
    return min(k + lag + 1, sweep_steps(n, b, j - 1)) if j > 0 else 0


def defers(n: int, b: int, j: int, k: int) -> bool:
    """Whether step k of sweep j leaves the last of its rows below to its step k + 1 (the module
    doc): wherever sweep j has a step k + 1."""
    return k + 1 < sweep_steps(n, b, j)


def step_blocks(n: int, b: int, j: int, k: int):
    """The rows of step k of sweep j: (s, e, lo, e2).  It reads and writes the lower blocks
    L = A[s:e, lo:s] (the pivot column lo and the bulge; its last row at k >= 1 the row step
    k - 1 deferred), D = A[s:e, s:e] (both triangles) and Y = A[e:ey, s:e] (the rows below:
    ey = e2 - 1 where the step defers, else e2), and writes the mirrors A[lo:s, s:e] and
    A[s:e, e:ey]; nothing else (a step whose pivot column is zero below the pivot writes none
    of them but the deferred row)."""
    s = j + 1 + k * b
    e = min(s + b, n)
    lo = j if k == 0 else s - b
    return s, e, lo, min(e + b, n)


def chase_step(A: _SymmetricBand, refl, n: int, b: int, g: int, j: int, k: int) -> None:
    """Step k of sweep j on the working band A; its reflector into refl[j // g][k, :, j % g].
    First the row step k - 1 deferred (defers): step k - 1's reflector applied to it from the
    right."""
    Rq, t = refl[j // g], j % g
    s, e, lo, e2 = step_blocks(n, b, j, k)
    if k > 0 and Rq[k - 1, b, t] != 0.0:              # the deferred row: the last of L
        ptau, pv = Rq[k - 1, b, t], Rq[k - 1, :s - lo, t]
        row = A.blk(e - 1, e, lo, s)
        row -= np.outer(row @ (ptau * pv), pv)
        A.blk(lo, s, e - 1, e)[...] = row.T
    L = A.blk(s, e, lo, s)
    x = L[:, 0]
    alpha = float(x[0])
    xn2 = float(x[1:] @ x[1:])
    if xn2 == 0.0:                                     # nothing below the pivot: H = I
        Rq[k, 0, t] = 1.0
        return
    beta = -math.copysign(math.hypot(alpha, math.sqrt(xn2)), alpha)
    tau = (beta - alpha) / beta
    v = x * (1.0 / (alpha - beta))
    v[0] = 1.0
    Rq[k, :e - s, t] = v
    Rq[k, b, t] = tau
    x[0] = beta
    x[1:] = 0.0
    if s - lo > 1:                                     # the rest of the bulge, from the left
        Lr = L[:, 1:]
        Lr -= np.outer(v, (tau * v) @ Lr)
    A.blk(lo, s, s, e)[...] = L.T
    D = A.blk(s, e, s, e)                              # two-sided on the diagonal block
    p = D @ (tau * v)
    w = p - (0.5 * tau * (p @ v)) * v
    D -= np.outer(v, w)
    D -= np.outer(w, v)
    ey = e2 - 1 if defers(n, b, j, k) else e2
    if ey > e:                                         # from the right on the rows below: the next bulge
        Y = A.blk(e, ey, s, e)
        Y -= np.outer(Y @ (tau * v), v)
        A.blk(s, e, e, ey)[...] = Y.T


def sb2st(band, g: int | None = None):
    """Tridiagonalize the symmetric band given in lower band storage (band[d, c] = B[c + d, c],
    (b + 1) x n NumPy array): B = Q2 T Q2^T.  Returns (d, e, refl): T's diagonals and Q2's
    reflectors by groups of g sweeps (default b): refl[q] a (K_q, b + 1, g) array, K_q the
    steps of the group's first sweep; refl[q][k, :b, t] is v of sweep q g + t at step k (rows
    q g + 1 + k b + t ..), refl[q][k, b, t] its tau (0: none).  Host, NumPy."""
    b = band.shape[0] - 1
    n = band.shape[1]
    g = b if g is None else g
    if n < 3 or b < 2:                                 # already tridiagonal
        d = np.array(band[0], dtype=np.float64)
        e = np.array(band[1, :max(n - 1, 0)], dtype=np.float64) if b >= 1 else np.zeros(max(n - 1, 0))
        return d, e, [np.zeros((sweep_steps(n, max(b, 1), q * g), b + 1, g)) for q in range(_groups(n, g))]
    A = _SymmetricBand(band, 2 * b)
    refl = [np.zeros(group_shape(n, b, g, q)) for q in range(_groups(n, g))]
    for j in range(n_sweeps(n)):
        for k in range(sweep_steps(n, b, j)):
            chase_step(A, refl, n, b, g, j, k)
    d, e = A.diagonals()
    return d, e, refl


def _groups(n: int, g: int) -> int:
    return -(-n_sweeps(n) // g)


def group_shape(n: int, b: int, g: int, q: int) -> tuple[int, int, int]:
    """The shape of sb2st's reflector array of group q: (K_q, b + 1, g)."""
    return (sweep_steps(n, b, q * g), b + 1, g)


def group_offsets(n: int, b: int, g: int) -> list[int]:
    """Where each group starts in the flat storage of all groups (group q's (K_q, b + 1, g)
    array, C order, at flat[offsets[q]:offsets[q + 1]]; offsets[-1] is the total length): the
    layout the GPU's bulge chasing writes and its Q2 application reads."""
    offsets = [0]
    for q in range(_groups(n, g)):
        K, b1, gg = group_shape(n, b, g, q)
        offsets.append(offsets[-1] + K * b1 * gg)
    return offsets


def apply_q2(refl_of, n: int, b: int, g: int, Z, xp):
    """Z <- Q2 Z in place for sb2st's reflectors, Z (n x ncols) any columns of the n x n matrix
    (a rank's own ones).  refl_of(q): group q's (K_q, b + 1, g) array as an array of xp (called
    once per group, last group first: a rank may receive it then).  Per group and step one
    compact-WY block of height <= b + g - 1: Z[r0:r0 + h] -= V (T (V^T Z[r0:r0 + h]))."""
    ngroups = _groups(n, g)
    if not ngroups:
        return Z
    t_idx = np.arange(g)
    rows = xp.asarray((np.arange(b)[:, None] + t_idx[None, :]).ravel())
    cols = xp.asarray(np.broadcast_to(t_idx, (b, g)).ravel())
    for q in reversed(range(ngroups)):
        R = refl_of(q)
        for k in range(R.shape[0]):
            r0 = q * g + 1 + k * b
            h = min(b + g - 1, n - r0)
            V = xp.zeros((b + g - 1, g), dtype=xp.float64)
            V[rows, cols] = R[k, :b].ravel()           # the skewed columns: v_t from row t
            V = V[:h]
            T = block_reflector(xp, V, R[k, b])
            if Z.shape[1]:
                Zr = Z[r0:r0 + h]
                Zr -= V @ (T @ (V.T @ Zr))
    return Z


__all__ = ["sb2st", "apply_q2", "group_shape", "group_offsets", "sweep_steps", "n_sweeps", "steps_needed",
           "step_blocks", "chase_step", "defers", "LAG"]
