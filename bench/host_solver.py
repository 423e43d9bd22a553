"""One rank on the host: sygvd with the one-stage and the two-stage tridiagonalization against
scipy.linalg.eigh(A, B) (LAPACK dsygvd), at the same BLAS threads (set OPENBLAS_NUM_THREADS
before starting: the same count then holds for all three).  Prints a table of the best of
--repeat times and sygvd's phases, and writes it as JSON.

    OPENBLAS_NUM_THREADS=1 python3 bench/host_solver.py [--n 1000,2000,3000] [--nb 64] [--json out.json]
    OPENBLAS_NUM_THREADS=1 python3 bench/host_solver.py --sweep-band 16,32,64,128 --n 2000

--sweep-band: the two-stage reduction alone (sy2sb, sb2st, and Q1 Q2 applied to n x n) for each
half-bandwidth b (nb = b), the measurement behind twostage.TWO_STAGE_BAND."""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import scipy.linalg as sl

import hpccoll
from hpccoll.config import git_commit
from hpccoll_eigensolver import BlockCyclic, sygvd
from hpccoll_eigensolver.counting import PhaseTimer
from hpccoll_eigensolver.linalg.sb2st import sb2st
from hpccoll_eigensolver.linalg.sy2sb import gather_band, sy2sb
from hpccoll_eigensolver.linalg.twostage import TwoStageQ
from hpccoll_eigensolver.problems import make_problem


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t]


def solver_table(comm, sizes, nb: int, repeat: int) -> list[dict]:
    rows = []
    for n in sizes:
        prob = make_problem("random", n, cond_b=1e3, seed=0)
        desc = BlockCyclic(n, n, nb, 1)
        row = {"n": n, "nb": nb}
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            sl.eigh(prob.A, prob.B)
            best = min(best, time.perf_counter() - t)
        row["scipy_s"] = best
        A, B = np.asfortranarray(prob.A), np.asfortranarray(prob.B)
        for reduction in ("one-stage", "two-stage"):
            best, phases = float("inf"), None
            for _ in range(repeat):
                timer = PhaseTimer(np, comm)
                t = time.perf_counter()
                sygvd(A, B, desc, comm, timer=timer, reduction=reduction)
                s = time.perf_counter() - t
                if s < best:
                    best, phases = s, dict(timer.seconds) if hasattr(timer, "seconds") else None
            row[f"{reduction}_s"] = best
            row[f"{reduction}_phases"] = phases
        row["one-stage/scipy"] = row["one-stage_s"] / row["scipy_s"]
        row["two-stage/scipy"] = row["two-stage_s"] / row["scipy_s"]
        rows.append(row)
        print(f"n={n:5d}  scipy {row['scipy_s']:7.2f} s  one-stage {row['one-stage_s']:7.2f} s "
              f"({row['one-stage/scipy']:.2f}x)  two-stage {row['two-stage_s']:7.2f} s "
              f"({row['two-stage/scipy']:.2f}x)", flush=True)
        for r in ("one-stage", "two-stage"):
            if row[f"{r}_phases"]:
                print(f"         {r}: " + " ".join(f"{k} {v:.2f}" for k, v in row[f"{r}_phases"].items()))
    return rows


def band_sweep(comm, n: int, bands) -> list[dict]:
    rows = []
    rng = np.random.default_rng(0)
    A = rng.standard_normal((n, n))
    A = A + A.T
    for b in bands:
        desc = BlockCyclic(n, n, b, 1)
        C = np.asfortranarray(np.tril(A))
        t0 = time.perf_counter()
        band, tau1 = sy2sb(C, desc, comm, np, b)
        t1 = time.perf_counter()
        d, e, refl = sb2st(gather_band(band, desc, comm, np), b)
        t2 = time.perf_counter()
        Z = np.eye(n, order="F")
        TwoStageQ(C, tau1, b, b, refl, desc, comm, np).apply(Z)
        t3 = time.perf_counter()
        row = {"n": n, "b": b, "sy2sb_s": t1 - t0, "sb2st_s": t2 - t1, "q1q2_s": t3 - t2, "total_s": t3 - t0}
        rows.append(row)
        print(f"n={n} b={b:4d}  sy2sb {row['sy2sb_s']:6.2f}  sb2st {row['sb2st_s']:6.2f}  Q1 Q2 Z {row['q1q2_s']:6.2f}"
              f"  total {row['total_s']:6.2f} s", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=_ints, default=[1000, 2000, 3000])
    ap.add_argument("--nb", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--sweep-band", type=_ints, default=None)
    ap.add_argument("--json", default=None, help="output file (default bench/results/host-solver-<commit>.json)")
    args = ap.parse_args()
    comm = hpccoll.Communicator(backend="host", deterministic=True)
    meta = {"commit": git_commit(), "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
            "cpus": os.cpu_count()}
    print(f"commit {meta['commit']}  OPENBLAS_NUM_THREADS={meta['blas_threads']}  cpus {meta['cpus']}")
    if args.sweep_band:
        out = {"meta": meta, "band_sweep": [r for n in args.n for r in band_sweep(comm, n, args.sweep_band)]}
    else:
        out = {"meta": meta, "solver": solver_table(comm, args.n, args.nb, args.repeat)}
    comm.Free()
    path = args.json or os.path.join(os.path.dirname(__file__), "results",
                                     f"host-solver-{(meta['commit'] or 'nocommit')[:7]}"
                                     f"{'-band' if args.sweep_band else ''}.json")
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
