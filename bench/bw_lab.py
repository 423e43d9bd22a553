"""Bandwidth lab (GPU machine, 2 ranks): the Allreduce kernels of collectives.cu compiled with
variant defines and launch grids, timed side by side in one run, per op in a CUDA graph of
bench.GRAPH_OPS (the issue #4 table's graph column), every result checked bitwise against the
rank-order sum of fresh random data.  Question: what keeps 1-4 MiB above the model
floor + SoL + bytes / peer-copy bandwidth (bench/NOTES.md)?

    mpiexec -n 2 python3 bench/bw_lab.py [--sizes 64K,256K,1M,2M,4M,8M] [--variants NAME,...]
                                         [--algorithms oneshot_sentinel,twoshot_sentinel] [--json out.json]

Variants (name: defines, grid: blocks -> blocks); each names its defines, whatever the library's defaults:
  library     the library's build, no defines
  reload      HC_ONESHOT_KEEP=0: one-shot sends, then re-reads its input for the reduction
  keep1       HC_ONESHOT_KEEP=1 (the library's): a thread's first pack stays in registers
  keep4       HC_ONESHOT_KEEP=4: up to 4 packs kept, each loaded and then stored in turn
  keep4burst  + HC_ONESHOT_BURST=1: the 4 loaded together, then stored back to back (d8ca22e)
  scatter1    HC_SCATTER_BATCH=1 (the library's since 35c0130's run): two-shot's
              reduce-scatter loads and stores pack by pack; scatter2, scatter4 (before) likewise
  sleep100    __nanosleep(100) after every poll miss (HC_POLL_BACKOFF_NS); sleep400 likewise
  half        the library's build on at most 64 blocks
  noin, noout timing only (results not checked): the input is not read (made-up packs), or the
              result not written (HC_LAB_NO_INPUT / HC_LAB_NO_OUTPUT): the local traffic's share
  nowait      timing only: every poll reads once and goes on (HC_LAB_NO_WAIT): sends and local
              work without waiting for the peer
  nowait_norearm   timing only: nowait + read slots not re-armed (HC_LAB_NO_REARM)
  nowait_bare timing only: nowait_norearm + noin + noout: the sends and the slot reads alone
  nr2         HC_NRANKS=2: the rank count a compile-time constant (the kernels keep no code for
              other counts: one-shot LL 4520 -> 1656 SASS lines, 124 -> 54 registers); 2 ranks
              only, as this lab.  Since its run (07d437e) the library builds every module so
              (backends/cuda.py rank_defines): "library" is this variant now
  noabort     HC_LAB_NO_ABORT=1: the one-shot does not read the abort flag before its first send
  llpair      HC_LL_WARP=0: a pack's two LL slots side by side, where a warp's store writes
              every other 16 bytes of 1 KiB (the layout before 69d8881's run, whose variant
              "llwarp" was today's library); LL algorithms only
  split       HC_ONESHOT_SPLIT=1: one-shot's first half of the blocks only send, the second half
              only receive; split256: the same on twice the library's blocks (at most 256)
The first bw_lab run (d8ca22e, where keep = keep4burst) is in bench/NOTES.md, session 8.
Sizes x variants are interleaved (for each size, every variant), so drifts of the machine hit
every variant alike."""
from __future__ import annotations

import argparse

import numpy as np

VARIANTS = {
    "library": ((), None),
    "reload": (("-DHC_ONESHOT_KEEP=0",), None),
    "keep1": (("-DHC_ONESHOT_KEEP=1",), None),
    "keep4": (("-DHC_ONESHOT_KEEP=4",), None),
    "keep4burst": (("-DHC_ONESHOT_KEEP=4", "-DHC_ONESHOT_BURST=1"), None),
    "scatter1": (("-DHC_SCATTER_BATCH=1",), None),
    "scatter2": (("-DHC_SCATTER_BATCH=2",), None),
    "scatter4": (("-DHC_SCATTER_BATCH=4",), None),
    "sleep100": (("-DHC_POLL_BACKOFF_NS=100",), None),
    "sleep400": (("-DHC_POLL_BACKOFF_NS=400",), None),
    "half": ((), lambda b: min(64, b)),
    "noin": (("-DHC_LAB_NO_INPUT=1",), None),
    "noout": (("-DHC_LAB_NO_OUTPUT=1",), None),
    "nowait": (("-DHC_LAB_NO_WAIT=1",), None),
    "nowait_norearm": (("-DHC_LAB_NO_WAIT=1", "-DHC_LAB_NO_REARM=1"), None),
    "nowait_bare": (("-DHC_LAB_NO_WAIT=1", "-DHC_LAB_NO_REARM=1", "-DHC_LAB_NO_INPUT=1", "-DHC_LAB_NO_OUTPUT=1"), None),
    "nr2": (("-DHC_NRANKS=2",), None),
    "noabort": (("-DHC_LAB_NO_ABORT=1",), None),
    "llpair": (("-DHC_LL_WARP=0",), None),
    "nr2_noabort": (("-DHC_NRANKS=2", "-DHC_LAB_NO_ABORT=1"), None),
    "split": (("-DHC_ONESHOT_SPLIT=1",), None),
    "split256": (("-DHC_ONESHOT_SPLIT=1",), lambda b: min(256, 2 * b)),  # HC_MAX_BLOCKS; senders never wait
}
TIMING_ONLY = {"noin", "noout", "nowait", "nowait_norearm", "nowait_bare"}  # their results are wrong by design: not checked
DEFAULT_VARIANTS = "library,reload,keep4,keep4burst,scatter2,scatter4"


