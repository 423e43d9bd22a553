"""Push lab (GPU machine, 2 ranks): how fast one kernel can write a buffer into the peer's
memory over NVLink, both ranks at once (as in an allreduce), by SM stores (the library's way:
a thread per 16-byte pack, load then volatile store) or by the Tensor Memory Accelerator's bulk
copies (cp.async.bulk from shared memory), next to the copy engine (cudaMemcpyAsync), in one
run: the floor of a one-launch one-shot at 1-4 MiB (what the allreduce's pushes could reach).

    mpiexec -n 2 python3 bench/push_lab.py [--sizes 256K,1M,2M,4M] [--blocks 128] [--json out.json]

SM stores run on --blocks blocks of 512 threads (the library's grid at >= 1 MiB); bulk copies
on at most that many, each block moving a whole number of 8 or 16 KiB steps.  st_ce35 / st_ce50
split one push: the copy engine moves the first 35 / 50 % on a forked stream while the SM
stores move the rest, joined again (do the two together beat either?).

Per size and way: µs per push in a CUDA graph of GRAPH_OPS pushes (the copy engine's as
memcpy nodes), GB/s = bytes / time, and the pushed bytes checked against the peer's source."""
from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import numpy as np

WAYS = ("st", "st_blk", "tma8k", "tma16k", "copy_engine", "st_ce35", "st_ce50")
SPLIT = {"st_ce35": 0.35, "st_ce50": 0.5}  # the copy engine's share of a split push (the rest: SM stores)
CHUNK = {"tma8k": 8192, "tma16k": 16384}  # bytes per bulk-copy step (kernels/lab_push.cu pushTma<CH>)
KERNELS = Path(__file__).resolve().parent / "kernels"


def main() -> int:
    import cupy as cp
    from _lab import open_lab, write_lab_json
    from mpi4py import MPI

    from hpccoll.backends.cuda.driver import Module, launch_raw
    from hpccoll.backends.cuda.nvrtc import compile_file
    from hpccoll.bench.sizes import parse_sizes
    from hpccoll.bench.timing import GRAPH_OPS, time_graph

    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="256K,1M,2M,4M")
    ap.add_argument("--blocks", type=int, default=128)
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--json", default=None)
    opts = ap.parse_args()
    comm, say, sol = open_lab("push_lab")
    rank, mpi, dev = comm.rank, comm.mpi_comm, comm._backend
    peer = 1 - rank
    mod = Module(compile_file(KERNELS / "lab_push.cu", "float32", dev.arch))
    fns = {w: mod.fn(f"hc_push_{w}") for w in WAYS if w != "copy_engine" and w not in SPLIT}
    side = cp.cuda.Stream(non_blocking=True)  # the copy engine's branch of a split push
    fork, join = cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True)
    L = dev.layout
    region = L.oneshot  # 2 parities x 2 sources x 4 MiB: room for 4 MiB from each rank
    rng = np.random.default_rng([rank, 11])
    rows = []
    for nbytes in parse_sizes(opts.sizes):
        # bulk copies move whole CH-byte steps per block, on at most --blocks blocks
        steps_ok = all(nbytes % ch == 0 and (nbytes // ch) % min(opts.blocks, nbytes // ch) == 0 for ch in CHUNK.values())
        if nbytes > 4 * 1024 * 1024 or not steps_ok:
            say(f"skip {nbytes} B: needs <= 4 MiB and whole 16 KiB steps per block")
            continue
        h = rng.integers(0, 2**32, nbytes // 4, dtype=np.uint32)
        src = cp.asarray(h)
        theirs = mpi.allgather(h)[peer]
        dst = dev.ws.peers[peer] + region + rank * nbytes      # my share of the peer's region
        mine = dev.ws.view(region + peer * nbytes, nbytes, np.uint32)  # what the peer pushes to me
        a_src, a_dst, a_n = ctypes.c_uint64(src.data.ptr), ctypes.c_uint64(dst), ctypes.c_uint64(nbytes)
        for way in WAYS:
            # SM stores on the library's grid; bulk copies on as many blocks (at most that) as
            # have a whole number of CH-byte steps each
            ch = CHUNK.get(way)
            blocks = opts.blocks if ch is None else min(opts.blocks, nbytes // ch)
            row = {"bytes": nbytes, "way": way, "blocks": None if way == "copy_engine" else blocks,
                   "ce_share": SPLIT.get(way, 1.0 if way == "copy_engine" else 0.0)}
            if way == "copy_engine":
                def push(st):
                    cp.cuda.runtime.memcpyAsync(dst, src.data.ptr, nbytes, 4, st.ptr)
            elif way in SPLIT:
                ce = int(nbytes * SPLIT[way]) // 16 * 16
                rest = (ctypes.c_uint64(src.data.ptr + ce), ctypes.c_uint64(dst + ce), ctypes.c_uint64(nbytes - ce))

                def push(st, ce=ce, rest=rest):
                    fork.record(st)
                    side.wait_event(fork)
                    cp.cuda.runtime.memcpyAsync(dst, src.data.ptr, ce, 4, side.ptr)
                    launch_raw(fns["st"], opts.blocks, 512, st.ptr, *rest)
                    join.record(side)
                    st.wait_event(join)
            else:
                fn = fns[way]

                def push(st, fn=fn, blocks=blocks):
                    launch_raw(fn, blocks, 512, st.ptr, a_src, a_dst, a_n)
            try:
                mine.fill(0)
                cp.cuda.Device().synchronize()
                mpi.Barrier()
                row["us"] = time_graph(mpi, push, opts.iters)
                cp.cuda.Device().synchronize()
                mpi.Barrier()
                row["ok"] = bool(mpi.allreduce(int(np.array_equal(mine.get(), theirs)), op=MPI.MIN))
            except Exception as exc:  # noqa: BLE001  (a failing way is a result)
                row["us"], row["ok"], row["error"] = None, False, f"{type(exc).__name__}: {exc}"
            if row.get("us"):
                row["GBps"] = nbytes / (row["us"] * 1e3)
            rows.append(row)
            say(f"{nbytes:>9} {way:>12} {row['us'] if row['us'] is None else round(row['us'], 3)} us "
                f"{round(row.get('GBps', 0), 1)} GB/s ok {row['ok']}" + (f" ({row['error']})" if "error" in row else ""))
    cp.cuda.Device().synchronize()
    mpi.Barrier()
    dev.layout.arm(dev.ws)  # the one-shot region back to the sentinel pattern
    cp.cuda.Device().synchronize()
    mpi.Barrier()
    say(f"\n{'bytes':>9} " + " ".join(f"{w:>12}" for w in WAYS) + "   (us per push, graph; GB/s)")
    for nbytes in sorted({r["bytes"] for r in rows}):
        cells = []
        for w in WAYS:
            r = next(r for r in rows if r["bytes"] == nbytes and r["way"] == w)
            cells.append(f"{r['us']:6.2f}/{r['GBps']:4.0f}{'' if r['ok'] else '!'}" if r.get("us") else f"{'fail':>12}")
        say(f"{nbytes:>9} " + " ".join(f"{c:>12}" for c in cells))
    say("('!': the bytes that arrived differ from the peer's source)")
    write_lab_json(comm, opts, sol, rows, "bench/push_lab.py", graph_ops=GRAPH_OPS)
    comm.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
