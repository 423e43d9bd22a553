"""The NumPy twin of stein_kernels.cu: each kernel's arithmetic, statement for statement and in
the same order, vectorized over the kernel's threads (eigenvalues, vectors of one block) --
the same bits as the GPU (the kernels contract no multiply-add).  TwinOps runs in place of
stein_device.DeviceOps, so stein_device's iteration and planning run unchanged on the host;
the CPU tests check the algorithm through it and the GPU tests check the kernels against it."""
from __future__ import annotations

import numpy as np

from .stein_device import BIGNUM, DONE, EPS, FUDGE, SAFEMIN, TPB, ULP, Sturm

_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def start_values(index, m: int) -> np.ndarray:
    """m x len(index) start vectors: stein_kernels.cu's startValue(g, i), rows i = 0..m-1."""
    rows = np.arange(m, dtype=np.uint64)[:, None]
    x = (np.asarray(index, dtype=np.uint64)[None, :] << np.uint64(32)) + rows + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    x = x ^ (x >> np.uint64(31))
    return 2.0 * ((x >> np.uint64(11)).astype(np.float64) * 2.0 ** -53) - 1.0


def _sturm_step(q, x, pivmin, c):
    """sturmStep for every lane: (the new pivots, the counts)."""
    qx = q - x
    neg = qx <= pivmin
    return np.where(neg, np.fmin(qx, -pivmin), qx), c + neg


def sturm_count(d, e2, x, pivmin) -> np.ndarray:
    """sturmCount at each x."""
    c = np.zeros(x.shape, dtype=np.int64)
    q, c = _sturm_step(d[0], x, pivmin, c)
    for i in range(1, d.shape[0]):
        q, c = _sturm_step(d[i] - e2[i - 1] / q, x, pivmin, c)
    return c


def _bisect(d, e2, j, pivmin, abstol, reltol, itmax, a, b, ca):
    """The kernel's bisect() for every lane (lanes step together; lane l's `it` is the kernel's):
    (a, b, ca, the lanes that did not converge)."""
    live = np.ones(j.shape, dtype=bool)
    failed = np.zeros(j.shape, dtype=bool)
    it = 0
    while True:
        tol = np.fmax(np.fmax(abstol, pivmin), reltol * np.fmax(np.abs(a), np.abs(b)))
        live &= ~(b - a < tol)
        if it == itmax:
            failed |= live
            live[:] = False
        if not live.any():
            return a, b, ca, failed
        mid = 0.5 * (a + b)
        c = sturm_count(d, e2, mid, pivmin)
        up, down = live & (c <= j), live & ~(c <= j)
        a, ca, b = np.where(up, mid, a), np.where(up, c, ca), np.where(down, mid, b)
        it += 1


