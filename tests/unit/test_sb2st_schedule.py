"""The bulge chasing's wavefront rule (sb2st.steps_needed), which the GPU kernel
(sb2st_kernels.cu) waits by: every pair of steps of different sweeps that touch a common band
entry, one of them writing it, is ordered by the rule; interleavings of the host steps that the
rule permits give the serial result bit for bit; the blocks sb2st.step_blocks names are exactly
what a host step reads and writes; and the host sb2st (one chase_step per step) gives the bits
of the loop it replaced."""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import scipy.sparse as sp

from hpccoll_eigensolver.linalg import sb2st as S


def _band(n, b, seed):
    return np.random.default_rng(seed).standard_normal((b + 1, n))


def _serial_before(band, g):
    """sb2st's loop with every step inline and none deferring a row (the rows below updated in
    full by their own step)."""
    b, n = band.shape[0] - 1, band.shape[1]
    A = S._SymmetricBand(band, 2 * b)
    refl = [np.zeros(S.group_shape(n, b, g, q)) for q in range(S._groups(n, g))]
    for j in range(S.n_sweeps(n)):
        q, t = divmod(j, g)
        Rq = refl[q]
        for k in range(S.sweep_steps(n, b, j)):
            s = j + 1 + k * b
            e = min(s + b, n)
            lo = j if k == 0 else s - b
            L = A.blk(s, e, lo, s)
            x = L[:, 0]
            alpha = float(x[0])
            xn2 = float(x[1:] @ x[1:])
            if xn2 == 0.0:
                Rq[k, 0, t] = 1.0
                continue
            beta = -math.copysign(math.hypot(alpha, math.sqrt(xn2)), alpha)
            tau = (beta - alpha) / beta
            v = x * (1.0 / (alpha - beta))
            v[0] = 1.0
            Rq[k, :e - s, t] = v
            Rq[k, b, t] = tau
            x[0] = beta
            x[1:] = 0.0
            if s - lo > 1:
                Lr = L[:, 1:]
                Lr -= np.outer(v, (tau * v) @ Lr)
            A.blk(lo, s, s, e)[...] = L.T
            D = A.blk(s, e, s, e)
            p = D @ (tau * v)
            w = p - (0.5 * tau * (p @ v)) * v
            D -= np.outer(v, w)
            D -= np.outer(w, v)
            e2 = min(e + b, n)
            if e2 > e:
                Y = A.blk(e, e2, s, e)
                Y -= np.outer(Y @ (tau * v), v)
                A.blk(s, e, e, e2)[...] = Y.T
    d, e = A.diagonals()
    return d, e, refl


def _steps(n, b):
    return [(j, k) for j in range(S.n_sweeps(n)) for k in range(S.sweep_steps(n, b, j))]


def _entries(n, b, j, k, deferred=True):
    """(reads, writes) of step (j, k): flat indices r n + c of the n x n matrix, from step_blocks
    (deferred=False: as if no step deferred the last of its rows below, S.defers)."""
    s, e, lo, e2 = S.step_blocks(n, b, j, k)
    if deferred and S.defers(n, b, j, k):
        e2 -= 1

    def block(r0, r1, c0, c1):
        r, c = np.meshgrid(np.arange(r0, r1), np.arange(c0, c1), indexing="ij")
        return (r * n + c).ravel()

    L, D, Y = block(s, e, lo, s), block(s, e, s, e), block(e, e2, s, e)
    Lt, Yt = block(lo, s, s, e), block(s, e, e, e2)
    return np.concatenate([L, D, Y]), np.concatenate([L, Lt, D, Y, Yt])


