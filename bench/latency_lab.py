"""Latency lab (GPU machine, 2 ranks): hpccoll's one-shot kernels timed in-kernel next to
stripped variants of the same algorithm (bench/kernels/lab_latency.cu), with the SoL model, all
in one run - to find where hpccoll's in-kernel time exceeds the model.

    mpiexec -n 2 python3 bench/latency_lab.py [--iters 1000] [--sizes 128,1K,4K,8K] [--json out.json]

Variants: `min` (send, poll, re-arm, reduce in rank order; nothing else), `timer` (min + the
bounded poll's timer and abort-flag checks every 256 spins), `prims` (the same loop on the
LLBuffer primitives), `prims_ld` (prims + the input re-read twice per op, as hpccoll does),
`full` (hpccoll's allreduceOneShot launched like the others); `hpccoll_ll` (the library's one-shot
LL, which sends the next collective as soon as a pack arrived) against the same loop stripped:
`ll_min`, `ll_timer` (+ the bounded poll's checks), `ll_late` (the next send after the reduction
and the store).  Each result is checked bitwise against the rank-order sum.  Per-op µs = event
time of one launch of `iters` ops / iters, median of 5, MAX over ranks, every launch preceded by
a device barrier (hpccoll.bench.timing)."""
from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import numpy as np

KERNELS = Path(__file__).resolve().parent / "kernels"


def main() -> int:
    import cupy as cp
    from _lab import open_lab, write_lab_json

    import hpccoll
    from hpccoll._abi import Args
    from hpccoll._validate import prepare
    from hpccoll.backends.cuda.driver import Module, launch_raw
    from hpccoll.backends.cuda.nvrtc import compile_file
    from hpccoll.bench.ranks import agree
    from hpccoll.bench.sizes import parse_sizes
    from hpccoll.bench.timing import time_events

    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--sizes", default="128,1K,4K,8K")
    ap.add_argument("--json", default=None)
    opts = ap.parse_args()
    K = opts.iters + (opts.iters & 1)  # even: successive launches keep the parity alternation
    comm, say, sol = open_lab("latency_lab")
    rank, mpi, dev = comm.rank, comm.mpi_comm, comm._backend
    # the lab's kernels built like the library's (for its rank count), so `full` is hpccoll's
    mod = Module(compile_file(KERNELS / "lab_latency.cu", "float32", dev.arch, dev.kernels.defines))
    names = ("min", "timer", "prims", "prims_ld", "full")
    variants = {v: mod.fn(f"hc_lab_oneshot_{v}") for v in names}
    ll_names = ("ll_min", "ll_timer", "ll_late")
    ll_variants = {v: mod.fn(f"hc_lab_{v}") for v in ll_names}
    _cap, region, _region2 = dev.layout.allreduce["oneshot_sentinel"]
    ll_region = dev.layout.allreduce["oneshot_ll"][1]
    epochs = [3_000_000_000]  # the LL variants' epochs: a fresh range per launch (lab_latency.cu)

    def ll_base() -> ctypes.c_uint64:
        epochs[0] += K + 2
        return ctypes.c_uint64(epochs[0])

    base = dev.kernels.launcher("float32", "hc_allreduce_oneshot_sentinel_sum", region).args
    s = cp.cuda.Stream(non_blocking=True)
    out = cp.zeros(4, cp.uint64)
    rng = np.random.default_rng([rank, 5])
    rows = []
    for nbytes in parse_sizes(opts.sizes):
        n = max(4, nbytes // 4 // 4 * 4)
        if n // 4 > 512:
            say(f"skip {nbytes} B: the lab kernels use one block of <= 512 threads")
            continue
        h = rng.standard_normal(n).astype(np.float32)
        xs = mpi.allgather(h)
        ref = (xs[0] + xs[1]).astype(np.float32)
        with s:  # (made on s, where the kernels run: the default stream does not order them)
            x, y = cp.asarray(h), cp.empty(n, cp.float32)
        row = {"bytes": n * 4, "iters": K}
        call = prepare("Allreduce", 2, x, y, op=hpccoll.SUM)

        def everywhere_right(own_ok: bool = True) -> bool:
            good = own_ok and np.array_equal(y.get().view(np.uint32), ref.view(np.uint32))
            return agree(mpi, good)

        for name, algo in (("hpccoll", "oneshot_sentinel"), ("hpccoll_ll", "oneshot_ll")):
            with s:
                y.fill(0)
            dev.run(call, True, algo, s, iters=2)
            comm.synchronize(s)
            row[f"{name}_us"] = time_events(mpi, s, lambda algo=algo: dev.run(call, True, algo, s, iters=K), K, 1)
            comm.synchronize(s)
            row[f"{name}_ok"] = everywhere_right()
        a = Args.from_buffer_copy(base)
        a.in_, a.out, a.count, a.iters = x.data.ptr, y.data.ptr, n, K
        a.region, a.sub = region
        block = (n // 4 + 31) // 32 * 32
        a_ll = Args.from_buffer_copy(a)
        a_ll.region, a_ll.sub = ll_region
        out_ptr = ctypes.c_void_p(out.data.ptr)
        launches = [(name, lambda f=f: launch_raw(f, 1, block, s.ptr, a, out_ptr)) for name, f in variants.items()]
        launches += [(name, lambda f=f: launch_raw(f, 1, block, s.ptr, a_ll, out_ptr, ll_base()))
                     for name, f in ll_variants.items()]
        for name, launch in launches:
            y.fill(0)
            out.fill(0)
            cp.cuda.runtime.deviceSynchronize()
            mpi.Barrier()
            row[f"{name}_us"] = time_events(mpi, s, launch, K, 1)
            s.synchronize()
            row[f"{name}_ok"] = everywhere_right(int(out[1].get()) == 0)
        rows.append(row)
        say(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    cols = ("hpccoll",) + names + ("hpccoll_ll",) + ll_names
    say(f"{'bytes':>7} " + " ".join(f"{v:>10}" for v in cols) + f"   (us per op, in-kernel; SoL {sol.get('sol_us')})")
    for r in rows:
        say(f"{r['bytes']:>7} " + " ".join(f"{r[v + '_us']:>10.3f}" for v in cols)
            + "   ok " + " ".join(str(r[k + "_ok"]) for k in cols))
    write_lab_json(comm, opts, sol, rows, "bench/latency_lab.py")
    comm.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
