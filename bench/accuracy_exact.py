"""The eigenvalue error measured against the exact spectrum of the stored pair (A, B) rather
than the spectrum make_problem built it from, for the solver (host backend) and for LAPACK
(scipy.linalg.eigh(A, B): dsygvd).

Forming A and B in float64 moves their spectrum off the built one by roughly as much as a
solver's own rounding at large cond(B), so an error against the built spectrum mixes the two.
Here the reference is the stored pair's (metrics.stored_spectrum: C = L^-1 A L^-T formed in
long double from the float64 A and B, rounded to float64 once, then LAPACK's dsyevd);
`--check-mp N` first compares that reference with mpmath's at 50 digits on a problem of order N.

    mpiexec -n 2 python3 bench/accuracy_exact.py [--n 150:171] [--cond 1e8,1e12] [--nb 16]
    mpiexec -n 3 python3 bench/accuracy_exact.py --table 400 --nb 32 --cond 1e3,1e8,1e12

Per cond(B) and for each reference: the median and largest ratio of the solver's eigenvalue
error to LAPACK's (floor n eps, as the tests), and how many problems exceed 2x; also LAPACK's
dsygst + dsyev on a textbook Cholesky factor, and each error's size against the built spectrum."""
from __future__ import annotations

import argparse

import numpy as np
import scipy.linalg as sl
from scipy.linalg.lapack import dsygst

import hpccoll
from hpccoll.config import git_commit
from hpccoll_eigensolver import BlockCyclic, distribute, gather, metrics, sygvd
from hpccoll_eigensolver.problems import make_problem

KINDS = ("known", "clustered", "wilkinson")


def solve(kind: str, n: int, cond: float, nb: int, comm):
    """sygvd of make_problem(kind, n, cond, seed 3) on every rank: (problem, w, X gathered on
    rank 0)."""
    prob = make_problem(kind, n, cond_b=cond, seed=3)
    desc = BlockCyclic(n, n, nb, comm.size)
    w, X = sygvd(distribute(prob.A, desc, comm.rank), distribute(prob.B, desc, comm.rank), desc, comm)
    return prob, w, gather(X, desc, comm)


def solved(lo: int, hi: int, cond: float, nb: int, comm):
    """sygvd of every problem (n in [lo, hi), each kind, seed 3) on every rank; on rank 0 yields
    (n, kind, problem, w, X gathered)."""
    for n in range(lo, hi):
        for kind in KINDS:
            prob, w, Xg = solve(kind, n, cond, nb, comm)
            if comm.rank == 0:
                yield n, kind, prob, w, Xg


