"""GPU reference solvers for the comparison report (GPU only; tested on the GPU machine).

single-gpu: CuPy on one GPU: potrf (cupy.linalg.cholesky), sygst as two triangular solves
(cuBLAS trsm), syevd (cupy.linalg.eigh), back-substitution X = L^-T Z."""
from __future__ import annotations

import sys
import time


def anchor_record(args, *, comm: str, backend: str, ranks: int, n: int, r: int, w, X, per_rank,
                  phases: dict, solve_s: float, prob, ref, ref_s, xp, extra=None) -> dict:
    """A run record with the same keys as `solve` writes (X is the gathered matrix)."""
    from hpccoll.bench import git_commit

    from . import metrics
    from ._xp import to_host
    from .cli import accuracy
    from .runinfo import machine_info

    rec = {"schema": "hpccoll-eigensolver/run/1", "n": n, "nb": args.nb, "ranks": ranks, "comm": comm,
           "backend": backend, "device": "gpu", "problem": args.problem, "cond_b": args.cond_b,
           "seed": args.seed, "repeat_index": r, "repeat": args.repeat,
           "eigenvalues_sha256": metrics.sha256(w), "eigenvectors_sha256": metrics.sha256(X),
           "per_rank": per_rank,
           "ranks_agree_on_eigenvalues": len({p["eigenvalues_sha256"] for p in per_rank}) == 1,
           **accuracy(xp, xp.asarray(prob.A), xp.asarray(prob.B), xp.asarray(X), xp.asarray(w),
                      prob.eigenvalues, ref),
           "reference_seconds": ref_s, "phases": phases, "solve_seconds": solve_s,
           "collectives": None, "machine": machine_info(xp), "git_commit": git_commit(),
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "eigenvalues": [float(x) for x in to_host(w)], "eigenvectors_file": None}
    if extra:
        rec.update(extra)
    return rec


def run_single_gpu(args) -> int:
    """`anchor single-gpu`: the one-GPU CuPy path, --repeat times; one JSON per run."""
    from ._xp import gpu_available
    from .cli import make_problem_cached, print_run, reference_eigenvalues, run_stem, save_vectors, write_run
    from . import metrics

    if not gpu_available():
        print("hpccoll-eigensolver anchor single-gpu: needs CuPy and a GPU", file=sys.stderr)
        return 2
    import cupy as cp
    from cupyx.scipy.linalg import solve_triangular

    prob = make_problem_cached(args)
    n = prob.n
    ref, ref_s = reference_eigenvalues(prob, args)
    A0, B0 = cp.asarray(prob.A), cp.asarray(prob.B)
    stream = cp.cuda.get_current_stream()
    for r in range(args.repeat):
        phases = {}
        t_all = time.perf_counter()

        def step(name, fn):
            stream.synchronize()
            t0 = time.perf_counter()
            out = fn()
            stream.synchronize()
            phases[name] = time.perf_counter() - t0
            return out

        L = step("potrf", lambda: cp.linalg.cholesky(B0))
        C = step("sygst", lambda: _sym(solve_triangular(L, solve_triangular(L, A0, lower=True).T, lower=True)))
        w, Z = step("syevd", lambda: cp.linalg.eigh(C))
        X = step("trsm", lambda: solve_triangular(L, Z, lower=True, trans=1))
        solve_s = time.perf_counter() - t_all
        per_rank = [{"rank": 0, "eigenvalues_sha256": metrics.sha256(w),
                     "local_eigenvectors_sha256": metrics.sha256(X)}]
        rec = anchor_record(args, comm="single-gpu", backend="cupy", ranks=1, n=n, r=r, w=w, X=X,
                            per_rank=per_rank, phases=phases, solve_s=solve_s, prob=prob, ref=ref,
                            ref_s=ref_s, xp=cp)
        print_run(rec)
        write_run(args.out, run_stem(args, n, 1, "single-gpu", r), rec, X if save_vectors(args, n) else None)
    return 0


def _sym(C):
    return (C + C.T) / 2