def main() -> int:
    import cupy as cp
    from mpi4py import MPI

    import hpccoll
    from hpccoll import bench
    from hpccoll._driver import Launcher, Module
    from hpccoll._nvrtc import compile_module
    from hpccoll._validate import prepare

    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64K,256K,1M,2M,4M,8M")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--algorithms", default="oneshot_sentinel,twoshot_sentinel")
    ap.add_argument("--iters", type=int, default=400, help="ops timed per repetition (graph replays x GRAPH_OPS)")
    ap.add_argument("--json", default=None)
    opts = ap.parse_args()
    names = [v for v in opts.variants.split(",") if v]
    bad = [v for v in names if v not in VARIANTS]
    if bad:
        raise SystemExit(f"bw_lab: unknown --variants {bad}: choose from {sorted(VARIANTS)}")
    algos = [a for a in opts.algorithms.split(",") if a]

    comm, say, sol = bench.open_lab("bw_lab")
    rank, mpi, dev = comm.rank, comm.mpi_comm, comm._device

    # one module per set of defines (the library's own for none); ranks compiling at once is
    # safe, as in the backend: the disk cache is written atomically
    modules = {defs: dev._module("float32") if not defs else
               Module(compile_module("collectives.cu", "float32", dev.arch, defs))
               for defs in {VARIANTS[v][0] for v in names}}
    grid_rule = dev._allreduce_grid

    def use(variant: str, algo: str) -> None:
        """Point the backend's launcher of `algo` at this variant's kernel and grid."""
        defs, blocks_of = VARIANTS[variant]
        lau, _ = dev._allreduce_launcher("float32", algo, "SUM")
        kernel = f"hc_allreduce_{algo}_sum"
        dev._launchers[("float32", kernel, False)] = Launcher(modules[defs].fn(kernel), lau.args, pdl=dev.pdl)

        def grid(algo, count, esize):
            blocks, threads = grid_rule(algo, count, esize)
            return blocks_of(blocks), threads
        dev._allreduce_grid = grid_rule if blocks_of is None else grid

    rng = np.random.default_rng([rank, 8])
    rows = []
    for nbytes in bench.parse_sizes(opts.sizes):
        n = nbytes // 4
        for algo in algos:
            for v in names:
                h = rng.standard_normal(n).astype(np.float32)
                xs = mpi.allgather(h)
                ref = (xs[0] + xs[1]).astype(np.float32)
                x, y = cp.asarray(h), cp.zeros(n, cp.float32)
                call = prepare("Allreduce", 2, x, y, op=hpccoll.SUM)
                use(v, algo)
                row = {"bytes": nbytes, "algorithm": algo, "variant": v, "defines": list(VARIANTS[v][0]),
                       "grid": list(dev._allreduce_grid(algo, n, 4))}
                try:
                    row["graph_us"] = bench.time_graph(mpi, lambda st: dev.run(call, True, algo, st), opts.iters)
                    comm.synchronize()
                    good = np.array_equal(y.get().view(np.uint32), ref.view(np.uint32))
                except Exception as exc:  # noqa: BLE001  (a failing variant is a result, not the end)
                    row["graph_us"], row["error"], good = None, f"{type(exc).__name__}: {exc}", False
                row["ok"] = None if v in TIMING_ONLY else bool(mpi.allreduce(int(good), op=MPI.MIN))
                if v in TIMING_ONLY:  # "nowait" can leave data in slots it did not wait for: re-arm all
                    cp.cuda.Device().synchronize()
                    mpi.Barrier()
                    dev._init_regions()
                    mpi.Barrier()
                if row.get("graph_us"):
                    row["GBps"] = nbytes / (row["graph_us"] * 1e3)
                rows.append(row)
                say(f"{nbytes:>9} {algo:>17} {v:>9} grid {row['grid']} graph "
                    f"{row['graph_us'] if row['graph_us'] is None else round(row['graph_us'], 3)} us ok {row['ok']}"
                    + (f" ({row['error']})" if "error" in row else ""))
    dev._allreduce_grid = grid_rule

    say(f"\n{'bytes':>9} {'algorithm':>17} " + " ".join(f"{v:>9}" for v in names) + "   (us per op, graph)")
    for nbytes in bench.parse_sizes(opts.sizes):
        for algo in algos:
            cells = []
            for v in names:
                r = next(r for r in rows if r["bytes"] == nbytes and r["algorithm"] == algo and r["variant"] == v)
                mark = {True: "", False: "!", None: "t"}[r["ok"]]
                cells.append(f"{r['graph_us']:>8.2f}{mark}" if r["graph_us"] else f"{'fail':>9}")
            say(f"{nbytes:>9} {algo:>17} " + " ".join(cells))
    say("('!': the result differed from the rank-order sum; 't': timing only, not checked)")
    bench.write_lab_json(comm, opts, sol, rows, "bench/bw_lab.py", graph_ops=bench.GRAPH_OPS)
    comm.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
