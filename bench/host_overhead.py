"""Host-path overhead of hpccoll against raw mpi4py on the same arrays, side by side in one run.

    mpiexec -n 2 python bench/host_overhead.py --json out.json

For each size, the variants below take turns (one batch of `--calls` back-to-back calls each,
after a barrier, `--reps` rounds), so that a slow spell of the machine hits every variant alike;
each variant's figure is the median over the rounds of the mean time per call, slowest rank:
- mpi4py: raw `MPI.Comm.Allreduce` (blocking), the baseline of every ratio;
- Iallreduce: raw mpi4py's nonblocking call completed by `Test` (what hpccoll's MPI path rests on);
- hpccoll: the host backend by default (the shared-memory Allreduce where it runs);
- deterministic: `deterministic=True`;
- check: check mode (an argument exchange before every call; a quarter of the calls);
- mpi path: the default with the shared-memory path switched off (HPCCOLL_HOST_SHM=0), every
  call through nonblocking MPI.
hpccoll's calls always run with the timeout machinery on: a lost peer raises CollectiveTimeout."""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import mpi4py
import numpy as np
from mpi4py import MPI

import hpccoll
from hpccoll.bench.ranks import max_over_ranks
from hpccoll.bench.report import now, write_json
from hpccoll.config import git_commit

VARIANTS = ("mpi4py", "nonblocking", "hpccoll", "deterministic", "check", "mpi_path")
HEADS = {"mpi4py": "mpi4py", "nonblocking": "Iallred", "hpccoll": "hpccoll", "deterministic": "determ.",
         "check": "check", "mpi_path": "mpi path"}


def _time_batch(comm, fn, calls: int) -> float:
    """Mean µs per call of `calls` calls after a barrier, slowest rank."""
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return float(max_over_ranks(comm, (time.perf_counter() - t0) / calls * 1e6))


def _nonblocking(comm, x, y) -> None:
    """Raw mpi4py's nonblocking Allreduce completed by Test (what hpccoll's MPI path rests on)."""
    req = comm.Iallreduce(x, y, op=MPI.SUM)
    while not req.Test():
        pass


def _without_shm(**kw):
    """A host Communicator with the shared-memory path switched off (on every rank alike)."""
    old = os.environ.get("HPCCOLL_HOST_SHM")
    os.environ["HPCCOLL_HOST_SHM"] = "0"
    try:
        return hpccoll.Communicator(backend="host", **kw)
    finally:
        if old is None:
            del os.environ["HPCCOLL_HOST_SHM"]
        else:
            os.environ["HPCCOLL_HOST_SHM"] = old


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", default="16,256,4096", help="float32 elements per call (comma list)")
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    world = MPI.COMM_WORLD
    raw = world.Dup()
    comms = {"hpccoll": hpccoll.Communicator(backend="host"),
             "deterministic": hpccoll.Communicator(backend="host", deterministic=True),
             "check": hpccoll.Communicator(backend="host", check=True),
             "mpi_path": _without_shm()}
    shm = comms["hpccoll"]._host.shm_off or "on"
    rows = []
    for n in (int(c) for c in a.counts.split(",")):
        x = np.random.default_rng(world.rank).standard_normal(n).astype(np.float32)
        y = np.empty_like(x)
        fns = {"mpi4py": lambda: raw.Allreduce(x, y, op=MPI.SUM), "nonblocking": lambda: _nonblocking(raw, x, y)}
        fns.update({k: (lambda c=c: c.Allreduce(x, y)) for k, c in comms.items()})
        calls = {k: max(1, a.calls // 4) if k == "check" else a.calls for k in VARIANTS}
        for k in VARIANTS:  # warm-up: the first call, the fast path, the prepared call
            for _ in range(min(calls[k], 200)):
                fns[k]()
        times = {k: [] for k in VARIANTS}
        for _ in range(a.reps):
            for k in VARIANTS:
                times[k].append(_time_batch(raw, fns[k], calls[k]))
        row = {"count": n, "bytes": 4 * n}
        for k in VARIANTS:
            row[f"{k}_us"] = statistics.median(times[k])
        for k in VARIANTS[1:]:
            row[f"{k}_ratio"] = row[f"{k}_us"] / row["mpi4py_us"]
        rows.append(row)
    mpi = MPI.Get_library_version().splitlines()[0].strip()
    if world.rank == 0:
        print(f"host-path overhead, {world.size} ranks, float32 SUM, {mpi}, {platform.node()} "
              f"({platform.processor() or platform.machine()}); shared-memory path: {shm}; "
              f"median of {a.reps} rounds of {a.calls} calls (check: {max(1, a.calls // 4)}), slowest rank")
        head = f"{'count':>6} {'mpi4py':>8}" + "".join(f" {HEADS[k]:>8} {'ratio':>6}" for k in VARIANTS[1:])
        print(head + "   (us per call; ratio to mpi4py)")
        for r in rows:
            print(f"{r['count']:>6} {r['mpi4py_us']:8.2f}" +
                  "".join(f" {r[k + '_us']:8.2f} {r[k + '_ratio']:6.2f}" for k in VARIANTS[1:]))
        if a.json:
            write_json({"ranks": world.size, "mpi": mpi, "host": platform.node(), "commit": git_commit(),
                        "date": now(), "shared_memory_path": shm, "calls": a.calls, "reps": a.reps,
                        "mpi4py": mpi4py.__version__,
                        "numpy": np.__version__, "rows": rows}, a.json)
    for c in comms.values():
        c.Free()
    raw.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
