"""What the lab scripts of bench/ share (not part of the library): a 2-rank CUDA communicator
with the SoL model measured first and every timed region aligned, and the lab's JSON record.
The timing itself is the bench's: hpccoll.bench.timing.  For the eigensolver's labs (one process,
whole-step wall times): median_wall."""
from __future__ import annotations

import functools

from hpccoll.bench.ranks import say
from hpccoll.bench.report import machine_info, write_json
from hpccoll.bench.sol import measure_sol
from hpccoll.bench.timing import REPS, set_aligner
from hpccoll.config import git_commit


def open_lab(name: str):
    """A lab's start: a 2-rank CUDA Communicator, a print on rank 0, the SoL model measured
    first (before any collective: see measure_sol), and every timed region aligned by a device
    barrier.  -> (comm, say, sol)."""
    import hpccoll

    comm = hpccoll.Communicator(backend="cuda")
    if comm.size != 2:
        raise SystemExit(f"{name}: run with exactly 2 ranks (mpiexec -n 2)")
    log = functools.partial(say, comm.rank)
    sol = measure_sol(comm, log)
    log(f"SoL {sol.get('sol_us')} us (fence {sol.get('fence_ns')} ns, ping-pong {sol.get('pingpong_roundtrip_ns')} ns); "
        f"peer copy {sol.get('bw_GBps')} GB/s; graph floor with one peer store {sol.get('floor_store_pdl_us')} us")
    set_aligner(lambda h: comm._backend.barrier(stream=h, sync=False))
    return comm, log, sol


def write_lab_json(comm, opts, sol: dict, rows: list, script: str, **extra) -> None:
    """A lab's record, on rank 0 when --json was given: machine, commit, the SoL measured at its
    start, its rows, how it timed them and the command line."""
    if comm.rank != 0 or not opts.json:
        return
    write_json({"machine": machine_info(comm), "commit": git_commit(), "sol": sol,
                "median_of": REPS, "rows": rows, **extra,
                "command": f"{script} " + " ".join(f"--{k} {v}" for k, v in vars(opts).items() if v)},
               opts.json)


def median_wall(fn, setup=lambda: None, reps: int = 3):
    """(median wall seconds, last result) of fn(setup()) over `reps` calls after one warm-up
    call, the device synchronized before and after each (setup outside the timing)."""
    import statistics
    import time

    import cupy as cp

    times, out = [], None
    for _ in range(reps + 1):
        arg = setup()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        out = fn(arg)
        cp.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]), out
