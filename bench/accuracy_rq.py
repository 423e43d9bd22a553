"""Would refining the eigenvalues make the eigenvalue error reliably as good as LAPACK's?  The
Rayleigh quotients rho_i = x_i^T A x_i / x_i^T B x_i of the computed eigenvectors, in float64 and
accurately (double-double), against the spectrum A and B were built with, as a ratio to LAPACK's
eigenvalue error (scipy.linalg.eigh(A, B), floored at 4 eps as the tests floor it); the same for
LAPACK's own eigenvectors, whose accurate quotients are close to the stored pencil's exact
eigenvalues.  Host backend; the problems of bench/accuracy_spread.py.

    mpiexec -n 2 python3 bench/accuracy_rq.py [--n 150:171] [--cond 1e8,1e12] [--nb 16] [--list 1]

Accurate quotient: error-free transformations (TwoSum; TwoProduct by Veltkamp splitting),
vectorized over columns.  Y = A X as a double-double, each entry a compensated dot product
(Ogita-Rump-Oishi Dot2); x^T y the same way, num = nh + nl; likewise for B; rho = num / den
with one corrected division.  --validate N checks it against exact fractions.Fraction
arithmetic on N problems per cond(B) (after the run, rank 0)."""
from __future__ import annotations

import argparse
import os
import time
from fractions import Fraction

import numpy as np
import scipy.linalg as sl

from hpccoll_eigensolver import metrics

from accuracy_spread import open_sweep, solved, summary, sweep_arguments  # bench/, beside this script

EPS = np.finfo(np.float64).eps
SPLIT = 134217729.0  # 2^27 + 1


def two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def split(a):
    c = SPLIT * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a, b):
    p = a * b
    ah, al = split(a)
    bh, bl = split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def dd_matmul(A, X):
    """A @ X as double-double (S, C): Dot2 per entry, vectorized over the n x m result."""
    n, m = A.shape[0], X.shape[1]
    S = np.zeros((n, m))
    C = np.zeros((n, m))
    for j in range(A.shape[1]):
        p, e = two_prod(A[:, j:j + 1], X[j:j + 1, :])
        S, e2 = two_sum(S, p)
        C += e + e2
    return two_sum(S, C)  # renormalize: hi, lo


def dd_coldot(X, Yh, Yl):
    """sum_i X[i,k] (Yh[i,k] + Yl[i,k]) per column k as double-double (hi, lo)."""
    P, E = two_prod(X, Yh)
    E = E + X * Yl
    S = np.zeros(X.shape[1])
    C = np.zeros(X.shape[1])
    for i in range(X.shape[0]):
        S, e2 = two_sum(S, P[i])
        C += E[i] + e2
    return two_sum(S, C)


def rq_accurate(A, B, X, return_parts=False):
    nh, nl = dd_coldot(X, *dd_matmul(A, X))
    dh, dl = dd_coldot(X, *dd_matmul(B, X))
    r = nh / dh
    p, e = two_prod(r, dh)           # r*dh = p + e exactly
    rho = r + (((nh - p) - e) + nl - r * dl) / dh
    return (rho, (nh, nl), (dh, dl)) if return_parts else rho


def rq_float64(A, B, X):
    return np.sum(X * (A @ X), axis=0) / np.sum(X * (B @ X), axis=0)


def exact_quadform(M, x):
    xf = [Fraction(float(v)) for v in x]
    total = Fraction(0)
    for i in range(len(xf)):
        row = M[i]
        s = Fraction(0)
        for j in range(len(xf)):
            s += Fraction(float(row[j])) * xf[j]
        total += xf[i] * s
    return total


def validate(A, B, X, cols, label):
    rho, (nh, nl), (dh, dl) = rq_accurate(A, B, X, return_parts=True)
    r64 = rq_float64(A, B, X)
    out = []
    for k in cols:
        num, den = exact_quadform(A, X[:, k]), exact_quadform(B, X[:, k])
        exact = float(num / den)                       # correctly rounded exact RQ
        num_rel = float(abs(Fraction(float(nh[k])) + Fraction(float(nl[k])) - num) / abs(num))
        den_rel = float(abs(Fraction(float(dh[k])) + Fraction(float(dl[k])) - den) / abs(den))
        ulp = float(np.ravel(metrics.ulp_distance(rho[k], exact))[0])
        ulp64 = float(np.ravel(metrics.ulp_distance(r64[k], exact))[0])
        out.append((ulp, num_rel, den_rel))
        print(f"  validate {label} col {k:3d}: rho {exact:+.17e}  accurate vs exact {ulp:.0f} ulp "
              f"(num rel err {num_rel:.1e}, den {den_rel:.1e}); float64 RQ {ulp64:.3g} ulp", flush=True)
    return out


