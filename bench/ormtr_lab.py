"""The back-transformation (householder.ormtr) at one rank on one GPU, against its blocks applied
two other ways: Z's rows from p0 + 1 (LAPACK's; unaligned columns) with Y = M^-1 (Vb^T Z) by a
triangular solve with n right-hand sides ("explicit_T=False"), and the same with T = M^-1 from
one small solve and a GEMM ("explicit_T=True").  Random reflectors, 512 per block, random Z.

    python3 bench/ormtr_lab.py 8192

Prints ormtr's wall time (median of 3 after a warm-up, the device synchronized), each variant's,
their largest difference to ormtr's result relative to max |Z|, and the variant's parts summed
over the blocks (CUDA events): building Vb, M = triu(Vb^T Vb) with 1/tau on its diagonal, the
GEMM Vb^T Z, the solve (or T and its GEMM), the update GEMM."""
import sys

import cupy as cp
import numpy as np
from mpi4py import MPI

import hpccoll
from hpccoll_eigensolver import BlockCyclic, householder
from hpccoll_eigensolver._xp import gemm_acc, trsm

from _lab import median_wall


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    nb = 64
    rng = cp.random.default_rng(3)
    V = cp.asfortranarray(cp.tril(rng.standard_normal((n, n)) / np.sqrt(n), -1))
    tau = cp.asarray(1.0 + np.random.default_rng(1).random(n))
    tau[-1] = 0
    Z0 = cp.asfortranarray(rng.standard_normal((n, n)))
    desc = BlockCyclic(n, n, nb, 1)
    c = hpccoll.Communicator(MPI.COMM_SELF, backend="cuda", deterministic=True)

    def timed(fn):  # fn(Z) on a fresh copy of Z0; returns (seconds, Z)
        def run(Z):
            fn(Z)
            return Z
        return median_wall(run, lambda: Z0.copy(order="F"))

    t_cur, Zc = timed(lambda Z: householder.ormtr(V, tau, Z, desc, c, cp))
    parts = {}

    def ev(name, fn):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        out = fn()
        e1.record()
        e1.synchronize()
        parts[name] = parts.get(name, 0.0) + cp.cuda.get_elapsed_time(e0, e1) * 1e-3
        return out

    def variant(Z, explicit, record=False):
        bw = 512
        f = ev if record else (lambda name, fn: fn())
        for p0 in reversed(range(0, n - 1, bw)):
            p1 = min(p0 + bw, n)
            Vb = f("Vb", lambda: cp.asfortranarray(V[p0 + 1:, p0:p1]))
            t = tau[p0:p1]
            live = t != 0

            def mk():
                Vb[...] *= live[None, :]
                M = cp.triu(Vb.T @ Vb, 1)
                M[cp.diag_indices(p1 - p0)] = 1.0 / cp.where(live, t, 1.0)
                return M

            M = f("M", mk)
            Zb = Z[p0 + 1:]

            def vtz():
                VtZ = cp.zeros((p1 - p0, Zb.shape[1]), dtype=cp.float64, order="F")
                gemm_acc(cp, VtZ, Vb.T, Zb, alpha=1.0)
                return VtZ

            VtZ = f("VtZ", vtz)
            if explicit:
                Y = f("T,Y", lambda: trsm(cp, M, cp.eye(p1 - p0), lower=False) @ VtZ)
            else:
                Y = f("trsm", lambda: trsm(cp, M, VtZ, lower=False))
            f("update", lambda: gemm_acc(cp, Zb, Vb, Y))
        return Z

    for explicit in (False, True):
        tv, Zv = timed(lambda Z: variant(Z, explicit))
        parts.clear()
        variant(Z0.copy(order="F"), explicit, record=True)
        err = float(cp.abs(Zv - Zc).max() / cp.abs(Zc).max())
        print(f"n={n} ormtr {t_cur:.4f} s | variant explicit_T={explicit}: {tv:.4f} s, rel diff {err:.1e}; parts (s): "
              + " ".join(f"{k} {v:.4f}" for k, v in parts.items()), flush=True)
    c.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