def sweep_arguments(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The sweep's --n (lo:hi), --cond and --nb."""
    ap.add_argument("--n", default="150:171")
    ap.add_argument("--cond", default="1e8,1e12")
    ap.add_argument("--nb", type=int, default=16)
    return ap


def open_sweep(opts, extra: str = ""):
    """(host Communicator, lo, hi, conds) of the parsed sweep arguments; rank 0 prints the run's
    header line (commit, ranks, nb, sizes, kinds, seed; then `extra`)."""
    lo, hi = map(int, opts.n.split(":"))
    conds = [float(c) for c in opts.cond.split(",")]
    comm = hpccoll.Communicator(backend="host", deterministic=True)
    if comm.rank == 0:
        print(f"commit {git_commit()}  host backend, {comm.size} rank(s), nb {opts.nb}, n {lo}..{hi - 1}, "
              f"kinds {', '.join(KINDS)}, seed 3{extra}", flush=True)
    return comm, lo, hi, conds


def summary(label, ratios):
    r = np.array(ratios)
    return f"{label}: median x{np.median(r):.2f}  max x{r.max():.2f}  over 2x {int((r > 2).sum())}/{r.size}"


def mp_spectrum(A: np.ndarray, B: np.ndarray, dps: int = 50) -> np.ndarray:
    import mpmath as mp

    mp.mp.dps = dps
    n = A.shape[0]
    Am, Bm = mp.matrix(A.tolist()), mp.matrix(B.tolist())
    L = mp.cholesky(Bm)
    Li = mp.inverse(L)
    C = Li * Am * Li.T
    C = (C + C.T) / 2
    w = mp.eigsy(C, eigvals_only=True)
    return np.sort(np.array([float(w[i]) for i in range(n)]))


def table(n: int, conds, nb: int, comm) -> None:
    """Residual, B-orthogonality and eigenvalue error (against the stored pair's spectrum and the
    built one), ours / LAPACK's, per kind and cond(B) at order n (rank 0 prints)."""
    if comm.rank == 0:
        print(f"n = {n}: residual | B-orthogonality | eigenvalue error against the stored pair's spectrum | "
              f"against the built one; each ours / LAPACK's (no floor)", flush=True)
    for kind in KINDS:
        for cond in conds:
            prob, w, Xg = solve(kind, n, cond, nb, comm)
            if comm.rank != 0:
                continue
            wl, Xl = sl.eigh(prob.A, prob.B)
            stored, built = metrics.stored_spectrum(prob.A, prob.B), np.asarray(prob.eigenvalues)
            cells = [(metrics.residual(prob.A, prob.B, Xg, w), metrics.residual(prob.A, prob.B, Xl, wl)),
                     (metrics.b_orthogonality(prob.B, Xg), metrics.b_orthogonality(prob.B, Xl)),
                     (metrics.eigenvalue_error(w, stored), metrics.eigenvalue_error(wl, stored)),
                     (metrics.eigenvalue_error(w, built), metrics.eigenvalue_error(wl, built))]
            print(f"| {kind} | {cond:.0e} | " + " | ".join(f"{a:.2e} / {b:.2e}" for a, b in cells) + " |", flush=True)


def main() -> int:
    ap = sweep_arguments(argparse.ArgumentParser())
    ap.add_argument("--check-mp", type=int, default=0, help="order of the problem checked against mpmath first")
    ap.add_argument("--table", type=int, default=0,
                    help="instead: one row per kind and cond(B) at this n, each metric ours / LAPACK's")
    opts = ap.parse_args()
    comm, lo, hi, conds = open_sweep(opts, f", numpy {np.__version__}, long double eps "
                                           f"{np.finfo(np.longdouble).eps:.2e}")
    root = comm.rank == 0
    if root and opts.check_mp:
        for cond in conds:
            p = make_problem("known", opts.check_mp, cond_b=cond, seed=3)
            ref_mp, ref_ld = mp_spectrum(p.A, p.B), metrics.stored_spectrum(p.A, p.B)
            w = sl.eigh(p.A, p.B, eigvals_only=True)
            print(f"check, n {opts.check_mp}, cond(B) {cond:.0e}: long double reference vs mpmath "
                  f"{metrics.eigenvalue_error(ref_ld, ref_mp):.2e}; LAPACK vs mpmath "
                  f"{metrics.eigenvalue_error(w, ref_mp):.2e}; built spectrum vs mpmath "
                  f"{metrics.eigenvalue_error(np.asarray(p.eigenvalues), ref_mp):.2e}", flush=True)
    if opts.table:
        table(opts.table, conds, opts.nb, comm)
        comm.Free()
        return 0
    for cond in conds:
        rows = {k: [] for k in ("built", "stored", "textbook_built", "textbook_stored")}
        sizes = {k: [] for k in ("ours_stored", "lapack_stored", "built_vs_stored")}
        outliers = []
        for n, kind, prob, w, _ in solved(lo, hi, cond, opts.nb, comm):
            built = np.asarray(prob.eigenvalues)
            stored = metrics.stored_spectrum(prob.A, prob.B)
            wl = sl.eigh(prob.A, prob.B, eigvals_only=True)
            C = dsygst(prob.A, metrics.unblocked_cholesky(prob.B), itype=1, lower=1)[0]
            wt = np.linalg.eigvalsh(C, UPLO="L")
            e = {(who, ref_name): metrics.floored_eigenvalue_error(np.sort(v), ref)
                 for who, v in (("ours", w), ("lapack", wl), ("textbook", wt))
                 for ref_name, ref in (("built", built), ("stored", stored))}
            for ref_name in ("built", "stored"):
                rows[ref_name].append(e["ours", ref_name] / e["lapack", ref_name])
                rows[f"textbook_{ref_name}"].append(e["textbook", ref_name] / e["lapack", ref_name])
            sizes["ours_stored"].append(e["ours", "stored"])
            sizes["lapack_stored"].append(e["lapack", "stored"])
            sizes["built_vs_stored"].append(metrics.eigenvalue_error(built, stored))
            if rows["stored"][-1] > 2 or rows["built"][-1] > 2:
                outliers.append(f"    n {n} {kind}: sygvd {e['ours', 'stored']:.2e} LAPACK {e['lapack', 'stored']:.2e} "
                                f"against the stored pair's (x{rows['stored'][-1]:.2f}); {e['ours', 'built']:.2e} / "
                                f"{e['lapack', 'built']:.2e} against the built (x{rows['built'][-1]:.2f})")
        if root:
            print(f"cond(B) = {cond:.0e}, {len(rows['built'])} problems, eigenvalue error's ratio to LAPACK's", flush=True)
            print(summary("  sygvd, against the built spectrum ", rows["built"]), flush=True)
            print(summary("  sygvd, against the stored pair's  ", rows["stored"]), flush=True)
            print(summary("  textbook Cholesky + dsygst + dsyev, built ", rows["textbook_built"]), flush=True)
            print(summary("  textbook Cholesky + dsygst + dsyev, stored", rows["textbook_stored"]), flush=True)
            for k, v in sizes.items():
                print(f"  {k}: median {np.median(v):.2e}  max {np.max(v):.2e}", flush=True)
            if outliers:
                print("  sygvd over 2x LAPACK's against either spectrum:\n" + "\n".join(outliers), flush=True)
    comm.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
