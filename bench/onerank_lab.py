"""One rank on one GPU: three of the solver's steps against cuSOLVER / cuBLAS building blocks on
the same data, to see which whole-matrix library call a single rank should use.

    python3 bench/onerank_lab.py [--n 8192] [--json out.json]

  sygst   triangular.sygst (LAPACK's blocked algorithm, 256-column panels; also 128, 512 and
          1024, update chunks of 1024 and 4096 columns) against two in-place cuBLAS trsm
          (C = L^-1 A, then C L^-T: twice the flops, no panel loop; what the one-GPU anchor
          does, but less accurate: C is not formed symmetric)
  ormtr   householder.ormtr's distributed blocks (ORMTR_ONE_RANK = "blocks") against
          cusolverDnDormtr (reflectors in LAPACK's lower storage, unit subdiagonal)
  leaves  tridiag_dc's leaves one by one (LEAVES = "device": cuSOLVER syevd per 512-row leaf on
          STREAMS streams) against one cusolverDnXsyevBatched over all leaves

Wall seconds, the device synchronized, median of 3 after a warm-up; the largest difference of
each result to the solver's, relative to its largest entry.  cuSOLVER entry points the CuPy
build does not bind are called through ctypes on the libcusolver CuPy loaded."""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time

import cupy as cp
import numpy as np
from mpi4py import MPI

import hpccoll
from hpccoll.config import git_commit
from hpccoll_eigensolver import BlockCyclic, householder, tridiag_dc
from hpccoll_eigensolver._xp import tridiagonal_matrix
from hpccoll_eigensolver.triangular import panel_desc, sygst


def timed(fn, setup=lambda: None, reps=3):
    ts, out = [], None
    for _ in range(reps + 1):
        arg = setup()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        out = fn(arg)
        cp.cuda.Device().synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts[1:]), out


def libcusolver():
    from cupy_backends.cuda.libs import cusolver  # noqa: F401  (loads the library)
    for line in open("/proc/self/maps"):
        if "libcusolver.so" in line and "Mg" not in line:
            return ctypes.CDLL(line.split()[-1])
    raise RuntimeError("libcusolver not loaded")


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
    t_ours, C_ours = timed(lambda A: sygst(A, L, panel_desc(desc), comm, cp), lambda: A0.copy(order="F"))
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
    for nbw in (128, 512, 1024):
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


def lab_ormtr(n, out, lib):
    rng = cp.random.default_rng(3)
    V = cp.asfortranarray(cp.tril(rng.standard_normal((n, n)) / np.sqrt(n), -1))
    V[cp.arange(1, n), cp.arange(n - 1)] = 1.0
    tau = cp.asarray(2.0 / (1.0 + np.random.default_rng(1).random(n)))
    tau[-1] = 0
    Z0 = cp.asfortranarray(rng.standard_normal((n, n)))
    desc = BlockCyclic(n, n, 64, 1)
    comm = hpccoll.Communicator(MPI.COMM_SELF, backend="cuda", deterministic=True)
    householder.ORMTR_ONE_RANK = "blocks"
    t_ours, Z_ours = timed(lambda Z: householder.ormtr(V, tau, Z, desc, comm, cp), lambda: Z0.copy(order="F"))
    householder.ORMTR_ONE_RANK = "cusolver"
    comm.Free()
    h = cp.cuda.device.get_cusolver_handle()
    from cupy_backends.cuda.libs import cusolver
    cusolver.setStream(h, cp.cuda.get_current_stream().ptr)
    lw = ctypes.c_int()
    SIDE_L, LOWER, OP_N = 0, 0, 0
    st = lib.cusolverDnDormtr_bufferSize(ctypes.c_void_p(h), SIDE_L, LOWER, OP_N, n, n, ctypes.c_void_p(V.data.ptr), n,
                                         ctypes.c_void_p(tau.data.ptr), ctypes.c_void_p(Z0.data.ptr), n, ctypes.byref(lw))
    assert st == 0, st
    work = cp.empty(max(lw.value, 1))
    info = cp.zeros(1, dtype=cp.int32)

    def lib_ormtr(Z):
        s = lib.cusolverDnDormtr(ctypes.c_void_p(h), SIDE_L, LOWER, OP_N, n, n, ctypes.c_void_p(V.data.ptr), n,
                                 ctypes.c_void_p(tau.data.ptr), ctypes.c_void_p(Z.data.ptr), n,
                                 ctypes.c_void_p(work.data.ptr), lw.value, ctypes.c_void_p(info.data.ptr))
        assert s == 0, s
        return Z
    t_lib, Z_lib = timed(lib_ormtr, lambda: Z0.copy(order="F"))
    out["ormtr"] = {"ours_s": t_ours, "cusolver_s": t_lib, "rel_diff": rel(Z_lib, Z_ours), "info": int(info[0])}
    print(f"ormtr  n={n}: ours {t_ours:.4f} s  cusolverDnDormtr {t_lib:.4f} s  rel diff {out['ormtr']['rel_diff']:.1e}",
          flush=True)


