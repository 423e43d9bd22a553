"""One rank on one GPU: two of the solver's steps against cuSOLVER / cuBLAS building blocks on
the same data, to see which whole-matrix library call a single rank should use (the divide and
conquer's leaves each way: bench/dc_profile.py).

    python3 bench/onerank_lab.py [--n 8192] [--json out.json]

  sygst   triangular.sygst (LAPACK's blocked algorithm, the solver's panels: sygst_desc; also
          128, 256 and 512 columns, update chunks of 1024 and 4096 columns) against two in-place cuBLAS trsm
          (C = L^-1 A, then C L^-T: twice the flops, no panel loop; what the one-GPU anchor
          does, but less accurate: C is not formed symmetric)
  ormtr   householder.ormtr's distributed blocks against cusolverDnDormtr (_xp.ormtr_in_place:
          reflectors in LAPACK's lower storage, unit subdiagonal)
  sytrd   householder.sytrd (the column step's kernels, one rank) in panels of 32, 64 and 128
          columns against cusolverDnDsytrd (lower) on the same symmetric matrix

Wall seconds, the device synchronized, median of 3 after a warm-up; the largest difference of
each result to the solver's, relative to its largest entry."""
from __future__ import annotations

import argparse
import json

import cupy as cp
import numpy as np
from mpi4py import MPI

import hpccoll
from hpccoll.config import git_commit
from hpccoll_eigensolver import BlockCyclic, householder
from hpccoll_eigensolver._xp import ormtr_in_place
from hpccoll_eigensolver.triangular import sygst, sygst_desc

from _lab import median_wall as timed


def rel(a, b):
    return float(cp.abs(a - b).max() / max(float(cp.abs(b).max()), 1e-300))


def lab_sygst(n, out):
    from cupy_backends.cuda.libs import cublas
    from hpccoll_eigensolver._xp import _cublas_host_scalars, _leading_dim
    rng = cp.random.default_rng(0)
    G = rng.standard_normal((n, n))
    A0 = cp.asfortranarray(G + G.T)
    H = rng.standard_normal((n, n)) / np.sqrt(n)
    L = cp.asfortranarray(cp.tril(cp.linalg.cholesky(H @ H.T + cp.eye(n))))
    desc = BlockCyclic(n, n, 64, 1)
    comm = hpccoll.Communicator(MPI.COMM_SELF, backend="cuda", deterministic=True)
    t_ours, C_ours = timed(lambda A: sygst(A, L, sygst_desc(desc, True), comm, cp), lambda: A0.copy(order="F"))
    one = np.ones(1)

    def two(A):
        with _cublas_host_scalars() as h:
            ld = _leading_dim(A)
            cublas.dtrsm(h, cublas.CUBLAS_SIDE_LEFT, cublas.CUBLAS_FILL_MODE_LOWER, cublas.CUBLAS_OP_N,
                         cublas.CUBLAS_DIAG_NON_UNIT, n, n, one.ctypes.data, L.data.ptr, n, A.data.ptr, ld)
            cublas.dtrsm(h, cublas.CUBLAS_SIDE_RIGHT, cublas.CUBLAS_FILL_MODE_LOWER, cublas.CUBLAS_OP_T,
                         cublas.CUBLAS_DIAG_NON_UNIT, n, n, one.ctypes.data, L.data.ptr, n, A.data.ptr, ld)
        return A
    t_two, C_two = timed(two, lambda: A0.copy(order="F"))
    sweep = {}
    for nbw in (128, 256, 512):
        for upd in (1024, 4096):
            sweep[f"nb{nbw}_update{upd}"] = timed(lambda A: sygst(A, L, BlockCyclic(n, n, nbw, 1), comm, cp, update_cols=upd),
                                                  lambda: A0.copy(order="F"))[0]
    comm.Free()
    out["sygst"] = {"ours_s": t_ours, "two_trsm_s": t_two, "rel_diff_lower": rel(cp.tril(C_two), C_ours),
                    "panel_sweep_s": sweep}
    print(f"sygst  n={n}: ours {t_ours:.4f} s  two in-place trsm {t_two:.4f} s  rel diff {out['sygst']['rel_diff_lower']:.1e}",
          flush=True)
    print("   blocked sygst by panel width and update chunk: " + "  ".join(f"{k} {v:.4f}" for k, v in sweep.items()),
          flush=True)


