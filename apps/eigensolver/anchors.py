"""GPU reference solvers for the comparison report (GPU only; tested on the GPU machine).

single-gpu: CuPy on one GPU: potrf (cupy.linalg.cholesky), sygst as two triangular solves
(cuBLAS trsm), syevd (cupy.linalg.eigh), back-substitution X = L^-T Z."""
from __future__ import annotations

import os
import time


def anchor_record(args, *, comm: str, backend: str, ranks: int, n: int, r: int, w, per_rank, accuracy: dict,
                  eigenvectors_sha256: str, phases: dict, solve_s: float, known, ref, ref_s, ref_err, xp,
                  device: str = "gpu", memory=None, extra=None) -> dict:
    """A run record with the keys `solve` writes (cli.RUN_SCHEMA)."""
    from . import metrics
    from .linalg._xp import to_host
    from .runs import RUN_SCHEMA, config_digest, config_identity
    from .report import GUARANTEE, METRIC_DEFINITIONS
    from hpccoll.config import git_commit

    from .runinfo import machine_info

    identity = config_identity(args, args.spec.digest(device), ranks, comm, device)
    rec = {"schema": RUN_SCHEMA, "n": n, "nb": args.nb, "ranks": ranks, "comm": comm,
           "backend": backend, "device": device, "problem": args.problem, "cond_b": args.cond_b,
           "seed": args.seed, "problem_digest": args.spec.digest(device),
           "problem_identity": args.spec.identity(device), "config_digest": config_digest(identity),
           "config": identity, "repeat_index": r, "repeat": args.repeat,
           "eigenvalues_sha256": metrics.sha256(w), "eigenvectors_sha256": eigenvectors_sha256,
           "per_rank": per_rank,
           "ranks_agree_on_eigenvalues": len({p["eigenvalues_sha256"] for p in per_rank}) == 1,
           "residual": accuracy["residual"], "b_orthogonality": accuracy["b_orthogonality"],
           "eigenvalue_error": metrics.eigenvalue_error(w, known),
           "eigenvalue_error_vs_scipy": metrics.eigenvalue_error(w, ref),
           "eigenvalue_error_definition": metrics.EIGENVALUE_ERROR_DEFINITION,
           "reference_seconds": ref_s, "reference_error": ref_err, "phases": phases, "solve_seconds": solve_s,
           "collectives": None, "memory": {"per_rank": memory or []}, "machine": machine_info(xp),
           "git_commit": git_commit(), "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "eigenvalues": [float(x) for x in to_host(w)], "eigenvectors_file": None,
           "metric_definitions": METRIC_DEFINITIONS,
           "reproducibility": GUARANTEE}
    if extra:
        rec.update(extra)
    return rec


def run_single_gpu(args) -> int:
    """`anchor single-gpu`: the one-GPU CuPy path, --repeat times; one JSON per run.  The whole
    problem lives on the one GPU (built there by problems.make_problem)."""
    from . import metrics
    from .linalg._xp import gpu_available, to_host
    from .runs import (CliError, SCIPY_REFERENCE_MAX_N, check_out_dir, config_digest, config_identity,
                      print_run, reference_eigenvalues, refuse_overwrite, run_stem, save_vectors, write_eigenvalues,
                      write_json)
    from .problems import make_problem
    from .runinfo import GcPauses, MemoryMeter

    if not gpu_available():
        raise CliError("anchor single-gpu: needs CuPy and a GPU")
    import cupy as cp
    from cupyx.scipy.linalg import solve_triangular

    if args.out:
        check_out_dir(args.out)
    digest = config_digest(config_identity(args, args.spec.digest("gpu"), 1, "single-gpu", "gpu"))
    stems = [run_stem(args, args.n, 1, "single-gpu", r, digest) for r in range(args.repeat)]
    refuse_overwrite(args.out, stems, args.overwrite)
    prob = make_problem(args.problem, args.n, cond_b=args.cond_b, seed=args.seed, xp=cp)
    n = prob.n
    ref = ref_s = ref_err = None
    if not args.no_reference and n <= SCIPY_REFERENCE_MAX_N:
        ref, ref_s, ref_err = reference_eigenvalues(to_host(prob.A), to_host(prob.B))
    A0, B0 = prob.A, prob.B
    stream = cp.cuda.get_current_stream()
    meter = MemoryMeter(cp, trace=False)

    def step(name, fn):   # one phase, timed between two syncs into this run's `phases`
        stream.synchronize()
        t0 = time.perf_counter()
        out = fn()
        stream.synchronize()
        phases[name] = time.perf_counter() - t0
        return out

    for r in range(args.repeat):
        phases = {}
        meter.start()
        with GcPauses() as pauses:
            t_all = time.perf_counter()
            L = step("potrf", lambda: cp.linalg.cholesky(B0))
            C = step("sygst", lambda: _sym(solve_triangular(L, solve_triangular(L, A0, lower=True).T, lower=True)))
            w, Z = step("syevd", lambda: cp.linalg.eigh(C))
            X = step("trsm", lambda: solve_triangular(L, Z, lower=True, trans=1))
            solve_s = time.perf_counter() - t_all
        meter.solve_done()
        L = C = Z = None  # free them before the metrics
        acc = {"residual": metrics.residual(A0, B0, X, w), "b_orthogonality": metrics.b_orthogonality(B0, X)}
        x_digest = metrics.matrix_sha256(X)
        per_rank = [{"rank": 0, "eigenvalues_sha256": metrics.sha256(w), "local_eigenvectors_sha256": x_digest}]
        memory = [dict(rank=0, **meter.stop())]
        rec = anchor_record(args, comm="single-gpu", backend="cupy", ranks=1, n=n, r=r, w=w, per_rank=per_rank,
                            accuracy=acc, eigenvectors_sha256=x_digest, phases=phases, solve_s=solve_s,
                            known=prob.eigenvalues, ref=ref, ref_s=ref_s, ref_err=ref_err, xp=cp, memory=memory,
                            extra={"host_gc": {"per_rank": [dict(rank=0, **pauses.record())]}})
        if save_vectors(args):
            import numpy as np

            name = stems[r] + "_X.npy"
            np.save(os.path.join(args.out, name), np.asfortranarray(to_host(X)))
            rec["eigenvectors_file"] = name
        print_run(rec)
        if args.out:
            rec["eigenvalues_file"] = os.path.basename(write_eigenvalues(args.out, stems[r], w))
            write_json(args.out, stems[r], rec)
        del X
    return 0


def _sym(C):
    return (C + C.T) / 2
