"""How far the host runs ahead of the GPU in one rank's tridiagonalization: the time (from the
start of sytrd) at which the host has queued each panel, against sytrd's end.

    mpiexec -n 1 python3 bench/sytrd_host_queue.py [n]

After warm_up, on the `known` problem built on the GPU (cond(B) = 1e3, nb = 64), three
tridiagonalizations; prints when the first, middle and last panels were queued.  A host that
has queued its last panel long before sytrd ends is free meanwhile (the divide and conquer's
early subtrees use that time: tridiag_dc.Early)."""
from __future__ import annotations

import sys
import time


def main() -> int:
    import cupy as cp
    from mpi4py import MPI

    import hpccoll
    from hpccoll_eigensolver import BlockCyclic, householder, sytrd_device
    from hpccoll_eigensolver.counting import PhaseTimer
    from hpccoll_eigensolver.problems import make_problem
    from hpccoll_eigensolver.solver import tridiagonalize
    from hpccoll_eigensolver.warmup import warm_up

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    warm_up(stedc="dc")
    prob = make_problem("known", n, cond_b=1e3, seed=0, xp=cp)
    comm = hpccoll.Communicator(MPI.COMM_SELF, backend="cuda", deterministic=True)
    stamps: dict = {}
    end_panel, sytrd = sytrd_device._Step.end_panel, householder.sytrd

    def stamped_end_panel(self, p0, p1):
        end_panel(self, p0, p1)
        stamps.setdefault("panels", []).append(time.perf_counter())

    def timed_sytrd(*args, **kwargs):
        stamps["t0"] = time.perf_counter()
        out = sytrd(*args, **kwargs)
        stamps["t1"] = time.perf_counter()
        return out

    sytrd_device._Step.end_panel, householder.sytrd = stamped_end_panel, timed_sytrd
    try:
        for rep in range(3):
            stamps.clear()
            tridiagonalize(prob.A, prob.B, BlockCyclic(n, n, 64, 1), comm, cp, PhaseTimer(cp, comm))
            t0, q = stamps["t0"], [round((x - stamps["t0"]) * 1e3, 1) for x in stamps["panels"]]
            mid = len(q) // 2
            print(f"n={n} rep {rep}: sytrd {1e3 * (stamps['t1'] - t0):.1f} ms; panel enqueued at (ms) "
                  f"first {q[:3]} mid {q[mid - 1:mid + 1]} last {q[-3:]}", flush=True)
    finally:
        comm.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