def _done_before(n, b, needed):
    """done[(j, k)][i]: the steps of sweep i < j certainly finished when step k of sweep j starts,
    under the rule `needed` and each sweep's own order (the transitive closure)."""
    done = {}
    for j, k in _steps(n, b):
        got = np.zeros(j, dtype=np.int64)
        if k > 0:
            got = np.maximum(got, done[(j, k - 1)])
        c = needed(n, b, j, k)
        if j > 0 and c > 0:
            got[j - 1] = max(got[j - 1], c)
            got[:j - 1] = np.maximum(got[:j - 1], done[(j - 1, c - 1)])
        done[(j, k)] = got
    return done


def _unordered_conflicts(n, b, needed, deferred=True):
    """The pairs of steps of different sweeps that touch a common entry (one writing it) and that
    `needed` does not order (the earlier sweep's step not certainly finished when the later starts)."""
    steps = _steps(n, b)
    rows_r, cols_r, rows_w, cols_w = [], [], [], []
    for i, (j, k) in enumerate(steps):
        r, w = _entries(n, b, j, k, deferred)
        rows_r.append(np.full(r.size, i)), cols_r.append(r)
        rows_w.append(np.full(w.size, i)), cols_w.append(w)
    shape = (len(steps), n * n)
    R = sp.csr_matrix((np.ones(sum(map(len, cols_r))), (np.concatenate(rows_r), np.concatenate(cols_r))), shape=shape)
    W = sp.csr_matrix((np.ones(sum(map(len, cols_w))), (np.concatenate(rows_w), np.concatenate(cols_w))), shape=shape)
    conflict = (W @ W.T + W @ R.T + R @ W.T).tocoo()
    done = _done_before(n, b, needed)
    bad = []
    for p1, p2 in zip(conflict.row, conflict.col):
        (j1, k1), (j2, k2) = steps[p1], steps[p2]
        if j1 < j2 and not k1 < done[(j2, k2)][j1]:
            bad.append(((j1, k1), (j2, k2)))
    return bad, conflict.nnz


CASES = [(n, b) for b in (2, 3, 5, 8, 16) for n in (3, 4, b + 1, b + 2, 2 * b + 1, 3 * b + 2, 5 * b + 3, 40, 101)
         if n >= 3]


@pytest.mark.parametrize("n,b", sorted(set(CASES)))
def test_the_rule_orders_every_conflicting_pair(n, b):
    bad, pairs = _unordered_conflicts(n, b, S.steps_needed)
    assert not bad, f"n={n} b={b}: {len(bad)} conflicting pairs the rule leaves unordered, e.g. {bad[:3]}"
    assert pairs > 0


def _lag(lag):
    return functools.partial(S.steps_needed, lag=lag)


@pytest.mark.parametrize("n,b", [(40, 2), (40, 5), (57, 8)])
def test_the_check_fails_for_a_lag_of_zero_and_for_one_without_the_deferral(n, b):
    """The check can fail: sweep j waiting only for sweep j - 1's step k races on the pivot
    block of sweep j - 1's step k + 1; without the deferred row, waiting for step k + 1 races on
    the pivot of sweep j - 1's step k + 2, in the last row below step k (that of LAG = 2 holds)."""
    bad, _ = _unordered_conflicts(n, b, _lag(0))
    assert bad
    bad, _ = _unordered_conflicts(n, b, _lag(1), deferred=False)
    assert bad
    (j1, k1), (j2, k2) = bad[0]
    assert j2 == j1 + 1 and k1 == k2 + 2
    bad, _ = _unordered_conflicts(n, b, _lag(2), deferred=False)
    assert not bad


def _run(band, g, order):
    """The host steps in the given order of (j, k): (d, e, refl)."""
    b, n = band.shape[0] - 1, band.shape[1]
    A = S._SymmetricBand(band, 2 * b)
    refl = [np.zeros(S.group_shape(n, b, g, q)) for q in range(S._groups(n, g))]
    for j, k in order:
        S.chase_step(A, refl, n, b, g, j, k)
    d, e = A.diagonals()
    return d, e, refl


