"""Where an eager-engine call's time goes (hpccoll/backends/cuda/engine.py, cuda/persistent.cu),
on 2 ranks:

    mpiexec -n 2 python bench/engine_lab.py [--n 2000] [--parts sysread,host,...] [--json out.json]

Each part timed per call on the host (perf_counter around one call, median of --n, then the
MAX over ranks), in one run:
- sysread:   a GPU thread's dependent loads of a mapped host word (ns per load, globaltimer);
- host:      cuStreamIsCapturing, cuStreamQuery, and the bare Python loop of a post and a check;
- echo:      host writes a mapped word, the GPU (already running, polling) sees it and writes a
             completion word back, the host sees that: the engine's signalling without the
             collective, in the engine's configuration and simpler ones (kernels/lab_engine.cu);
- engine:    Engine.call directly with count 0 (no collective) and 1 KiB, and
             Communicator.Allreduce of 1 KiB with the engine (its fast path) and without
             (launch + stream synchronize), for scale; a persistent request's Start + Wait;
             for order="stream" (the stream query first) and order="caller" (none);
- sizes:     Engine.call (order="caller") at 4-256 KiB on engines of 1, 2, 4 and 8 blocks;
- calls:     (--parts calls) per size on the default engine: Engine.call on the lab's buffers
             and on arrays of the call's size, Allreduce + synchronize on those arrays, and a
             persistent request's Start + Wait on them;
- phase:     (--parts phase) Engine.call after the host spins 0-3 us first, minus the spin:
             does the host's time before a post move the call in steps of a PCIe round trip?"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from pathlib import Path

import numpy as np


def _median_us(fn, n: int) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts[n // 10:]) * 1e6


def main() -> int:
    import cupy as cp
    from _lab import open_lab, write_lab_json

    import hpccoll
    from hpccoll.backends.cuda.driver import Module, launch_raw
    from hpccoll.backends.cuda.engine import BYTES_PER_BLOCK, DEFAULT_BLOCKS, _driver_fns
    from hpccoll.backends.cuda.nvrtc import compile_file
    from hpccoll.bench.ranks import max_over_ranks

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--json", default=None)
    ap.add_argument("--parts", default="sysread,host,echo,engine,sizes",
                    help="sections to run, of sysread,host,echo,engine,sizes,calls,phase")
    opts = ap.parse_args()
    parts = set(opts.parts.split(","))
    comm, say, sol = open_lab("engine_lab")
    mpi, dev = comm.mpi_comm, comm._backend
    lib = _driver_fns()
    mod = Module(compile_file(Path(__file__).resolve().parent / "kernels" / "lab_engine.cu", "float32", dev.arch))
    rows = []

    def record(part, what, us, **kw):
        us = max_over_ranks(mpi, us)
        rows.append({"part": part, "what": what, "us": us, **kw})
        say(f"{part:8s} {what:58s} {us:8.2f} us")

    rt = cp.cuda.runtime
    host = rt.hostAlloc(4096, 2)  # mapped
    ctypes.memset(host, 0, 4096)
    hdev = host  # UVA: the same address on the device
    words = (ctypes.c_uint64 * 16).from_address(host)
    done = ctypes.c_uint64.from_address(host + 256)
    out = cp.zeros(2, dtype=cp.uint64)
    s = cp.cuda.Stream(non_blocking=True)

    # sizes, calls, phase: every size's result is checked bitwise against the rank-order sum
    big = 64 * 1024  # floats: 256 KiB
    xb = cp.asarray(np.random.default_rng([comm.rank, 5]).standard_normal(big).astype(np.float32))
    yb = cp.empty_like(xb)
    yb.fill(0)  # CuPy's fill kernel loaded before any engine starts (lazy loading: engine.py)
    cp.cuda.get_current_stream().synchronize()
    ref_all = mpi.allgather(cp.asnumpy(xb))

    def checked_call(eng, n: int) -> bool:
        yb.fill(0)
        s.synchronize()
        cp.cuda.get_current_stream().synchronize()
        eng.call(xb.data.ptr, yb.data.ptr, n, "SUM", 0)
        ref = ref_all[0][:n].copy()
        for r in ref_all[1:]:
            ref += r[:n]
        ok = bool(np.array_equal(cp.asnumpy(yb[:n]).view(np.uint32), ref.view(np.uint32)))
        return all(mpi.allgather(ok))

    if "sysread" in parts:
        # sysread: ns per dependent load of host memory by one GPU thread
        launch_raw(mod.fn("hc_lab_sysread"), 1, 1, s.ptr, ctypes.c_void_p(hdev), ctypes.c_int(2000),
                   ctypes.c_void_p(out.data.ptr))
        s.synchronize()
        record("sysread", "GPU load of mapped host memory (dependent, 1 thread)", int(out[0].get()) / 1e3)

    if "host" in parts:
        # host-side costs
        cap = ctypes.c_int()
        lib.cuStreamIsCapturing.argtypes = [ctypes.c_void_p, ctypes.c_void_p]  # (the library asks through CuPy)
        record("host", "cuStreamIsCapturing(legacy stream)", _median_us(lambda: lib.cuStreamIsCapturing(0, ctypes.byref(cap)), opts.n))
        record("host", "cuStreamQuery(legacy stream), idle", _median_us(lambda: lib.cuStreamQuery(0), opts.n))
        record("host", "cuStreamQuery(non-blocking stream), idle", _median_us(lambda: lib.cuStreamQuery(s.ptr), opts.n))
        wv = cp.zeros(1, dtype=cp.uint64)
        lib.cuStreamWriteValue64_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
        record("host", "cuStreamWriteValue64 (non-blocking stream), host call",
               _median_us(lambda: lib.cuStreamWriteValue64_v2(s.ptr, wv.data.ptr, 1, 0), opts.n))
        s.synchronize()

        def bare():
            words[0] = 1
            words[1] = 1
            words[2] = 1
            words[3] = 1
            return done.value & 0xFF == 0
        record("host", "4 mapped stores + 1 mapped load (Python)", _median_us(bare, opts.n))

    if "echo" in parts:
        # echo: the signalling round trip, GPU already polling
        for blocks, loads, fence, nb in ((1, 1, 0, 8), (1, 4, 0, 8), (1, 4, 1, 8), (1, 4, 1, 1), (4, 4, 1, 1)):
            ctypes.memset(host, 0, 4096)
            n = opts.n
            launch_raw(mod.fn("hc_lab_echo"), blocks, 32, s.ptr, ctypes.c_void_p(hdev), ctypes.c_void_p(hdev + 256),
                       ctypes.c_int(n), ctypes.c_int(loads), ctypes.c_int(fence), ctypes.c_int(nb))
            mask = (1 << (8 * blocks)) - 1 if nb == 1 else (1 << 64) - 1
            ones = 0x0101010101010101 & mask
            ts = []
            for i in range(1, n + 1):
                want = ((i & 0xFF) * ones) & mask if nb == 1 else i
                t0 = time.perf_counter()
                for k in range(loads):
                    words[k] = i
                while done.value & mask != want:
                    pass
                ts.append(time.perf_counter() - t0)
            s.synchronize()
            record("echo", f"{blocks} block(s), {loads} doorbell word(s), fence {fence}, {nb}-byte completion",
                   statistics.median(ts[n // 10:]) * 1e6, blocks=blocks, loads=loads, fence=fence, done_bytes=nb)

    if "engine" in parts:
        # the engine itself
        x = cp.asarray(np.random.default_rng(comm.rank).standard_normal(256).astype(np.float32))
        y = cp.empty_like(x)
        comm.Allreduce(x, y)
        comm.synchronize()
        record("engine", "off: Allreduce 1 KiB + synchronize (launch)",
               _median_us(lambda: (comm.Allreduce(x, y), comm.synchronize()), opts.n))
        y.fill(0)  # CuPy's fill kernel loaded before any engine starts (lazy loading: engine.py)
        for order in ("stream", "caller"):
            # "caller": without the stream query (every timed call here follows a finished one,
            # so the caller's contract holds)
            with comm.persistent("float32", blocks=1, max_bytes=32 * 1024, order=order):
                eng = dev.engines.engines()["float32"]
                record("engine", f"order {order}, 1 block: Engine.call 1 KiB",
                       _median_us(lambda: eng.call(x.data.ptr, y.data.ptr, 256, "SUM", 0), opts.n))
            with comm.persistent("float32", order=order):
                eng = dev.engines.engines()["float32"]
                record("engine", f"order {order}: Engine.call count 0 (signalling only)",
                       _median_us(lambda: eng.call(0, 0, 0, "SUM", 0), opts.n))
                record("engine", f"order {order}: Engine.call 1 KiB",
                       _median_us(lambda: eng.call(x.data.ptr, y.data.ptr, 256, "SUM", 0), opts.n))
                y.fill(0)
                record("engine", f"order {order}: Allreduce 1 KiB + synchronize",
                       _median_us(lambda: (comm.Allreduce(x, y), comm.synchronize()), opts.n))
                plan = comm._fast["Allreduce"].plan
                record("engine", f"order {order}: the prepared call alone ({type(plan).__name__}.launch)",
                       _median_us(lambda: plan.launch(None), opts.n))
                record("engine", f"order {order}: synchronize alone",
                       _median_us(comm.synchronize, opts.n))
                fast, op = comm._fast["Allreduce"], hpccoll.SUM
                record("python", "the fast path's argument match (_FastCall.matches)",
                       _median_us(lambda: fast.matches(x, y, op, None, "auto", False), opts.n))
                record("python", "an empty call (the timer's own cost)", _median_us(lambda: None, opts.n))
                record("engine", f"order {order}: Allreduce 1 KiB, no synchronize",
                       _median_us(lambda: comm.Allreduce(x, y), opts.n))
                req = comm.Allreduce_init(x, y)
                record("engine", f"order {order}: request Start + Wait 1 KiB",
                       _median_us(lambda: (req.Start(), req.Wait()), opts.n))
                req.Free()
                ok = bool(np.allclose(cp.asnumpy(y), sum(mpi.allgather(cp.asnumpy(x))), rtol=1e-5))
                record("engine", f"order {order}: result correct: {ok}", 0.0)

    if "sizes" in parts:
        # sizes: Engine.call (order="caller") from 4 KiB to 256 KiB on engines of 1, 2, 4 and 8
        # blocks.  A call of more than one block's packs (8 KiB) is relayed by block 0 to the others
        # through device memory; one block takes it all with more packs per thread.  Every size's
        # result is checked bitwise against the rank-order sum once per engine.
        for blocks in (1, 2, 4, 8):
            cap = min(big * 4, blocks * BYTES_PER_BLOCK)
            with comm.persistent("float32", blocks=blocks, max_bytes=cap, order="caller"):
                eng = dev.engines.engines()["float32"]
                for kib in (4, 8, 16, 32, 64, 128, 256):
                    n = kib * 256
                    if n * 4 > cap:
                        continue
                    ok = checked_call(eng, n)
                    record("sizes", f"{blocks}-block engine: Engine.call {kib} KiB ({eng.blocks_for(n)} used), "
                           f"bitwise {ok}", _median_us(lambda: eng.call(xb.data.ptr, yb.data.ptr, n, "SUM", 0), opts.n),
                           blocks=blocks, bytes=n * 4, used=eng.blocks_for(n), ok=ok)

    if "calls" in parts:
        # calls: on the default engine (4 blocks, order "caller"), per size, the same Allreduce
        # three ways, interleaved: Engine.call on the lab's 256 KiB buffers, Engine.call on arrays
        # of exactly the call's size (as the bench allocates them), and Allreduce + synchronize on
        # those arrays (the bench's eager* call): where does the bench's extra time come from?
        arrays = {kib: cp.asarray(np.random.default_rng([comm.rank, kib]).standard_normal(kib * 256).astype(np.float32))
                  for kib in (1, 4, 16, 32, 64, 128)}  # (allocated before the engine starts)
        outs = {kib: cp.zeros_like(x) for kib, x in arrays.items()}
        cp.cuda.get_current_stream().synchronize()
        with comm.persistent("float32", max_bytes=DEFAULT_BLOCKS * BYTES_PER_BLOCK, order="caller"):
            eng = dev.engines.engines()["float32"]
            for kib in arrays:
                n = kib * 256
                xs, ys = arrays[kib], outs[kib]
                comm.Allreduce(xs, ys)
                comm.synchronize()
                ok = bool(np.array_equal(cp.asnumpy(ys).view(np.uint32), sum(mpi.allgather(cp.asnumpy(xs))).view(np.uint32)))
                ok = all(mpi.allgather(ok))
                req = comm.Allreduce_init(xs, ys)
                for rep in range(2):
                    record("calls", f"{kib:4d} KiB Engine.call, lab buffers (rep {rep})",
                           _median_us(lambda: eng.call(xb.data.ptr, yb.data.ptr, n, "SUM", 0), opts.n), bytes=n * 4)
                    record("calls", f"{kib:4d} KiB Engine.call, own arrays (rep {rep})",
                           _median_us(lambda: eng.call(xs.data.ptr, ys.data.ptr, n, "SUM", 0), opts.n), bytes=n * 4)
                    record("calls", f"{kib:4d} KiB Allreduce + synchronize, own arrays, bitwise {ok} (rep {rep})",
                           _median_us(lambda: (comm.Allreduce(xs, ys), comm.synchronize()), opts.n), bytes=n * 4, ok=ok)
                    record("calls", f"{kib:4d} KiB request Start + Wait, own arrays (rep {rep})",
                           _median_us(lambda: (req.Start(), req.Wait()), opts.n), bytes=n * 4)
                    # the Allreduce path in parts: which of them grows with the size?
                    record("calls", f"{kib:4d} KiB Allreduce alone (rep {rep})",
                           _median_us(lambda: comm.Allreduce(xs, ys), opts.n), bytes=n * 4)
                    fast = comm._fast["Allreduce"]
                    plan = fast.plan
                    record("calls", f"{kib:4d} KiB its plan: {type(plan).__name__}.launch(None) + synchronize (rep {rep})",
                           _median_us(lambda: (plan.launch(None), comm.synchronize()), opts.n), bytes=n * 4)
                    record("calls", f"{kib:4d} KiB the request's plan: launch(None) + synchronize (rep {rep})",
                           _median_us(lambda: (req._plan.launch(None), comm.synchronize()), opts.n), bytes=n * 4)
                    record("calls", f"{kib:4d} KiB the match alone (rep {rep})",
                           _median_us(lambda: fast.matches(xs, ys, hpccoll.SUM, None, "auto", False), opts.n),
                           bytes=n * 4)
                    record("calls", f"{kib:4d} KiB plans: Allreduce's {plan.call} nb {plan.nb}, the request's "
                           f"{req._plan.call} nb {req._plan.nb} (rep {rep})", 0.0, bytes=n * 4)
                req.Free()

    if "phase" in parts:
        # phase: Engine.call 1 KiB and 32 KiB (default engine, order "caller") after the host
        # spins X us first (X = 0 to 3 us), the call's time minus X.  A block polls its bell with
        # dependent PCIe loads, one per round trip, the first issued as it writes its completion:
        # if the host's own time between seeing that completion and posting decides which poll
        # sees the post, the call's time rises in steps of a round trip as X grows (a sawtooth
        # of the time minus X), instead of staying flat.
        def spun(fn, x_s):
            def call():
                t_end = time.perf_counter() + x_s
                while time.perf_counter() < t_end:
                    pass
                fn()
            return call

        with comm.persistent("float32", max_bytes=DEFAULT_BLOCKS * BYTES_PER_BLOCK, order="caller"):
            eng = dev.engines.engines()["float32"]
            for kib in (1, 32):
                n = kib * 256
                ok = checked_call(eng, n)
                one = lambda: eng.call(xb.data.ptr, yb.data.ptr, n, "SUM", 0)  # noqa: E731

                def locked():  # the communicator's lock, taken as its fast paths take it
                    if not comm._lock.acquire(False):
                        raise RuntimeError("lock held")
                    try:
                        one()
                    finally:
                        comm._lock.release()
                for rep in range(3):  # the communicator's lock around the call, or not, interleaved
                    record("phase", f"{kib:3d} KiB Engine.call (rep {rep})", _median_us(one, opts.n), bytes=n * 4)
                    record("phase", f"{kib:3d} KiB Engine.call inside the communicator's lock (rep {rep})",
                           _median_us(locked, opts.n), bytes=n * 4)
                for x_ns in range(0, 3001, 150):
                    t = _median_us(spun(one, x_ns * 1e-9), opts.n) - x_ns / 1000
                    record("phase", f"{kib:3d} KiB Engine.call after {x_ns:5d} ns of host spin, minus the spin, bitwise {ok}",
                           t, bytes=n * 4, spin_ns=x_ns, ok=ok)

    rt.freeHost(host)
    write_lab_json(comm, opts, sol, rows, "bench/engine_lab.py",
                         timing="host perf_counter per call, median of n (first 10% dropped), MAX over ranks")
    comm.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