def lab_ormtr(n, out):
    rng = cp.random.default_rng(3)
    V = cp.asfortranarray(cp.tril(rng.standard_normal((n, n)) / np.sqrt(n), -1))
    V[cp.arange(1, n), cp.arange(n - 1)] = 1.0
    tau = cp.asarray(2.0 / (1.0 + np.random.default_rng(1).random(n)))
    tau[-1] = 0
    Z0 = cp.asfortranarray(rng.standard_normal((n, n)))
    desc = BlockCyclic(n, n, 64, 1)
    comm = hpccoll.Communicator(MPI.COMM_SELF, backend="cuda", deterministic=True)
    t_ours, Z_ours = timed(lambda Z: householder.ormtr(V, tau, Z, desc, comm, cp), lambda: Z0.copy(order="F"))
    comm.Free()

    def lib_ormtr(Z):
        ormtr_in_place(cp, V, tau, Z)
        return Z
    t_lib, Z_lib = timed(lib_ormtr, lambda: Z0.copy(order="F"))
    out["ormtr"] = {"ours_s": t_ours, "cusolver_s": t_lib, "rel_diff": rel(Z_lib, Z_ours)}
    print(f"ormtr  n={n}: ours {t_ours:.4f} s  cusolverDnDormtr {t_lib:.4f} s  rel diff {out['ormtr']['rel_diff']:.1e}",
          flush=True)


def lab_sytrd(n, out):
    import ctypes

    from hpccoll_eigensolver._xp import _cusolver, _leading_dim, _ok, _solver_handle
    rng = cp.random.default_rng(5)
    G = rng.standard_normal((n, n))
    C0 = cp.asfortranarray(G + G.T)
    comm = hpccoll.Communicator(MPI.COMM_SELF, backend="cuda", deterministic=True)
    ours = {}
    for nb in (32, 64, 128):
        desc = BlockCyclic(n, n, nb, 1)
        ours[nb] = timed(lambda C: householder.sytrd(C, desc, comm, cp), lambda: C0.copy(order="F"))
    comm.Free()
    lib = _cusolver()

    def lib_sytrd(A):
        d, e, tau = cp.empty(n), cp.empty(n - 1), cp.empty(n - 1)
        handle, ptr, lwork = ctypes.c_void_p(_solver_handle()), ctypes.c_void_p, ctypes.c_int()
        args = (handle, 0, n, ptr(A.data.ptr), _leading_dim(A), ptr(d.data.ptr), ptr(e.data.ptr), ptr(tau.data.ptr))
        _ok(lib.cusolverDnDsytrd_bufferSize(*args, ctypes.byref(lwork)), "cusolverDnDsytrd_bufferSize")
        work, info = cp.empty(max(lwork.value, 1)), cp.zeros(1, dtype=cp.int32)
        _ok(lib.cusolverDnDsytrd(*args, ptr(work.data.ptr), lwork.value, ptr(info.data.ptr)), "cusolverDnDsytrd")
        return d, e, tau
    t_lib, (d_lib, e_lib, _) = timed(lib_sytrd, lambda: C0.copy(order="F"))
    d64, e64 = ours[64][1][0], ours[64][1][1]
    out["sytrd"] = {"ours_s": {nb: t for nb, (t, _) in ours.items()}, "cusolver_s": t_lib,
                    "rel_diff_d": rel(d_lib, d64), "rel_diff_abs_e": rel(cp.abs(e_lib), cp.abs(e64))}
    print(f"sytrd  n={n}: ours " + "  ".join(f"nb={nb} {t:.4f} s" for nb, (t, _) in ours.items())
          + f"  cusolverDnDsytrd {t_lib:.4f} s  rel diff d {out['sytrd']['rel_diff_d']:.1e}"
          f" |e| {out['sytrd']['rel_diff_abs_e']:.1e}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default="sygst,ormtr")
    opts = ap.parse_args()
    out = {"n": opts.n, "commit": git_commit(), "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode()}
    for name in opts.only.split(","):
        try:
            {"sygst": lambda: lab_sygst(opts.n, out), "ormtr": lambda: lab_ormtr(opts.n, out),
             "sytrd": lambda: lab_sytrd(opts.n, out)}[name]()
        except Exception as exc:  # a lab: report and go on to the next part
            out[name] = {"error": repr(exc)}
            print(name, "failed:", repr(exc), flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