def permitted_order(n, b, needed, rng, greedy=False):
    """A random order of every step in which each step runs only after its sweep's earlier steps
    and the steps of the previous sweep that `needed` asks for (greedy: always the highest
    sweep that may run, the most out of serial order)."""
    K = [S.sweep_steps(n, b, j) for j in range(S.n_sweeps(n))]
    done = [0] * len(K)
    order = []
    while len(order) < sum(K):
        ready = [j for j in range(len(K)) if done[j] < K[j] and (j == 0 or done[j - 1] >= needed(n, b, j, done[j]))]
        j = ready[-1] if greedy else ready[rng.integers(len(ready))]
        order.append((j, done[j]))
        done[j] += 1
    return order


def _same_bits(x, y):
    (d1, e1, r1), (d2, e2, r2) = x, y
    return (d1.tobytes() == d2.tobytes() and e1.tobytes() == e2.tobytes()
            and all(a.tobytes() == c.tobytes() for a, c in zip(r1, r2)) and len(r1) == len(r2))


@pytest.mark.parametrize("n,b,g", [(37, 2, 2), (50, 3, 5), (67, 5, 5), (61, 8, 3), (90, 16, 16), (83, 16, 1)])
def test_permitted_interleavings_give_the_serial_bits(n, b, g):
    band = _band(n, b, seed=n * b)
    serial = _run(band, g, _steps(n, b))
    rng = np.random.default_rng(n + b + g)
    orders = [permitted_order(n, b, S.steps_needed, rng) for _ in range(4)]
    orders.append(permitted_order(n, b, S.steps_needed, rng, greedy=True))
    for order in orders:
        assert order != _steps(n, b)
        assert _same_bits(_run(band, g, order), serial)


def test_an_interleaving_a_lag_of_zero_permits_differs():
    """The bitwise check can fail: the greedy order under a lag of zero runs a step before the
    entries it reads are final, and the result differs."""
    n, b, g = 40, 4, 4
    band = _band(n, b, seed=3)
    order = permitted_order(n, b, _lag(0), None, greedy=True)
    assert not _same_bits(_run(band, g, order), _run(band, g, _steps(n, b)))


def _storage_index(n, b):
    """flat index r n + c -> position in _SymmetricBand(., 2b).buf, for |r - c| <= 2b."""
    w, ld = 2 * b, 4 * b + 1
    r, c = np.divmod(np.arange(n * n), n)
    ok = np.abs(r - c) <= w
    return np.flatnonzero(ok), (c * ld + r - c + w)[ok]


@pytest.mark.parametrize("n,b", [(23, 3), (40, 5), (19, 8), (70, 16)])
def test_step_blocks_are_what_a_step_reads_and_writes(n, b):
    """A step's results depend only on the entries step_blocks names as read (everything else
    replaced by noise gives the same bits) and it changes only those named as written."""
    rng = np.random.default_rng(n * b)
    g = b
    band = _band(n, b, seed=7)
    entries, where = _storage_index(n, b)
    steps = _steps(n, b)
    for i in sorted(rng.choice(len(steps), size=min(12, len(steps)), replace=False)):
        j, k = steps[i]
        A = S._SymmetricBand(band, 2 * b)
        refl = [np.zeros(S.group_shape(n, b, g, q)) for q in range(S._groups(n, g))]
        for jj, kk in steps[:i]:                 # the state the step meets in the serial run
            S.chase_step(A, refl, n, b, g, jj, kk)
        reads, writes = _entries(n, b, j, k)
        noisy = S._SymmetricBand(band, 2 * b)
        noisy.buf[:] = A.buf
        outside = where[~np.isin(entries, reads)]
        noisy.buf[outside] = rng.standard_normal(outside.size)
        before = A.buf.copy()
        r1 = [r.copy() for r in refl]
        r2 = [r.copy() for r in refl]
        S.chase_step(A, r1, n, b, g, j, k)
        S.chase_step(noisy, r2, n, b, g, j, k)
        assert all(x.tobytes() == y.tobytes() for x, y in zip(r1, r2))
        wpos = where[np.isin(entries, writes)]
        assert A.buf[wpos].tobytes() == noisy.buf[wpos].tobytes()
        unchanged = np.ones(A.buf.size, dtype=bool)
        unchanged[wpos] = False
        assert np.array_equal(A.buf[unchanged], before[unchanged])
        assert not np.array_equal(A.buf[wpos], before[wpos])   # it did write


