"""The secular equation of one merge (LAPACK dlaed4): its roots, each rank a share of them, one
Allgather; on the GPU one block per root (dc_kernels.cu dc_secular)."""
from __future__ import annotations

import numpy as np

from .._xp import to_host
from .common import EPS, TPB, _Team, chunk_width, dc_kernel

SECULAR_STEPS = 64   # at most (every test matrix converged in <= 12); see _secular


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
        secular = dc_kernel("dc_secular")
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
