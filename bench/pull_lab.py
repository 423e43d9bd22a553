"""Pull lab (GPU machine, 2 ranks): a one-shot LL allreduce that PUSHES its packs into the
peer (the library's way) against one that writes them locally and lets the peer PULL them
(cuda/lab_pull.cu), per op in a CUDA graph (one launch per op) and in-kernel (one launch of
--iters ops), next to the library's one-shot LL and sentinel kernels and the kernel-boundary
floors (empty; one remote store; one remote load), all in one run.

    mpiexec -n 2 python3 bench/pull_lab.py [--sizes 128,1K,4K,16K,64K] [--iters 1000] [--json out.json]

Question (bench/NOTES.md, session 12): a kernel that stored to its peer completes only once
the store is acknowledged; a pulling kernel has no remote store outstanding at its end.  Is
its op in a graph shorter, and what does pulling cost in-kernel?

Every variant runs on the library's grid for the size (HPCCOLL_SMALL_BLOCK blocks), launched
with programmatic dependent launch as the library's kernels are.  Fresh random data per size
and variant; every result is checked bitwise against the rank-order sum after its timing.
Graph: bench.time_graph (GRAPH_OPS launches captured, replayed; median of bench.REPS, MAX over
ranks).  In-kernel: event time of one launch of --iters ops / --iters (median, MAX)."""
from __future__ import annotations

import argparse

import numpy as np

LAB_OFF_EPOCHS = 40960  # cuda/lab_pull.cu
LAB_VARIANTS = ("push_ll", "pull_ll")
LIB_VARIANTS = ("oneshot_ll", "oneshot_sentinel")


def main() -> int:
    import cupy as cp
    from mpi4py import MPI

    import hpccoll
    from hpccoll import bench
    from hpccoll._driver import Args, Launcher, Module
    from hpccoll._nvrtc import compile_module
    from hpccoll._validate import prepare

    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="128,1K,4K,16K,64K")
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--graph-iters", type=int, default=2000, help="ops timed per graph repetition")
    ap.add_argument("--json", default=None)
    opts = ap.parse_args()
    comm, say, sol = bench.open_lab("pull_lab")
    rank, mpi, dev = comm.rank, comm.mpi_comm, comm._device
    mod = Module(compile_module("lab_pull.cu", "float32", dev.arch))
    base = dev._launcher("float32", "hc_allreduce_oneshot_ll_sum", *dev.layout.allreduce["oneshot_ll"][1:]).args
    epochs = dev.ws.view(LAB_OFF_EPOCHS, 256 * 8, np.uint64)
    next_base = [3_000_000_000]

    def fresh_epochs() -> None:
        """Every lab epoch word to one new base on both ranks, above every flag used before."""
        next_base[0] += 10_000_000
        cp.cuda.Device().synchronize()
        epochs.fill(next_base[0])
        cp.cuda.Device().synchronize()
        mpi.Barrier()

    s = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng([rank, 12])
    rows = []

    # the kernel boundary: an empty kernel, + one remote store, + one remote load (graph of 20)
    floors = {}
    a0 = Args.from_buffer_copy(base)
    sol_mod = Module(compile_module("sol.cu", "float32", dev.arch))
    for name, fn in (("empty", sol_mod.fn("hc_sol_empty")), ("store", sol_mod.fn("hc_sol_store")),
                     ("load", mod.fn("hc_lab_floor_load"))):
        lau = Launcher(fn, a0, pdl=dev.pdl)
        floors[name] = bench.time_graph(mpi, lambda st, lau=lau: lau(1, 128, st.ptr), opts.graph_iters)
    say("floors (us per launch in a graph): " + " ".join(f"{k} {v:.3f}" for k, v in floors.items()))

    for nbytes in bench.parse_sizes(opts.sizes):
        n = max(4, nbytes // 16 * 4)
        if n // 4 * 32 > base.sub:
            say(f"skip {nbytes} B: more packs than the LL sub-buffer holds ({base.sub} B)")
            continue
        blocks, threads = dev._allreduce_grid("oneshot_ll", n, 4)
        for v in LIB_VARIANTS + LAB_VARIANTS:
            h = rng.standard_normal(n).astype(np.float32)
            xs = mpi.allgather(h)
            ref = (xs[0] + xs[1]).astype(np.float32)
            x, y = cp.asarray(h), cp.zeros(n, cp.float32)
            row = {"bytes": n * 4, "variant": v, "grid": [blocks, threads]}
            if v in LIB_VARIANTS:
                call = prepare("Allreduce", 2, x, y, op=hpccoll.SUM)

                def op(st, k=1, v=v, call=call):
                    dev.run(call, True, v, st, iters=k)
            else:
                a = Args.from_buffer_copy(base)
                a.in_, a.out, a.count = x.data.ptr, y.data.ptr, n
                one, loop = Args.from_buffer_copy(a), Args.from_buffer_copy(a)
                one.iters, loop.iters = 1, opts.iters
                lau1, lauK = Launcher(mod.fn(f"hc_lab_{v}"), one, pdl=dev.pdl), Launcher(mod.fn(f"hc_lab_{v}"), loop, pdl=dev.pdl)

                def op(st, k=1, lau1=lau1, lauK=lauK):
                    (lau1 if k == 1 else lauK)(blocks, threads, st.ptr)
                fresh_epochs()
            try:
                row["graph_us"] = bench.time_graph(mpi, op, opts.graph_iters)
                comm.synchronize()
                good = np.array_equal(y.get().view(np.uint32), ref.view(np.uint32))
                y.fill(0)
                cp.cuda.Device().synchronize()
                row["in_kernel_us"] = bench._time_events(mpi, s, lambda: op(s, opts.iters), opts.iters, 1)
                s.synchronize()
                comm.synchronize()
                good = good and np.array_equal(y.get().view(np.uint32), ref.view(np.uint32))
            except Exception as exc:  # noqa: BLE001  (a failing variant is a result, not the end)
                row["error"], good = f"{type(exc).__name__}: {exc}", False
            row["ok"] = bool(mpi.allreduce(int(good), op=MPI.MIN))
            rows.append(row)
            say(f"{n * 4:>7} {v:>17} grid {blocks}x{threads} graph {row.get('graph_us', float('nan')):.3f} "
                f"in-kernel {row.get('in_kernel_us', float('nan')):.3f} ok {row['ok']}" + (f" ({row['error']})" if "error" in row else ""))

    names = LIB_VARIANTS + LAB_VARIANTS
    say(f"\n{'bytes':>7} " + " ".join(f"{v:>17}" for v in names) + "   (us per op: graph / in-kernel)")
    for nb in sorted({r["bytes"] for r in rows}):
        cells = []
        for v in names:
            r = next(r for r in rows if r["bytes"] == nb and r["variant"] == v)
            mark = "" if r["ok"] else "!"
            cells.append(f"{r.get('graph_us', float('nan')):>8.3f}/{r.get('in_kernel_us', float('nan')):<7.3f}{mark}")
        say(f"{nb:>7} " + " ".join(f"{c:>17}" for c in cells))
    say(f"floors {floors}; SoL {sol.get('sol_us')} us; '!': a result differed from the rank-order sum")
    bench.write_lab_json(comm, opts, sol, rows, "bench/pull_lab.py", floors_us=floors, graph_ops=bench.GRAPH_OPS)
    comm.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
