"""The accuracy matrix of tests/gpu (residual, B-orthogonality, eigenvalue error against LAPACK
sygvd through SciPy) over sizes and the divide and conquer's leaf solver, on the ranks it is
started with: which size or leaf way puts a case near the tests' 2x bound.

    mpiexec -n 2 python3 bench/accuracy_probe.py [--n 160,161] [--leaves batched,device] [--json out.json]

Prints one line per case (rank 0): the ratio of each metric to LAPACK's (the eigenvalue error
against the stored pair's exact spectrum, with a floor of n eps, as the tests)."""
from __future__ import annotations

import argparse
import json

from mpi4py import MPI

import hpccoll
from hpccoll.config import git_commit
from hpccoll_eigensolver import BlockCyclic, distribute, gather, metrics, sygvd, tridiag_dc
from hpccoll_eigensolver.problems import make_problem


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="160,161")
    ap.add_argument("--leaves", default="batched,device")
    ap.add_argument("--kinds", default="known,clustered,wilkinson")
    ap.add_argument("--cond", default="1e8,1e12")
    ap.add_argument("--nb", type=int, default=16)
    ap.add_argument("--json", default=None)
    opts = ap.parse_args()
    import cupy as cp

    comm = hpccoll.Communicator(backend="cuda", deterministic=True)
    rows = []
    for n in map(int, opts.n.split(",")):
        for kind in opts.kinds.split(","):
            for cond in map(float, opts.cond.split(",")):
                prob = make_problem(kind, n, cond_b=cond, seed=3)
                desc = BlockCyclic(n, n, opts.nb, comm.size)
                exact = metrics.stored_spectrum(prob.A, prob.B)
                ref = metrics.lapack_reference(prob.A, prob.B, exact)
                for leaves in opts.leaves.split(","):
                    tridiag_dc.LEAVES = leaves
                    w, X = sygvd(cp.asarray(distribute(prob.A, desc, comm.rank)),
                                 cp.asarray(distribute(prob.B, desc, comm.rank)), desc, comm)
                    Xg = gather(X, desc, comm).get()
                    w = w.get()
                    r = metrics.ratios_to(ref, prob.A, prob.B, Xg, w, exact)
                    rows.append({"n": n, "kind": kind, "cond_b": cond, "leaves": leaves, "ranks": comm.size,
                                 "residual_x": r[0], "b_orth_x": r[1], "eig_err_x": r[2]})
                    if comm.rank == 0:
                        flag = "  > 2" if max(r) > 2 else ""
                        print(f"P={comm.size} n={n} {kind:9s} cond(B)={cond:.0e} leaves={leaves:7s} residual x{r[0]:.2f}  "
                              f"B-orth x{r[1]:.2f}  eig err x{r[2]:.2f}{flag}", flush=True)
    comm.Free()
    if opts.json and MPI.COMM_WORLD.rank == 0:
        with open(opts.json, "w") as fh:
            json.dump({"commit": git_commit(), "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
