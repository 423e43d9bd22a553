"""The speed-of-light (SoL) model of the paper, measured in the same run as the collectives:

    SoL = 2 L_L2_RTT + L_remote_store,   L_remote_store = (L_pingpong - 2 L_L2_RTT) / 2

with L_L2_RTT the latency of one __threadfence() and L_pingpong a GPU <-> GPU flag round trip
(cuda/sol.cu), plus a peer-copy bandwidth term for large messages and the graph column's floor:
a CUDA graph of launches of a kernel that does nothing, or one peer store.  The model leaves
out the kernel launch: it is the bound of the in-kernel column."""
from __future__ import annotations

import ctypes
import statistics

from .ranks import Skip, guarded, max_over_ranks
from .sizes import MiB
from .timing import sync_all, time_events, time_graph

FENCES = 10000        # __threadfence() per timed loop
PINGPONGS = 1000      # round trips per timed ping-pong
TRIES = 5             # timed loops of each; the median is kept


def measure_sol(comm, log) -> dict:
    """The model's terms on this machine (collective; CUDA backend).  Run it before any
    collective: its copy writes into every peer's two-shot region, re-armed afterwards."""
    import cupy

    dev, mpi = comm.backends.main, comm.mpi_comm
    res: dict = {}
    mod = guarded(mpi, lambda: _load_sol(dev), "sol.cu: ")
    # Every local step goes through guarded: ranks agree it worked before the next collective,
    # so one rank's failure skips the model on all ranks instead of hanging them.
    # (collective: compiles collectives.cu (float32) for the barrier's Args on every rank)
    base_args = guarded(mpi, lambda: dev.kernels.launcher("float32", "hc_barrier", (0, 0)).args)
    s = guarded(mpi, lambda: cupy.cuda.Stream(non_blocking=True))
    out = guarded(mpi, lambda: cupy.zeros(4, dtype=cupy.uint64))

    def fence_once():  # one thread, FENCES __threadfence() in a row
        from ..backends.cuda.driver import launch_raw

        launch_raw(mod.fn("hc_sol_fence"), 1, 1, s.ptr, ctypes.c_void_p(out.data.ptr), ctypes.c_int(FENCES))
        s.synchronize()
        return int(out[0].get()) / FENCES

    fence_ns = max_over_ranks(mpi, statistics.median(guarded(mpi, fence_once) for _ in range(TRIES)))
    res["fence_ns"] = fence_ns
    if comm.size < 2:
        return res
    from .._abi import Args

    a = Args.from_buffer_copy(base_args)
    a.iters, a.timeoutNs = PINGPONGS, int(5e9)
    rt = _pingpong_ns(comm, mod, a, s, out)
    if rt:
        res.update(pingpong_roundtrip_ns=rt, one_way_ns=rt / 2, remote_store_ns=(rt - 2 * fence_ns) / 2)
        res["sol_ns"] = 2 * fence_ns + res["remote_store_ns"]
        res["sol_us"] = res["sol_ns"] / 1e3
    else:
        log("SoL: the ping-pong timed out on every try (no round trip measured)")
    res.update(_graph_floors(mpi, mod, a, log))
    res.update(_peer_copy(dev, mpi, s, log))
    return res


def _load_sol(dev):
    """cuda/sol.cu's module: node rank 0 compiles it (or finds it cached) first, the other ranks
    of the node then load it from the cache instead of compiling it at once."""
    from ..backends.cuda.driver import Module
    from ..backends.cuda.nvrtc import compile_module

    first = dev.node.Get_rank() == 0
    try:
        mod = Module(compile_module("sol.cu", "float32", dev.arch)) if first else None
    finally:
        dev.node.Barrier()  # reached by every rank of the node, also when rank 0's compile failed
    return mod or Module(compile_module("sol.cu", "float32", dev.arch))