def _block_sum(p: np.ndarray) -> float:
    """stein_orth's blockReduce<true> of the products p (local rows in order): lane t sums rows
    t, t + TPB, ... from 0.0, then the tree (padding with +0.0 adds nothing: a lane's partial
    sum, started at +0.0, is never -0.0)."""
    lanes = np.zeros(-(-p.shape[0] // TPB) * TPB)
    lanes[:p.shape[0]] = p
    acc = np.zeros(TPB)
    for row in lanes.reshape(-1, TPB):
        acc = acc + row
    s = TPB // 2
    while s:
        acc[:s] = acc[:s] + acc[s:2 * s]
        s //= 2
    return acc[0]


def _groups(first, end, lanes):
    """The lanes (indices) by block: [(r0, m, lanes of that block)]."""
    out = []
    for r0, r1 in sorted(set(zip(first[lanes].tolist(), end[lanes].tolist()))):
        out.append((r0, r1 - r0, lanes[(first[lanes] == r0) & (end[lanes] == r1)]))
    return out


class TwinOps:
    """DeviceOps' interface on host arrays, each kernel by its twin."""

    xp = np

    def bisect(self, d, e, st: Sturm, lo: int, k: int):
        n, e2, pivmin = d.shape[0], st.e2, st.pivmin
        j = lo + np.arange(k)
        a, b = np.full(k, st.gl), np.full(k, st.gu)
        ca = sturm_count(d, e2, a, pivmin)
        flag = np.where((ca != 0) | (sturm_count(d, e2, b, pivmin) != n), 1, 0).astype(np.int32)
        a, b, ca, failed = _bisect(d, e2, j, pivmin, st.abstol, st.reltol, st.itmax, a, b, ca)
        flag[failed] |= 2
        # 2. the block
        r = j - ca
        inA, inB, seen, jB = (np.zeros(k, dtype=np.int64) for _ in range(4))
        qa, qb = np.zeros(k), np.zeros(k)
        first, end = np.full(k, -1, dtype=np.int64), np.full(k, -1, dtype=np.int64)
        found = np.zeros(k, dtype=bool)
        start = 0
        for i in range(n):
            qa, inA = _sturm_step(d[i] if i == 0 else d[i] - e2[i - 1] / qa, a, pivmin, inA)
            qb, inB = _sturm_step(d[i] if i == 0 else d[i] - e2[i - 1] / qb, b, pivmin, inB)
            if i == n - 1 or e2[i] == 0.0:
                now = ~found & (seen + (inB - inA) > r)
                first[now], end[now], jB[now] = start, i + 1, (inA + (r - seen))[now]
                found |= now
                seen = seen + (inB - inA)
                inA, inB = np.zeros(k, dtype=np.int64), np.zeros(k, dtype=np.int64)
                start = i + 1
        flag[~found] |= 4
        w = 0.5 * (a + b)
        # 3. each block alone, lanes grouped by block
        for r0, m, ln in _groups(first, end, np.flatnonzero(found)):
            if m == 1:
                w[ln] = d[r0]
                continue
            lo2 = hi2 = d[r0]
            t1 = 0.0
            for i in range(r0, r0 + m - 1):
                t2 = abs(e[i])
                hi2, lo2 = max(hi2, (d[i] + t1) + t2), min(lo2, (d[i] - t1) - t2)
                t1 = t2
            hi2, lo2 = max(hi2, d[r0 + m - 1] + t1), min(lo2, d[r0 + m - 1] - t1)
            widen = ((FUDGE * max(abs(lo2), abs(hi2))) * ULP) * float(m)
            lo2, hi2 = (lo2 - widen) - FUDGE * pivmin, (hi2 + widen) + FUDGE * pivmin
            a2, b2 = np.fmax(a[ln], lo2), np.fmin(b[ln], hi2)
            db, e2b = d[r0:r0 + m], e2[r0:r0 + m - 1]
            c2 = sturm_count(db, e2b, a2, pivmin)
            flag[ln[(c2 > jB[ln]) | (sturm_count(db, e2b, b2, pivmin) <= jB[ln])]] |= 8
            a2, b2, _, failed = _bisect(db, e2b, jB[ln], pivmin, ULP * max(abs(lo2), abs(hi2)), st.reltol, st.itmax,
                                        a2, b2, c2)
            flag[ln[failed]] |= 2
            w[ln] = 0.5 * (a2 + b2)
        return w, first, end, flag

    def factor(self, d, e, put, Y, start: bool):
        n, K = Y.shape
        first, end, shift, index = put["first"], put["end"], put["shift"], put["index"]
        lu = {name: np.zeros((n, K)) for name in ("A", "B", "C", "DD")}
        lu["piv"] = np.zeros((n, K), dtype=np.int8)
        lu["tol"], lu["ulast"] = np.zeros(K), np.zeros(K)
        eps = EPS
        for r0, m, ln in _groups(first, end, np.arange(K)):
            if m == 1:
                Y[r0, ln] = 1.0
                continue
            if start:
                Y[r0:r0 + m, ln] = start_values(index[ln], m)
            lam = shift[ln]
            ak = d[r0] - lam
            bk = np.full(ln.shape, e[r0])
            scale1 = np.abs(ak) + np.abs(bk)
            big = np.zeros(ln.shape)
            with np.errstate(divide="ignore", invalid="ignore"):
                for k in range(m - 1):
                    ck = np.full(ln.shape, e[r0 + k])
                    ak1 = d[r0 + k + 1] - lam
                    bk1 = np.full(ln.shape, e[r0 + k + 1] if k < m - 2 else 0.0)
                    scale2 = np.abs(ck) + np.abs(ak1)
                    if k < m - 2:
                        scale2 = scale2 + np.abs(bk1)
                    piv1 = np.where(ak == 0.0, 0.0, np.abs(ak) / scale1)
                    zero = ck == 0.0
                    keep = ~zero & (np.abs(ck) / scale2 <= piv1)
                    swap = ~zero & ~keep
                    scale1 = np.where(zero | keep, scale2, scale1)
                    # no interchange
                    ck_keep = ck / ak
                    ak1_keep = ak1 - ck_keep * bk
                    # interchange
                    mult = ak / ck
                    ak1_swap = bk - mult * ak1
                    ddk = np.where(swap, bk1, 0.0) if k < m - 2 else np.zeros(ln.shape)
                    bk1_swap = -(mult * ddk) if k < m - 2 else bk1
                    ak, bk, ck, ak1, bk1 = (np.where(swap, ck, ak), np.where(swap, ak1, bk),
                                            np.where(swap, mult, np.where(keep, ck_keep, ck)),
                                            np.where(swap, ak1_swap, np.where(keep, ak1_keep, ak1)),
                                            np.where(swap, bk1_swap, bk1))
                    row = r0 + k
                    lu["A"][row, ln], lu["B"][row, ln], lu["C"][row, ln] = ak, bk, ck
                    lu["DD"][row, ln], lu["piv"][row, ln] = ddk, swap
                    big = np.fmax(big, np.fmax(np.abs(ak), np.fmax(np.abs(bk), np.abs(ddk))))
                    ak, bk = ak1, bk1
            lu["A"][r0 + m - 1, ln] = ak
            big = np.fmax(big, np.abs(ak))
            tol = big * eps
            lu["tol"][ln] = np.where(tol == 0.0, eps, tol)
            lu["ulast"][ln] = np.abs(ak)
        return lu

    def solve(self, put, lu, Y, active):
        K = Y.shape[1]
        expo = np.zeros(K, dtype=np.int32)
        A, B, C, DD, piv = lu["A"], lu["B"], lu["C"], lu["DD"], lu["piv"]
        for r0, m, ln in _groups(put["first"], put["end"], np.flatnonzero(active)):
            if m == 1:
                continue
            y = Y[r0:r0 + m, ln]
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                scl = ((float(m) * put["onenrm"][ln]) * np.fmax(ULP, lu["ulast"][ln])) / np.abs(y).max(axis=0)
                y = y * scl
                prev = y[0].copy()
                for k in range(1, m):
                    c, p, cur = C[r0 + k - 1, ln], piv[r0 + k - 1, ln] != 0, y[k]
                    y[k - 1] = np.where(p, cur, prev)
                    prev = np.where(p, prev - c * cur, cur - c * prev)
                y[m - 1] = prev
                tol = lu["tol"][ln]
                y1, y2 = np.zeros(ln.shape), np.zeros(ln.shape)
                for k in range(m - 1, -1, -1):
                    temp = y[k]
                    if k <= m - 2:
                        temp = temp - B[r0 + k, ln] * y1
                    if k <= m - 3:
                        temp = temp - DD[r0 + k, ln] * y2
                    ak = A[r0 + k, ln]
                    pert = np.copysign(tol, ak)
                    live = np.ones(ln.shape, dtype=bool)
                    while live.any():              # dlagts' perturbation loop, lane by lane
                        absak = np.abs(ak)
                        tiny = live & (absak < 1.0) & (absak < SAFEMIN)
                        small = live & (absak < 1.0) & ~(absak < SAFEMIN)
                        bump = (tiny & ((absak == 0.0) | (np.abs(temp) * SAFEMIN > absak))) | \
                               (small & (np.abs(temp) > absak * BIGNUM))
                        rescale = tiny & ~bump
                        temp, ak = np.where(rescale, temp * BIGNUM, temp), np.where(rescale, ak * BIGNUM, ak)
                        ak, pert = np.where(bump, ak + pert, ak), np.where(bump, 2.0 * pert, pert)
                        live = bump
                    yk = temp / ak
                    y[k] = yk
                    y2, y1 = y1, yk
                ymax = np.abs(y).max(axis=0)
                ok = (ymax > 0.0) & np.isfinite(ymax)
                ex = np.where(ok, np.frexp(np.where(ok, ymax, 1.0))[1], 0).astype(np.int32)
                y = np.where(ok, np.ldexp(y, -ex), y)
            Y[r0:r0 + m, ln] = y
            expo[ln] = ex
        return expo

    def orth(self, put, active, qr_from: int, expo, nrmchk, Y):
        first, end, dtpcrt = put["first"], put["end"], put["dtpcrt"]
        for c in np.flatnonzero(active):
            j0, j1 = int(put["cstart"][c]), int(put["cend"][c])
            if j1 - j0 >= qr_from:
                continue
            r0, r1 = int(first[j0]), int(end[j0])
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                for j in range(j0, j1):
                    y = Y[r0:r1, j]
                    for i in range(j0, j):
                        q = Y[r0:r1, i]
                        y[:] = y - _block_sum(q * y) * q
                    mx, ss = np.abs(y).max(), _block_sum(y * y)
                    if mx >= np.ldexp(dtpcrt[j], -int(expo[j])):
                        nrmchk[j] += 1
                    y[:] = y * (1.0 / np.sqrt(ss))

    def finish(self, put, nrmchk, Y):
        for j in range(Y.shape[1]):
            r0, r1 = int(put["first"][j]), int(put["end"][j])
            if r1 - r0 == 1:
                continue
            y = Y[r0:r1, j]
            if nrmchk[j] < DONE:
                y[:] = np.nan
            elif y[np.argmax(np.abs(y))] < 0.0:
                y[:] = -y