def main() -> int:
    ap = sweep_arguments(argparse.ArgumentParser())
    ap.add_argument("--validate", type=int, default=1, help="problems per cond validated against Fraction")
    ap.add_argument("--list", type=int, default=0, help="1: print each problem where a variant exceeds 2x")
    opts = ap.parse_args()
    os.environ.setdefault("HPCCOLL_TIMEOUT", "600")
    comm, lo, hi, conds = open_sweep(opts)
    root = comm.rank == 0
    t0 = time.time()
    to_validate = []
    for cond in conds:
        names = ("ours as is", "ours RQ float64", "ours RQ accurate", "LAPACK-vectors RQ float64",
                 "LAPACK-vectors RQ accurate")
        ratio = {k: [] for k in names}
        abserr = {k: [] for k in names + ("LAPACK eigenvalues (unfloored)",)}
        res_ratio, res_rq_to_lapack, res_to_lapack, res_lap_rq = [], [], [], []
        unsorted = {k: 0 for k in names}
        sort_changed = {k: 0 for k in names}
        nval = 0
        for n, kind, prob, w, Xg in solved(lo, hi, cond, opts.nb, comm):
            A, B, lam = np.asarray(prob.A), np.asarray(prob.B), np.asarray(prob.eigenvalues)
            ws, Xs = sl.eigh(A, B)
            base = max(metrics.eigenvalue_error(ws, lam), 4 * EPS)
            abserr["LAPACK eigenvalues (unfloored)"].append(metrics.eigenvalue_error(ws, lam))
            vals = {"ours as is": w,
                    "ours RQ float64": rq_float64(A, B, Xg),
                    "ours RQ accurate": rq_accurate(A, B, Xg),
                    "LAPACK-vectors RQ float64": rq_float64(A, B, Xs),
                    "LAPACK-vectors RQ accurate": rq_accurate(A, B, Xs)}
            for k, v in vals.items():
                v = np.asarray(v)
                vs = np.sort(v)
                if np.any(np.diff(v) < 0):
                    unsorted[k] += 1
                e_sorted = metrics.eigenvalue_error(vs, lam)
                if e_sorted != metrics.eigenvalue_error(v, lam):
                    sort_changed[k] += 1
                ratio[k].append(e_sorted / base)
                abserr[k].append(e_sorted)
            if opts.list and max(ratio[k][-1] for k in names) > 2:
                print(f"    over 2x: n {n} {kind}: LAPACK err {metrics.eigenvalue_error(ws, lam):.2e}; ratios "
                      + ", ".join(f"{k} x{ratio[k][-1]:.2f}" for k in names), flush=True)
            r_w = metrics.residual(A, B, Xg, w)
            r_rq = metrics.residual(A, B, Xg, vals["ours RQ accurate"])   # rho_i paired with x_i
            r_lap = metrics.residual(A, B, Xs, ws)
            res_lap_rq.append(metrics.residual(A, B, Xs, vals["LAPACK-vectors RQ accurate"]) / r_lap)
            res_ratio.append(r_rq / r_w)
            res_rq_to_lapack.append(r_rq / r_lap)
            res_to_lapack.append(r_w / r_lap)
            if nval < opts.validate:
                nval += 1
                i_small = int(np.argmin(np.abs(lam)))
                cols = sorted({0, i_small, n // 2, n - 1})
                to_validate.append((A, B, Xg, cols, f"cond {cond:.0e} n {n} {kind} ours X"))
                to_validate.append((A, B, Xs, cols[:2], f"cond {cond:.0e} n {n} {kind} LAPACK X"))
        if root:
            print(f"cond(B) = {cond:.0e}, {len(res_ratio)} problems, eigenvalue error ratio to LAPACK's "
                  f"(floored at 4 eps); RQ values sorted before comparison", flush=True)
            for k in names:
                print(summary(f"  {k:28s}", ratio[k]) + f"   [RQ unsorted in {unsorted[k]}, sorting changed error in "
                      f"{sort_changed[k]}]", flush=True)
            print("  median absolute eigenvalue error (max|w-ref|/max|ref|):", flush=True)
            for k, v in abserr.items():
                print(f"    {k:32s} median {np.median(v):.2e}  max {np.max(v):.2e}", flush=True)
            print(summary("  residual, ours with w := accurate RQ / ours with w", res_ratio), flush=True)
            print(summary("  residual ratio to LAPACK's, ours with w          ", res_to_lapack), flush=True)
            print(summary("  residual ratio to LAPACK's, ours w := accurate RQ", res_rq_to_lapack), flush=True)
            print(summary("  residual, LAPACK X with w := its accurate RQ / LAPACK's", res_lap_rq), flush=True)
            print(f"  elapsed {time.time() - t0:.0f} s", flush=True)
    comm.Free()
    if root and to_validate:
        t1 = time.time()
        print("validation of the accurate RQ against exact Fraction arithmetic (after the run, rank 0):", flush=True)
        worst = [0.0, 0.0, 0.0]
        for case in to_validate:
            for u, nr, dr in validate(*case):
                worst = [max(worst[0], u), max(worst[1], nr), max(worst[2], dr)]
        print(f"  worst: {worst[0]:.0f} ulp from the correctly rounded exact RQ; num rel err {worst[1]:.1e}, "
              f"den rel err {worst[2]:.1e}  ({time.time() - t1:.0f} s)", flush=True)
    if root:
        print(f"total elapsed {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