def _pingpong_ns(comm, mod, a, s, out) -> float | None:
    """Median round trip between ranks 0 and 1 in ns (rank 0 times it; None if every try timed
    out).  Both reset their own word first.  Rank 0 starts ~4 ms later (20000 fences first on
    its stream), so rank 1 has read its base word before rank 0's first store lands (sol.cu
    reads the base, then polls)."""
    import cupy

    from .._abi import const
    from ..backends.cuda.driver import launch_raw

    dev, mpi, rank = comm.backends.main, comm.mpi_comm, comm.rank
    word = dev.ws.peers[rank] + const("HC_OFF_PINGPONG")

    def reset():
        cupy.cuda.runtime.memset(word, 0, 8)
        out.fill(0)
        cupy.cuda.runtime.deviceSynchronize()

    def pingpong():
        if rank == 0:
            launch_raw(mod.fn("hc_sol_fence"), 1, 1, s.ptr, ctypes.c_void_p(out.data.ptr + 8), ctypes.c_int(20000))
        if rank in (0, 1):
            launch_raw(mod.fn("hc_sol_pingpong"), 1, 1, s.ptr, a, ctypes.c_void_p(out.data.ptr))
        s.synchronize()
        return int(out[0].get())

    rts = []
    for _ in range(TRIES):
        guarded(mpi, reset)
        mpi.Barrier()
        total = guarded(mpi, pingpong)
        rts.append(mpi.bcast(total / PINGPONGS if rank == 0 and total > 0 else None, root=0))
    rts = [r for r in rts if r]
    return statistics.median(rts) if rts else None


def _graph_floors(mpi, mod, a, log) -> dict:
    """The kernel boundary, the graph column's floor: µs per launch in a CUDA graph of an empty
    kernel and of one that also stores to a peer (sol.cu), 256 threads like a small collective,
    with and without programmatic dependent launch (floor_{empty,store}[_pdl]_us)."""
    from ..backends.cuda.driver import Launcher

    res = {}
    for name in ("empty", "store"):
        for pdl in (True, False):
            lau = Launcher(mod.fn(f"hc_sol_{name}"), a, pdl=pdl)
            key = f"floor_{name}{'_pdl' if pdl else ''}_us"
            try:
                res[key] = time_graph(mpi, lambda st: lau(1, 256, st.ptr), 2000)
            except Skip as exc:
                log(f"SoL: {key} skipped: {exc}")
    return res


def _peer_copy(dev, mpi, s, log) -> dict:
    """Peer-copy bandwidth: every rank copies its own two-shot region into the next rank's at
    once (both hold the idle sentinel pattern); every sentinel region is re-armed afterwards."""
    import cupy

    n = mpi.Get_size()
    layout = dev.layout
    nbytes = min(layout.sub_twoshot * 2 * n, 16 * MiB)
    src, dst = dev.ws.peers[mpi.Get_rank()] + layout.ts1, dev.ws.peers[(mpi.Get_rank() + 1) % n] + layout.ts1

    def copy():
        cupy.cuda.runtime.memcpyAsync(dst, src, nbytes, 4, s.ptr)  # 4: cudaMemcpyDefault

    res = {}
    try:
        guarded(mpi, lambda: (copy(), s.synchronize()))
        t_ns = time_events(mpi, s, copy, 1, 4) * 1e3
        res.update(copy_bytes=nbytes, copy_ns=t_ns, bw_GBps=nbytes / t_ns)
    except Skip as exc:
        log(f"SoL: peer-copy bandwidth skipped: {exc}")
    finally:
        # every rank's sentinel regions back to the idle pattern before any collective
        sync_all(mpi, True)
        guarded(mpi, lambda: layout.arm(dev.ws))
        sync_all(mpi, True)
    return res


def sol_us_for(sol: dict, nbytes: int) -> float | None:
    """The model's bound for a message of `nbytes`: SoL + nbytes / peer-copy bandwidth."""
    if not sol or "sol_us" not in sol:
        return None
    bw = sol.get("bw_GBps")
    return sol["sol_us"] + (nbytes / bw / 1e3 if bw else 0.0)
