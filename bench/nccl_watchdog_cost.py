"""What the NCCL backend's watchdog costs per call: eager Allreduce calls through
`Communicator(backend="nccl")`, with the watchdog's bookkeeping (a capture check, CUDA events
recorded before and after the call, its entry in the watchdog's queue, and synchronize's
polling wait while such calls are pending) and without it (the backend's `watch` off, as the
benchmark's NCCL eager rows run, so synchronize blocks in CUDA), interleaved over several rounds.  Per-call
time = the wall time of `--calls` calls, back to back with one synchronize or each with its
own (as the benchmark's eager mode), divided by the calls; the median over rounds.
One rank by default (an NCCL communicator of one rank needs one GPU, and its calls are short
local copies, so host costs show); more ranks under mpiexec with one GPU each.  Prints a table
and writes nccl_watchdog_cost.json.

    python3 bench/nccl_watchdog_cost.py --calls 5000 --rounds 5 --out /tmp/wd
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def per_call_us(comm, x, out, calls: int, blocking: bool) -> float:
    """µs per call: `calls` calls back to back and one synchronize, or (blocking) each call
    followed by its synchronize, as the benchmark's eager mode times a call."""
    comm.Allreduce(x, out)
    comm.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        comm.Allreduce(x, out)
        if blocking:
            comm.synchronize()
    comm.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--counts", default="2,1024", help="float32 elements per call, comma-separated")
    p.add_argument("--out", type=Path, default=Path("nccl_watchdog_cost"))
    args = p.parse_args()
    import cupy as cp

    import hpccoll

    comm = hpccoll.Communicator(backend="nccl")
    rank, size, backend = comm.rank, comm.size, comm._backend
    rows = []
    try:
        for n in map(int, args.counts.split(",")):
            x, out = cp.ones(n, cp.float32), cp.empty(n, cp.float32)
            for blocking in (False, True):
                times = {"on": [], "off": []}
                for _ in range(args.rounds):
                    for mode in ("on", "off"):
                        backend.watch = mode == "on"
                        times[mode].append(per_call_us(comm, x, out, args.calls, blocking))
                backend.watch = True
                on, off = statistics.median(times["on"]), statistics.median(times["off"])
                rows.append({"count": n, "bytes": 4 * n, "timing": "blocking" if blocking else "back to back",
                             "on_us": on, "off_us": off, "cost_us": on - off,
                             "rounds_on_us": times["on"], "rounds_off_us": times["off"]})
    finally:
        comm.Free()
    if rank != 0:
        return
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    gpu = name.decode() if isinstance(name, bytes) else str(name)
    print(f"NCCL backend, eager float32 Allreduce, {size} rank(s) on {gpu}: {args.calls} calls per round, back "
          f"to back (one synchronize) or blocking (a synchronize each), median of {args.rounds} interleaved rounds")
    print(f"{'bytes':>8} {'timing':>13} {'watchdog on us':>15} {'off us':>9} {'cost us':>9}")
    for r in rows:
        print(f"{r['bytes']:>8} {r['timing']:>13} {r['on_us']:>15.2f} {r['off_us']:>9.2f} {r['cost_us']:>9.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nccl_watchdog_cost.json").write_text(json.dumps(
        {"gpu": gpu, "ranks": size, "calls": args.calls, "rounds": args.rounds, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