@pytest.mark.parametrize("n,b,g", [(57, 5, 3), (40, 8, 8), (33, 16, 5), (10, 3, 7), (4, 2, 2), (3, 2, 1), (64, 2, 64)])
def test_host_sb2st_is_the_loop_without_deferred_rows_to_rounding(n, b, g):
    """Deferring a row changes no operation on it, only how NumPy's matrix-vector products group
    its sums: T's eigenvalues the same to rounding (its entries, which a reduction's rounding can
    move by more, close), the same reflectors written."""
    band = _band(n, b, seed=None)
    (d1, e1, r1), (d2, e2, r2) = S.sb2st(band, g), _serial_before(band, g)
    scale = np.abs(band).max() * np.sqrt(b + 1)

    def eig(d, e):
        return np.linalg.eigvalsh(np.diag(d) + np.diag(e, 1) + np.diag(e, -1))

    assert np.abs(eig(d1, e1) - eig(d2, e2)).max() < 1e-13 * n * scale
    assert np.abs(d1 - d2).max() < 1e-8 * scale and np.abs(e1 - e2).max(initial=0) < 1e-8 * scale
    assert len(r1) == len(r2) and all(np.array_equal(x == 0, y == 0) for x, y in zip(r1, r2))


def test_steps_needed_is_lag_steps_ahead_or_all():
    n, b = 50, 4
    assert S.steps_needed(n, b, 0, 0) == 0
    for j in range(1, S.n_sweeps(n)):
        K = S.sweep_steps(n, b, j - 1)
        for k in range(S.sweep_steps(n, b, j)):
            assert S.steps_needed(n, b, j, k) == min(k + S.LAG + 1, K)


@pytest.mark.parametrize("n,b", [(40, 2), (40, 5), (57, 8), (101, 16), (67, 3)])
def test_no_other_sweep_writes_the_pivot_block_a_step_keeps(n, b):
    """The kernel keeps step k - 1's updated Y in shared memory as step k's pivot block
    L = A[s:e, lo:s] instead of reading it again, all but its last row (the deferred one, read
    again after the wait): under the rule, every step of another sweep that writes an entry of
    the rows kept either finished before step k - 1 started (a lower sweep) or starts after step
    k finished (a higher one); and a lower sweep's step does write the last row after step k - 1
    started (the re-read is needed)."""
    done = _done_before(n, b, S.steps_needed)
    writes = {jk: set(_entries(n, b, *jk)[1].tolist()) for jk in _steps(n, b)}
    checked = racy = 0
    for j, k in _steps(n, b):
        if k == 0:
            continue
        s, e, lo, _ = S.step_blocks(n, b, j, k)
        r, c = np.meshgrid(np.arange(s, e - 1), np.arange(lo, s), indexing="ij")
        L = set((r * n + c).ravel().tolist())
        last = set((e - 1) * n + np.arange(lo, s))
        for x in range(done[(j, k - 1)][j - 1] if j > 0 else 0, S.sweep_steps(n, b, j - 1) if j > 0 else 0):
            racy += bool(writes[(j - 1, x)] & last)
        for (i, x), w in writes.items():
            if i == j or not (w & L):
                continue
            checked += 1
            if i < j:
                assert x < done[(j, k - 1)][i], f"sweep {i} step {x} may write step ({j}, {k})'s kept block"
            else:
                assert k < done[(i, x)][j], f"sweep {i} step {x} may write step ({j}, {k})'s kept block"
    assert checked > 0 and racy > 0
