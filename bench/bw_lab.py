"""Bandwidth lab (GPU machine, 2 ranks): the library's Allreduce kernels against variants of
them - cuda/collectives.cu built with other compile defines, or launched on other grids - timed
side by side in one run, per op in a CUDA graph of GRAPH_OPS launches (a launch per op, as the
library issues calls alone), every result checked bitwise against the rank-order sum of fresh
random data.  The A/B bench for a kernel change at the sizes where bandwidth counts.

    mpiexec -n 2 python3 bench/bw_lab.py [--sizes 64K,256K,1M,2M,4M,8M] [--variants NAME,...]
                                         [--algorithms oneshot_sentinel,twoshot_sentinel] [--json out.json]

Variants (VARIANTS: compile defines, None for the library's own module; a rule for the grid's
blocks, None for the library's grid); add one to try a new switch of the kernels:
  library   the library's module and grid
  generic   collectives.cu without HC_NRANKS: the kernels for any rank count, against the
            library's build for this one
  half      the library's kernels on at most 64 blocks
Sizes x variants are interleaved (for each size, every variant), so drifts of the machine hit
every variant alike."""
from __future__ import annotations

import argparse

import numpy as np

VARIANTS = {
    "library": (None, None),
    "generic": ((), None),
    "half": (None, lambda blocks: min(64, blocks)),
}


def main() -> int:
    import cupy as cp
    from _lab import open_lab, write_lab_json

    from hpccoll._abi import Args
    from hpccoll.backends.cuda import launch
    from hpccoll.backends.cuda.driver import Launcher, Module
    from hpccoll.backends.cuda.nvrtc import compile_module
    from hpccoll.bench.ranks import agree
    from hpccoll.bench.sizes import parse_sizes
    from hpccoll.bench.timing import GRAPH_OPS, time_graph

    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64K,256K,1M,2M,4M,8M")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--algorithms", default="oneshot_sentinel,twoshot_sentinel")
    ap.add_argument("--iters", type=int, default=400, help="ops timed per repetition (graph replays x GRAPH_OPS)")
    ap.add_argument("--json", default=None)
    opts = ap.parse_args()
    names = [v for v in opts.variants.split(",") if v]
    bad = [v for v in names if v not in VARIANTS]
    if bad:
        raise SystemExit(f"bw_lab: unknown --variants {bad}: choose from {sorted(VARIANTS)}")
    algos = [a for a in opts.algorithms.split(",") if a]

    comm, say, sol = open_lab("bw_lab")
    rank, mpi, dev = comm.rank, comm.mpi_comm, comm._backend
    # one module per set of defines (None: the library's own); ranks compiling at once is safe,
    # as in the backend: the disk cache is written atomically
    modules = {defs: dev.kernels.module("float32") if defs is None else
               Module(compile_module("collectives.cu", "float32", dev.arch, defs))
               for defs in {VARIANTS[v][0] for v in names}}
    per_launch = {a: launch.allreduce_launcher(dev, "float32", a, "SUM")[1] // 4 for a in algos}  # floats

    def grid_of(variant: str, algo: str, count: int) -> tuple[int, int]:
        blocks, threads = launch.allreduce_grid(dev, algo, count, 4)
        rule = VARIANTS[variant][1]
        return (blocks if rule is None else rule(blocks)), threads

    def allreduce(variant: str, algo: str, x, y):
        """op(stream): the Allreduce x -> y in the variant's launches, chunked as the library
        chunks a message larger than one launch carries."""
        library = launch.allreduce_launcher(dev, "float32", algo, "SUM")[0]
        kernel = modules[VARIANTS[variant][0]].fn(f"hc_allreduce_{algo}_sum")
        lau = Launcher(kernel, Args.from_buffer_copy(library.args), pdl=dev.kernels.pdl)
        a, n, step = lau.args, x.size, per_launch[algo]
        a.iters = 1

        def op(st):
            for c0 in range(0, n, step):
                c = min(step, n - c0)
                a.in_, a.out, a.count = x.data.ptr + 4 * c0, y.data.ptr + 4 * c0, c
                lau(*grid_of(variant, algo, c), st.ptr)  # (the driver copies the parameters)
        return op

    rng = np.random.default_rng([rank, 8])
    rows = []
    for nbytes in parse_sizes(opts.sizes):
        n = nbytes // 4
        for algo in algos:
            for v in names:
                h = rng.standard_normal(n).astype(np.float32)
                xs = mpi.allgather(h)
                ref = (xs[0] + xs[1]).astype(np.float32)
                x, y = cp.asarray(h), cp.zeros(n, cp.float32)
                row = {"bytes": nbytes, "algorithm": algo, "variant": v, "defines": list(VARIANTS[v][0] or ()),
                       "grid": list(grid_of(v, algo, min(n, per_launch[algo])))}  # (of the first launch)
                try:
                    row["graph_us"] = time_graph(mpi, allreduce(v, algo, x, y), opts.iters)
                    comm.synchronize()
                    good = np.array_equal(y.get().view(np.uint32), ref.view(np.uint32))
                except Exception as exc:  # noqa: BLE001  (a failing variant is a result, not the end)
                    row["graph_us"], row["error"], good = None, f"{type(exc).__name__}: {exc}", False
                row["ok"] = agree(mpi, good)
                if row.get("graph_us"):
                    row["GBps"] = nbytes / (row["graph_us"] * 1e3)
                rows.append(row)
                say(f"{nbytes:>9} {algo:>17} {v:>9} grid {row['grid']} graph "
                    f"{row['graph_us'] if row['graph_us'] is None else round(row['graph_us'], 3)} us ok {row['ok']}"
                    + (f" ({row['error']})" if "error" in row else ""))

    say(f"\n{'bytes':>9} {'algorithm':>17} " + " ".join(f"{v:>9}" for v in names) + "   (us per op, graph)")
    for nbytes in parse_sizes(opts.sizes):
        for algo in algos:
            cells = []
            for v in names:
                r = next(r for r in rows if r["bytes"] == nbytes and r["algorithm"] == algo and r["variant"] == v)
                cells.append(f"{r['graph_us']:>8.2f}{'' if r['ok'] else '!'}" if r["graph_us"] else f"{'fail':>9}")
            say(f"{nbytes:>9} {algo:>17} " + " ".join(cells))
    say("('!': the result differed from the rank-order sum)")
    write_lab_json(comm, opts, sol, rows, "bench/bw_lab.py", graph_ops=GRAPH_OPS)
    comm.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
