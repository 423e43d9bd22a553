"""The Cholesky and the tridiagonalization on one GPU, each run several times in one process:
the first call against the later ones, at several widths of the trailing-update chunks.

    python3 bench/eig_phase_repeat.py [--n 16384] [--nb 64] [--widths 4096,1024,16384,1024,2048]

After warm_up() (as the CLI does), on the `known` problem built on the GPU, P = 1 on hpccoll's
CUDA backend: potrf once per width, then sytrd (the solver's default mode) once per width;
wall time around each call with a device sync."""
from __future__ import annotations

import argparse
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--nb", type=int, default=64)
    ap.add_argument("--widths", default="4096,1024,16384,1024,2048", help="update_cols of each potrf call")
    ap.add_argument("--sytrd-widths", default="4096,1024,16384", help="UPDATE_COLS of each sytrd call")
    a = ap.parse_args()
    import cupy as cp
    from mpi4py import MPI

    import hpccoll
    from hpccoll_eigensolver import BlockCyclic, sytrd_device
    from hpccoll_eigensolver.householder import sytrd
    from hpccoll_eigensolver.problems import generated_columns, parse_problem
    from hpccoll_eigensolver.tiles import symmetrize
    from hpccoll_eigensolver.triangular import potrf
    from hpccoll_eigensolver.warmup import warm_up

    def sync():
        cp.cuda.Device().synchronize()

    warm_up()
    desc = BlockCyclic(a.n, a.n, a.nb, 1)
    A0, B0 = generated_columns(parse_problem("known", a.n, cond_b=1e3, seed=0), desc.local_cols(0), cp)
    symmetrize(A0, desc, MPI.COMM_SELF)
    symmetrize(B0, desc, MPI.COMM_SELF)
    with hpccoll.Communicator(MPI.COMM_SELF, backend="cuda", deterministic=True) as comm:
        comm.prepare(("float64",))  # as the CLI does: no kernel compile inside a timed call
        for width in (int(w) for w in a.widths.split(",")):
            B = B0.copy(order="F")
            sync()
            t0 = time.perf_counter()
            potrf(B, desc, comm, cp, update_cols=width)
            sync()
            print(f"potrf n={a.n} update_cols={width}: {time.perf_counter() - t0:.3f} s", flush=True)
        for width in (int(w) for w in a.sytrd_widths.split(",")):
            sytrd_device.UPDATE_COLS = width
            C = A0.copy(order="F")
            sync()
            t0 = time.perf_counter()
            sytrd(C, desc, comm, cp)
            sync()
            print(f"sytrd n={a.n} update_cols={width}: {time.perf_counter() - t0:.3f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
