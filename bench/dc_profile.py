"""Where the GPU divide-and-conquer tridiagonal solver (hpccoll_eigensolver.tridiag_dc) spends
its time, beside cuSOLVER's dense syevd of the same T (what stedc="gpu" runs); one GPU, float64.

    python3 bench/dc_profile.py [--n 4096,8192] [--json out.json]

Per (n, matrix): wall seconds of the whole solve (median of 3, after one warm-up solve), then
one more solve with tridiag_dc.PROFILE on (a device synchronize after every step, so its sum is
a little above the plain solve) split into leaves / assemble / deflate / rotate / secular /
vectors / gemm / finish; accuracy as residual ||T Z - Z diag(w)||_F / (n eps |T|) and
orthogonality ||Z^T Z - I||_F / (n eps).  Matrices (--matrices): "random" (normal d and e: almost
nothing deflates, the secular equation and GEMMs at full size), "clustered" (three tight
eigenvalue clusters: most poles deflate) and "solve:KIND" (the T of the solver's own
tridiagonalization of problem KIND, e.g. solve:known: what a solve's stedc meets)."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from hpccoll.config import git_commit


def _matrices(n: int, rng, names):
    third = n // 3
    out = {}
    for name in names:
        if name == "random":
            out[name] = rng.standard_normal(n), rng.standard_normal(n - 1)
        elif name == "clustered":
            out[name] = (np.concatenate([np.full(third, 1.0), np.full(third, 2.0), np.full(n - 2 * third, 3.0)])
                         + 1e-14 * rng.standard_normal(n), np.full(n - 1, 1e-9))
        elif name.startswith("solve:"):
            out[name] = _from_solve(name[len("solve:"):], n)
        else:
            raise SystemExit(f"dc_profile: --matrices {name!r}: use random, clustered or solve:KIND (a problem kind)")
    return out


def _from_solve(kind: str, n: int):
    """T = (d, e) as the solver's tridiagonalization leaves it for the problem `kind` of order n
    (cond(B) = 1e3, seed 0, nb = 64, built on the GPU): sygvd's first phases at one rank."""
    import cupy as cp
    from mpi4py import MPI

    import hpccoll
    from hpccoll_eigensolver import BlockCyclic
    from hpccoll_eigensolver.counting import PhaseTimer
    from hpccoll_eigensolver.problems import make_problem
    from hpccoll_eigensolver.solver import tridiagonalize

    prob = make_problem(kind, n, cond_b=1e3, seed=0, xp=cp)
    comm = hpccoll.Communicator(MPI.COMM_SELF, backend="cuda", deterministic=True)
    try:
        d, e, _, _, _ = tridiagonalize(prob.A, prob.B, BlockCyclic(n, n, 64, 1), comm, cp, PhaseTimer(cp, comm))
    finally:
        comm.Free()
    return cp.asnumpy(d), cp.asnumpy(e)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="4096,8192")
    ap.add_argument("--json", default=None)
    ap.add_argument("--leaf", default=None, help="comma list of device leaf sizes (default: tridiag_dc's)")
    ap.add_argument("--streams", default=None, help="comma list of leaf stream counts (default: tridiag_dc's)")
    ap.add_argument("--matrices", default="random,clustered",
                    help="comma list: random, clustered, solve:KIND (the T the solver's sytrd makes of problem KIND)")
    opts = ap.parse_args()
    import cupy as cp

    from hpccoll_eigensolver import tridiag_dc
    from hpccoll_eigensolver._xp import tridiagonal_matrix

    eps = np.finfo(np.float64).eps

    def timed(fn):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        out = fn()
        cp.cuda.Device().synchronize()
        return time.perf_counter() - t0, out

    rows = []
    rng = np.random.default_rng(5)
    d0, e0 = rng.standard_normal(600), rng.standard_normal(599)
    tridiag_dc.eigh_tridiagonal_dc(cp.asarray(d0), cp.asarray(e0), cp)  # compile
    leaves_list = [int(x) for x in opts.leaf.split(",")] if opts.leaf else [tridiag_dc.LEAF_DEVICE]
    streams_list = [int(x) for x in opts.streams.split(",")] if opts.streams else [tridiag_dc.STREAMS]
    configs = [(n, lf, st) for n in (int(x) for x in opts.n.split(",")) for lf in leaves_list for st in streams_list]
    for n, leaf, streams in configs:
        tridiag_dc.STREAMS = streams
        for name, (d, e) in _matrices(n, np.random.default_rng(n), opts.matrices.split(",")).items():
            dx, ex = cp.asarray(d), cp.asarray(e)
            solve = lambda: tridiag_dc.eigh_tridiagonal_dc(dx, ex, cp, leaf)  # noqa: E731
            solve()
            times = [timed(solve)[0] for _ in range(3)]
            tridiag_dc.PROFILE = {}
            t_prof, (w, Z) = timed(solve)
            prof, tridiag_dc.PROFILE = tridiag_dc.PROFILE, None
            T = tridiagonal_matrix(cp, dx, ex)
            dense = lambda: cp.linalg.eigh(T)  # noqa: E731
            dense()
            t_dense = statistics.median(timed(dense)[0] for _ in range(3))
            nt = float(max(np.abs(d).max(), np.abs(e).max()))
            res = float(cp.linalg.norm(T @ Z - Z * w[None, :])) / (n * eps * nt)
            orth = float(cp.linalg.norm(Z.T @ Z - cp.eye(n))) / (n * eps)
            w_ref = cp.asnumpy(dense()[0])
            leaves = {}  # the leaves alone, each way (tridiag_dc.LEAVES)
            bounds = list(range(0, n, leaf)) + [n]
            default = tridiag_dc.LEAVES
            for how in ("batched", "device", "host"):
                tridiag_dc.LEAVES = how
                tridiag_dc._leaves(dx, ex, bounds, cp)
                leaves[how] = timed(lambda: tridiag_dc._leaves(dx, ex, bounds, cp))[0]
            tridiag_dc.LEAVES = default
            row = {"n": n, "leaf": leaf, "streams": streams, "matrix": name, "dc_s": statistics.median(times), "dense_syevd_s": t_dense,
                   "profiled_s": t_prof, "steps_s": prof, "leaves_s": leaves, "leaves": tridiag_dc.LEAVES, "residual": res, "orthogonality": orth,
                   "eig_diff_vs_syevd": float(np.abs(cp.asnumpy(w) - w_ref).max() / nt)}
            rows.append(row)
            print(f"n={n} leaf={leaf} streams={streams} {name:9s} dc {row['dc_s']:.4f} s  syevd(T) {t_dense:.4f} s  res {res:.2f}  "
                  f"orth {orth:.2f}  |w-w_syevd|/|T| {row['eig_diff_vs_syevd']:.1e}", flush=True)
            print("   " + "  ".join(f"{k} {v:.4f}" for k, v in sorted(prof.items(), key=lambda kv: -kv[1]))
                  + "   | leaves alone: " + "  ".join(f"{k} {v:.4f}" for k, v in leaves.items()), flush=True)
            T = Z = None  # free before the next size
            cp.get_default_memory_pool().free_all_blocks()
    if opts.json:
        name = cp.cuda.runtime.getDeviceProperties(0)["name"]
        with open(opts.json, "w") as fh:
            json.dump({"gpu": name.decode() if isinstance(name, bytes) else str(name),
                       "commit": git_commit(), "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
