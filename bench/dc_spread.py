"""The run-to-run spread of the GPU divide and conquer (tridiag_dc) on the T of a solve: wall,
process CPU and GPU-span seconds of each solve, then per-step times of a few more.

    mpiexec -n 1 python3 bench/dc_spread.py [--n 8192] [--runs 15] [--profiled 6]

After warm_up, T = (d, e) of the `known` problem as the solver's tridiagonalization leaves it
(bench/dc_profile.py's solve:known); each solve timed alone with a device sync.  CPU time equal
to the wall time means the host was busy the whole solve (host-bound); the profiled solves sync
the device after every step (tridiag_dc.PROFILE), so their sum is above a plain solve's."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--profiled", type=int, default=6)
    a = ap.parse_args()
    import cupy as cp

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from dc_profile import _from_solve

    from hpccoll_eigensolver import tridiag_dc
    from hpccoll_eigensolver.warmup import warm_up

    warm_up(stedc="dc")
    d, e = _from_solve("known", a.n)
    dx, ex = cp.asarray(d), cp.asarray(e)

    def solve():
        return tridiag_dc.eigh_tridiagonal_dc(dx, ex, cp)

    for _ in range(2):
        solve()
    cp.cuda.Device().synchronize()
    rows = []
    for _ in range(a.runs):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        t0, c0 = time.perf_counter(), time.process_time()
        start.record()
        solve()
        stop.record()
        stop.synchronize()
        rows.append((time.perf_counter() - t0, time.process_time() - c0, cp.cuda.get_elapsed_time(start, stop) / 1e3))
    for row in rows:
        print("wall %.4f cpu %.4f gpu-span %.4f" % row, flush=True)
    walls = [r[0] for r in rows]
    print(f"median wall {statistics.median(walls):.4f} min {min(walls):.4f} max {max(walls):.4f}")
    for _ in range(a.profiled):
        tridiag_dc.PROFILE = {}
        t0 = time.perf_counter()
        solve()
        cp.cuda.Device().synchronize()
        took = time.perf_counter() - t0
        print(f"profiled {took:.4f}: " + "  ".join(f"{k} {v:.4f}" for k, v in sorted(tridiag_dc.PROFILE.items())),
              flush=True)
    tridiag_dc.PROFILE = None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
