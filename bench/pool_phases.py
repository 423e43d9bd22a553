"""The CuPy pool per phase of one P = 1 GPU solve: for each phase (and "-", outside them) the
largest live bytes (the pool's used bytes), the largest reserved bytes (used plus cached free
blocks) and the largest single allocation, through an allocator that reads the pool after every
allocation.  The matrices: A = sym(Gaussian), B = Q diag(logspace(0, 3)) Q^T (the process also
keeps qr's R, 2 n^2 bytes * 4: its "inputs" are A, B and R).

    python bench/pool_phases.py --n 16384 --what two-stage,two-stage-w,one-stage"""
from __future__ import annotations

import argparse
import contextlib

CASES = {"two-stage": dict(reduction="two-stage"), "two-stage-w": dict(reduction="two-stage", eigvals_only=True),
         "one-stage": dict(reduction="one-stage")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--what", default="two-stage,two-stage-w,one-stage", help=f"cases among {', '.join(CASES)}")
    args = ap.parse_args(argv)
    what = [w.strip() for w in args.what.split(",") if w.strip()]
    bad = [w for w in what if w not in CASES]
    if bad:
        ap.error(f"--what {','.join(bad)!r}: use {', '.join(CASES)}")

    import cupy
    from mpi4py import MPI

    from hpccoll_eigensolver import BlockCyclic, sygvd, warm_up
    from hpccoll_eigensolver.runinfo import make_communicator

    pool = cupy.get_default_memory_pool()
    current, peak = ["-"], {}

    def alloc(size):
        mem = pool.malloc(size)
        p = peak.setdefault(current[0], [0, 0, 0])
        p[0], p[1], p[2] = max(p[0], pool.used_bytes()), max(p[1], pool.total_bytes()), max(p[2], size)
        return mem

    class PoolTimer:
        @contextlib.contextmanager
        def phase(self, name):
            current[0] = name
            yield
            cupy.cuda.Device().synchronize()
            current[0] = "-"

    n = args.n
    warm_up(nb=64)
    comm = make_communicator("sentinel", MPI.COMM_WORLD, 0)
    comm.prepare(("float64",))
    rng = cupy.random.default_rng(0)
    A = rng.standard_normal((n, n))
    A = cupy.asfortranarray(A + A.T)
    Q, R = cupy.linalg.qr(rng.standard_normal((n, n)))
    B = (Q * cupy.logspace(0, 3, n)) @ Q.T
    B = cupy.asfortranarray((B + B.T) / 2)
    del Q
    desc = BlockCyclic(n, n, 64, 1)
    cupy.cuda.set_allocator(alloc)
    gib = float(1 << 30)
    for name in what:
        peak.clear()
        pool.free_all_blocks()
        base = pool.used_bytes()
        w, X = sygvd(A, B, desc, comm, timer=PoolTimer(), **CASES[name])
        del w, X
        print(f"n={n} {name}: inputs {base / gib:.2f} GiB; per phase live peak / reserved peak / largest allocation "
              "(GiB): " + ", ".join(f"{k} {v[0] / gib:.2f}/{v[1] / gib:.2f}/{v[2] / gib:.2f}" for k, v in peak.items()),
              flush=True)
    cupy.cuda.set_allocator(pool.malloc)
    comm.Free()
    del R


if __name__ == "__main__":
    main()
