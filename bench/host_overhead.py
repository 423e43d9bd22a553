"""Host-path overhead of hpccoll against raw mpi4py on the same arrays, side by side in one run.

    mpiexec -n 4 python bench/host_overhead.py --json out.json

For each size: raw `MPI.Comm.Allreduce` (blocking), raw `Iallreduce` completed by `Test`,
hpccoll's host backend by default, with deterministic=True, and in check mode; the median over repetitions of the mean time per call
of `--calls` back-to-back calls, after a barrier.  hpccoll's calls run with its timeout machinery
on (nonblocking MPI, completed against the deadline), as they always do."""
from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
from mpi4py import MPI

import hpccoll
from hpccoll.bench.ranks import max_over_ranks
from hpccoll.bench.report import write_json


def per_call_us(comm, fn, calls: int, reps: int) -> float:
    for _ in range(min(calls, 200)):
        fn()
    times = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return float(max_over_ranks(comm, statistics.median(times)))


def _nonblocking(comm, x, y) -> None:
    """Raw mpi4py's nonblocking Allreduce completed by Test (what hpccoll's host call rests on)."""
    req = comm.Iallreduce(x, y, op=MPI.SUM)
    while not req.Test():
        pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", default="16,256,4096", help="float32 elements per call (comma list)")
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    world = MPI.COMM_WORLD
    raw = world.Dup()
    default = hpccoll.Communicator(backend="host")
    det = hpccoll.Communicator(backend="host", deterministic=True)
    checked = hpccoll.Communicator(backend="host", check=True)
    rows = []
    for n in (int(c) for c in a.counts.split(",")):
        x = np.random.default_rng(world.rank).standard_normal(n).astype(np.float32)
        y = np.empty_like(x)
        row = {"count": n, "bytes": 4 * n}
        row["mpi4py_us"] = per_call_us(raw, lambda: raw.Allreduce(x, y, op=MPI.SUM), a.calls, a.reps)
        row["nonblocking_us"] = per_call_us(raw, lambda: _nonblocking(raw, x, y), a.calls, a.reps)
        row["hpccoll_us"] = per_call_us(raw, lambda: default.Allreduce(x, y), a.calls, a.reps)
        row["deterministic_us"] = per_call_us(raw, lambda: det.Allreduce(x, y), a.calls, a.reps)
        row["check_us"] = per_call_us(raw, lambda: checked.Allreduce(x, y), max(1, a.calls // 4), a.reps)
        row["mpi4py_again_us"] = per_call_us(raw, lambda: raw.Allreduce(x, y, op=MPI.SUM), a.calls, a.reps)
        base = min(row["mpi4py_us"], row["mpi4py_again_us"])
        for k in ("hpccoll", "deterministic", "check"):
            row[f"{k}_ratio"] = row[f"{k}_us"] / base
        rows.append(row)
    if world.rank == 0:
        print(f"host-path overhead, {world.size} ranks, float32 SUM, {MPI.Get_library_version().splitlines()[0]}, "
              f"{platform.node()} ({platform.processor() or platform.machine()}); median of {a.reps} x {a.calls} calls")
        print(f"{'count':>6} {'mpi4py':>8} {'again':>8} {'Iallred':>8} {'hpccoll':>8} {'ratio':>6} {'determ.':>8} {'ratio':>6} "
              f"{'check':>8} {'ratio':>6}   (us per call)")
        for r in rows:
            print(f"{r['count']:>6} {r['mpi4py_us']:8.2f} {r['mpi4py_again_us']:8.2f} {r['nonblocking_us']:8.2f} "
                  f"{r['hpccoll_us']:8.2f} "
                  f"{r['hpccoll_ratio']:6.2f} {r['deterministic_us']:8.2f} {r['deterministic_ratio']:6.2f} "
                  f"{r['check_us']:8.2f} {r['check_ratio']:6.2f}")
        if a.json:
            write_json({"ranks": world.size, "mpi": MPI.Get_library_version().splitlines()[0],
                        "host": platform.node(), "calls": a.calls, "reps": a.reps, "rows": rows}, a.json)
    for c in (default, det, checked):
        c.Free()
    raw.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
