"""How the solver's accuracy against LAPACK (scipy.linalg.eigh(A, B): dsygvd) spreads over
problem sizes on the host backend, and where the eigenvalue error's spread comes from: the
tests' 2x bound holds at their n = 160 but is a ratio of two rounding samples when cond(B) is
large.

    mpiexec -n 2 python3 bench/accuracy_spread.py [--n 150:171] [--cond 1e8,1e12] [--nb 16]

Part 1 (every rank): sygvd at each n, kind (known, clustered, wilkinson) and cond(B); per cond(B)
the median and largest ratio to LAPACK's residual, B-orthogonality and eigenvalue error (the
last against the built spectrum, floored at n eps), and how many cases exceed 2x.
Part 2 (rank 0 alone): the eigenvalue error with C = L^-1 A L^-T formed by LAPACK dsygst from
four Cholesky factors of the same B - the distributed blocked potrf (one process, panels of nb
and of 64), a textbook unblocked Cholesky (dot products per column, as LAPACK dpotf2), and
LAPACK's dpotrf - and LAPACK's dsyev of C: which factor, rounded differently, moves the error;
and with LAPACK's factor, C formed by two whole-matrix triangular solves instead of dsygst (what
the one-GPU anchor does)."""
from __future__ import annotations

import argparse

import numpy as np
import scipy.linalg as sl
from mpi4py import MPI
from scipy.linalg.lapack import dpotrf, dsygst

import hpccoll
from hpccoll.config import git_commit
from hpccoll_eigensolver import BlockCyclic, distribute, gather, metrics, sygvd
from hpccoll_eigensolver.problems import make_problem
from hpccoll_eigensolver.triangular import potrf

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
    """The sweep's --n (lo:hi), --cond and --nb, as every accuracy script takes them."""
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


def main() -> int:
    opts = sweep_arguments(argparse.ArgumentParser()).parse_args()
    comm, lo, hi, conds = open_sweep(opts)
    root = comm.rank == 0
    for cond in conds:
        res, orth, eig, chol = [], [], [], {k: [] for k in ("potrf_nb", "potrf_64", "textbook", "lapack", "two_trsm")}
        for n, _, prob, w, Xg in solved(lo, hi, cond, opts.nb, comm):
            ref = metrics.lapack_reference(prob.A, prob.B, prob.eigenvalues)
            base = ref[2]
            for acc, r in zip((res, orth, eig), metrics.ratios_to(ref, prob.A, prob.B, Xg, w, prob.eigenvalues)):
                acc.append(r)
            one = hpccoll.Communicator(MPI.COMM_SELF, backend="host")
            factors = {"potrf_nb": potrf(np.asfortranarray(prob.B.copy()), BlockCyclic(n, n, opts.nb, 1), one, np),
                       "potrf_64": potrf(np.asfortranarray(prob.B.copy()), BlockCyclic(n, n, 64, 1), one, np),
                       "textbook": metrics.unblocked_cholesky(prob.B),
                       "lapack": np.tril(dpotrf(prob.B, lower=1)[0])}
            one.Free()
            for name, L in factors.items():
                C = dsygst(prob.A, L, itype=1, lower=1)[0]
                chol[name].append(metrics.eigenvalue_error(np.linalg.eigvalsh(C, UPLO="L"), prob.eigenvalues) / base)
            # C as two whole-matrix triangular solves, (L^-1 A) L^-T, its lower triangle read
            L = factors["lapack"]
            C = sl.solve_triangular(L, sl.solve_triangular(L, prob.A, lower=True).T, lower=True).T
            chol["two_trsm"].append(metrics.eigenvalue_error(np.linalg.eigvalsh(C, UPLO="L"), prob.eigenvalues) / base)
        if root:
            print(f"cond(B) = {cond:.0e}, {len(res)} problems, ratio to LAPACK's", flush=True)
            for label, r in (("  sygvd residual", res), ("  sygvd B-orthogonality", orth), ("  sygvd eigenvalue error", eig)):
                print(summary(label, r), flush=True)
            for name, r in chol.items():
                what = ("LAPACK's factor, C by two trsm (not dsygst)" if name == "two_trsm"
                        else f"dsygst + dsyev on the Cholesky factor {name}")
                print(summary(f"  eigenvalue error, {what}", r), flush=True)
    comm.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