def lab_leaves(n, out, leaf=512):
    from hpccoll_eigensolver._xp import syev_batched

    rng = np.random.default_rng(5)
    d, e = cp.asarray(rng.standard_normal(n)), cp.asarray(rng.standard_normal(n - 1))
    bounds = list(range(0, n, leaf)) + [n]
    tridiag_dc.LEAVES = "device"
    t_ours, parts = timed(lambda _: tridiag_dc._dense_batch(d, e, bounds, cp))
    tridiag_dc.LEAVES = "batched"

    def stack(m):  # the (n / m) leaves of (d, e) as dense m x m tridiagonals
        T = cp.zeros((n // m, m, m))
        idx = cp.arange(m)
        T[:, idx, idx] = d[:n // m * m].reshape(-1, m)
        ee = cp.concatenate([e, cp.zeros(1)])[:n // m * m].reshape(-1, m)[:, :m - 1]
        T[:, idx[1:], idx[:-1]] = ee
        T[:, idx[:-1], idx[1:]] = ee
        return T
    t_b, (W, Q) = timed(lambda T: syev_batched(cp, T), lambda: stack(leaf))
    t_build, _ = timed(lambda _: stack(leaf))
    nb = n // leaf
    werr = max(float(cp.abs(W[i] - parts[i][0]).max()) for i in range(nb))
    # eigenvectors up to sign: |Q^T Q_ours| against I
    qerr = max(float(cp.abs(cp.abs(Q[i].T @ parts[i][1]) - cp.eye(leaf)).max()) for i in range(nb))
    out["leaves"] = {"ours_s": t_ours, "xsyevBatched_s": t_b, "build_s": t_build, "w_diff": werr, "q_diff": qerr,
                     "leaf": leaf, "leaves": nb, "streams": tridiag_dc.STREAMS}
    print(f"leaves n={n} leaf={leaf}: ours ({tridiag_dc.STREAMS} streams) {t_ours:.4f} s  XsyevBatched {t_b:.4f} s "
          f"(build {t_build:.4f} s apart)  |w diff| {werr:.1e}  |Q diff| {qerr:.1e}", flush=True)
    for lf in (256, 128, 64):
        t = timed(lambda T: syev_batched(cp, T), lambda: stack(lf))[0]
        out["leaves"][f"xsyevBatched_leaf{lf}_s"] = t
        print(f"   XsyevBatched leaf={lf} ({n // lf} leaves): {t:.4f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default="sygst,ormtr,leaves")
    opts = ap.parse_args()
    out = {"n": opts.n, "commit": git_commit(), "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode()}
    lib = libcusolver()
    from cupy_backends.cuda.libs import cusolver
    out["cupy_binds"] = {f: hasattr(cusolver, f) for f in ("dormtr", "dormtr_bufferSize", "xsyevBatched", "dsytrd")}
    print("CuPy binds:", out["cupy_binds"], "| libcusolver:", lib._name, flush=True)
    for name in opts.only.split(","):
        try:
            {"sygst": lambda: lab_sygst(opts.n, out), "ormtr": lambda: lab_ormtr(opts.n, out, lib),
             "leaves": lambda: lab_leaves(opts.n, out)}[name]()
        except Exception as exc:  # a lab: report and go on to the next part
            out[name] = {"error": repr(exc)}
            print(name, "failed:", repr(exc), flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
