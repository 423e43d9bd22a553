"""`hpccoll bench` / `hpccoll tune`: the latency suite, the speed-of-light model, baselines.

    mpiexec -n N hpccoll bench allreduce [--sizes 8:64M] [--dtype float32] [--algorithms all]
                                         [--iters K] [--deterministic] [--baselines]
                                         [--json out.json] [--plot out.png]

Per (size, algorithm) four latencies per op, in µs (median over repetitions, then the MAX
over ranks of each rank's median; every timed region starts after an MPI barrier, a device
synchronize and - on GPUs - a device barrier kernel on the timed stream, so that both GPUs
start the timed work within a microsecond of each other: without it the host-side skew of
the MPI barrier (tens of µs) lands in the first op and inflates per-op figures):

  eager           one Python call + stream synchronize per iteration (perf_counter)
  eager_persistent  (--persistent) the same with the eager engine running (hpccoll/_engine.py):
                  Allreduce rows of 'auto' / 'oneshot_ll' up to the engine's 256 KiB
  eager_request   (--persistent) the same call as a persistent request (Allreduce_init once,
                  then Start + Wait per iteration: MPI-4's persistent collectives), engine running
                  (--engine-order caller: the engine skips its stream query, the bench having
                  synchronized before every call: start_persistent's order="caller")
  graph           G back-to-back calls captured in a CUDA graph, R replays timed with events
                  (hpccoll: one-shot calls captured back to back run as one node: hpccoll/_fuse.py)
  graph_unfused   (hpccoll one-shot rows) the same graph with the capture fusion off: a kernel
                  node per call, as the baselines have
  graph_group     one group (Communicator.group) of G Allreduce calls into G outputs, captured
                  in a CUDA graph (hpccoll fuses them; NCCL: an NCCL group), up to 4 MiB
  in_kernel       collectives inside one kernel launch (hpccoll algorithms only): the slope
                  between launches of K and 4K of them, so the launch's own cost drops out
  blocking        graph of (op, device barrier) minus a graph of barriers alone (`barrier_us`)

Without a GPU (host backend) only `eager` runs, algorithm "mpi".  Every GPU-only piece
(SoL model, graphs, baselines) that fails is skipped with its reason printed and recorded in
the JSON (`skipped`), never crashing the sweep: ranks agree on success before timing, so
one rank's failure cannot leave the others waiting in a kernel."""
from __future__ import annotations

import ctypes
import datetime
import functools
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import types

import numpy as np

GRAPH_OPS = 20          # collectives per captured graph (G)
REPS = 5                # timed repetitions per mode; the median is reported
_ALIGN = None           # align(stream_handle): device barrier queued before every timed region
KiB, MiB = 1024, 1024 * 1024
ALLREDUCE_ALGORITHMS = ("oneshot_sentinel", "oneshot_ll", "twoshot_sentinel", "twoshot_ll", "twoshot_ll128")
ALGORITHMS_OF = {"allreduce": ALLREDUCE_ALGORITHMS, "bcast": ("ll",), "allgather": ("ll",),
                 "reduce_scatter": ("sentinel", "ll")}
BASELINES = ("nccl", "torch_one_shot", "torch_two_shot", "mpi")
COLLECTIVE_CALL = {"allreduce": "Allreduce", "bcast": "Bcast", "allgather": "Allgather",
                   "reduce_scatter": "Reduce_scatter_block"}
ROW_KEYS = ("collective", "algorithm", "dtype", "bytes", "count", "eager_us", "eager_persistent_us",
            "eager_request_us",
            "graph_us", "graph_unfused_us", "graph_group_us", "in_kernel_us", "blocking_us", "barrier_us", "ok")


# -- command line ------------------------------------------------------------------------

_UNITS = {"": 1, "B": 1, "K": KiB, "KB": KiB, "KIB": KiB, "M": MiB, "MB": MiB, "MIB": MiB,
          "G": 1024 * MiB, "GB": 1024 * MiB, "GIB": 1024 * MiB}


def parse_size(text: str) -> int:
    """'8' -> 8, '4K' -> 4096, '64M' -> 67108864 (binary units; KiB/MB spellings accepted)."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"size {text!r}: use a number of bytes with an optional K, M or G suffix (e.g. 64K)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_sizes(spec: str) -> list[int]:
    """'8:64M' = powers of two from 8 B to 64 MiB; '4K,64K,1M' = exactly those."""
    if ":" in spec:
        lo_s, hi_s = spec.split(":", 1)
        lo, hi = parse_size(lo_s), parse_size(hi_s)
        if lo <= 0 or hi < lo:
            raise ValueError(f"sizes {spec!r}: use LO:HI with 0 < LO <= HI (e.g. 8:64M)")
        out, s = [], lo
        while s <= hi:
            out.append(s)
            s *= 2
        return out
    sizes = [parse_size(p) for p in spec.split(",") if p.strip()]
    if not sizes or min(sizes) <= 0:
        raise ValueError(f"sizes {spec!r}: give positive sizes, e.g. 4K,64K,1M or 8:64M")
    return sizes


def fmt_bytes(n: int) -> str:
    for unit, div in (("G", 1024 * MiB), ("M", MiB), ("K", KiB)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


# -- small helpers ---------------------------------------------------------------------------

def say(rank: int, *msg) -> None:
    if rank == 0:
        print(*msg, flush=True)


def _agree(mpi_comm, ok: bool) -> bool:
    """True only when every rank succeeded (collective)."""
    from mpi4py import MPI

    return bool(mpi_comm.allreduce(1 if ok else 0, op=MPI.MIN))


def _max(mpi_comm, t):
    """MAX over ranks of each rank's time (None if any rank has none)."""
    vals = mpi_comm.allgather(t)
    return None if any(v is None for v in vals) else max(vals)


def _err(exc: BaseException) -> str:
    text = f"{exc.__class__.__name__}: {exc}".splitlines()[0][:300]
    if isinstance(exc, SyntaxError) and "null bytes" in text:
        import traceback

        where = "; ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
                          for f in traceback.extract_tb(exc.__traceback__)[-3:])
        text += f" (raised in {where}; {_nul_files()})"
    return text


@functools.lru_cache(maxsize=1)
def _nul_files(pkg: str = "torch") -> str:
    """Which of pkg's .py files read back with NUL bytes in this process now (importlib drops
    its own frames, so the failing import does not name its file)."""
    import importlib.util

    spec = importlib.util.find_spec(pkg)
    bad, n = [], 0
    for root in (spec.submodule_search_locations or []) if spec else []:
        for d, _, files in os.walk(root):
            for f in files:
                if f.endswith(".py"):
                    n += 1
                    with open(os.path.join(d, f), "rb") as fh:
                        if b"\0" in fh.read():
                            bad.append(os.path.relpath(os.path.join(d, f), root))
    return f"{len(bad)} of {n} {pkg} .py files read back with NUL bytes now: {bad[:5]}"


class Skip(Exception):
    """A mode or baseline that cannot run here (the message says why)."""


# -- buffers and references ----------------------------------------------------------------

class Case:
    """Buffers of one (collective, size) on one rank, the call, and its reference check."""

    def __init__(self, collective: str, nbytes: int, dtype: str, rank: int, size: int, xp):
        from ..ops import np_dtype

        self.collective, self.rank, self.size, self.xp = collective, rank, size, xp
        self.np_dtype = np_dtype(dtype)
        esize = self.np_dtype.itemsize
        self.count = max(1, nbytes // esize)
        self.nbytes = self.count * esize
        rng = np.random.default_rng([rank, self.count, 12345])
        n = size
        host_in = {"allreduce": self.count, "bcast": self.count, "allgather": self.count,
                   "reduce_scatter": self.count * n}[collective]
        if self.np_dtype.kind == "f" or self.np_dtype.itemsize == 2 and self.np_dtype.kind == "V":
            base = rng.uniform(-1, 1, host_in)
        else:
            base = rng.integers(-100, 100, host_in)
        self.host_send = base.astype(self.np_dtype)
        out_n = {"allreduce": self.count, "bcast": self.count, "allgather": self.count * n,
                 "reduce_scatter": self.count}[collective]
        self.send = self._to_dev(self.host_send)
        self.recv = self.send if collective == "bcast" else self._to_dev(np.zeros(out_n, self.np_dtype))
        if collective == "bcast" and rank != 0:
            self.recv[...] = self._to_dev(np.zeros(out_n, self.np_dtype))

    def _to_dev(self, a):
        if self.xp is np:
            return a.copy()
        return self.xp.asarray(a)

    def prepare(self):
        """hpccoll._validate.Call of this case (for the in-kernel mode)."""
        from .. import SUM
        from .._validate import prepare

        if self.collective == "bcast":
            return prepare("Bcast", self.size, None, self.recv, root=0)
        op = SUM
        return prepare(COLLECTIVE_CALL[self.collective], self.size, self.send, self.recv, op=op)

    def call(self, comm, algorithm=None, deterministic=None, stream=None):
        self.bound(comm, algorithm, deterministic)(stream=stream)

    def bound(self, comm, algorithm=None, deterministic=None):
        """The blocking call as a user writes it, bound once: comm.Allreduce(send, recv), with
        the keywords only where they differ from the communicator's own policy (the eager
        columns time this, not the bench's own argument handling)."""
        kw = {}
        if algorithm is not None and algorithm != comm.algorithm:
            kw["algorithm"] = algorithm
        if deterministic is not None and bool(deterministic) != comm.deterministic:
            kw["deterministic"] = deterministic
        args = {"allreduce": (comm.Allreduce, self.send, self.recv),
                "bcast": (comm.Bcast, self.recv),
                "allgather": (comm.Allgather, self.send, self.recv),
                "reduce_scatter": (comm.Reduce_scatter_block, self.send, self.recv)}[self.collective]
        return functools.partial(*args, **kw)

    def reset(self, full: bool = False) -> None:
        """Bcast works in place: clear the receivers' buffers so every check sees a fresh result
        (full: every collective's output)."""
        if self.collective == "bcast":
            if self.rank != 0:
                self.recv[...] = 0
        elif full:
            self.recv[...] = 0

    def host_result(self, arr=None) -> np.ndarray:
        a = self.recv if arr is None else arr
        if self.xp is np:
            return np.asarray(a)
        if hasattr(a, "get"):
            return a.get()
        return np.asarray(a.cpu())  # torch

    def check(self, mpi_comm, result: np.ndarray) -> bool:
        """Result against a float64 reference built from every rank's gathered input (collective)."""
        allin = mpi_comm.allgather(self.host_send)
        x = np.stack([a.astype(np.float64) for a in allin])  # [n, host_in]
        n = self.size
        if self.collective == "allreduce":
            ref = x.sum(axis=0)
        elif self.collective == "bcast":
            ref = x[0]
        elif self.collective == "allgather":
            ref = x.reshape(-1)
        else:
            ref = x.reshape(n, n, self.count)[:, self.rank, :].sum(axis=0)
        res = np.asarray(result).astype(np.float64).reshape(-1)
        eps = {8: 1e-12, 4: 1e-5, 2: 1e-2}.get(self.np_dtype.itemsize, 1e-5)
        if self.np_dtype.itemsize == 2 and self.np_dtype.name != "float16":
            eps = 2e-2  # bfloat16
        tol = eps * n if self.collective in ("allreduce", "reduce_scatter") else eps
        ok = res.shape == ref.shape and bool(np.allclose(res, ref, rtol=tol, atol=tol * n))
        return _agree(mpi_comm, ok)


# -- timing ------------------------------------------------------------------------------

def _sync_all(mpi_comm, gpu: bool, device_wide: bool = True) -> None:
    """Device work done, then an MPI barrier.  device_wide=False: the current stream only (while
    an eager engine runs, a device synchronize would wait for the engine forever)."""
    if gpu:
        import cupy

        if device_wide:
            cupy.cuda.runtime.deviceSynchronize()
        else:
            cupy.cuda.get_current_stream().synchronize()
    mpi_comm.Barrier()


def _align(stream_handle: int) -> None:
    """Queue a device barrier on the stream about to be timed (no-op without one)."""
    if _ALIGN is not None:
        _ALIGN(stream_handle)


EAGER_WARMUP = 100  # untimed calls before eager timing


def time_eager(mpi_comm, fn, sync, iters: int, gpu: bool, device_wide: bool = True) -> float:
    """Median µs of one blocking call (fn(); sync()), MAX over ranks, after EAGER_WARMUP calls
    (3 until f7a28c3: there the eager engine's column read 9.8-10.9 us at 128 B-1 KiB while
    bench/engine_lab.py, warm after thousands of calls, read 7.9 for the same call in the same run)."""
    for _ in range(min(EAGER_WARMUP, iters)):
        fn()
        sync()
    _sync_all(mpi_comm, gpu, device_wide)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return _max(mpi_comm, statistics.median(times) * 1e6)


def _cupy_graph(fn_on_stream, ops: int):
    """Capture `ops` calls of fn_on_stream(s) into a CUDA graph on a fresh stream."""
    import cupy

    s = cupy.cuda.Stream(non_blocking=True)
    fn_on_stream(s)  # warm up on this stream before capture (the first call compiles)
    s.synchronize()
    with s:
        s.begin_capture()
        try:
            for _ in range(ops):
                fn_on_stream(s)
        except BaseException:
            try:
                s.end_capture()
            except Exception:  # noqa: BLE001
                pass
            raise
        g = s.end_capture()
    g.launch(s)  # one untimed replay (uploads the graph)
    s.synchronize()
    return g, s


def _time_events(mpi_comm, stream, launch, ops_per_launch: int, launches: int) -> float:
    """Median over REPS of event time / (launches * ops_per_launch), in µs; MAX over ranks."""
    import cupy

    per = []
    for _ in range(REPS):
        _sync_all(mpi_comm, True)
        _align(stream.ptr)
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(stream)
        for _ in range(launches):
            launch()
        e1.record(stream)
        e1.synchronize()
        per.append(cupy.cuda.get_elapsed_time(e0, e1) * 1e3 / (launches * ops_per_launch))
    return _max(mpi_comm, statistics.median(per))


def in_kernel_slope(mpi_comm, stream, launch_k, k: int) -> float:
    """Per-op µs inside one launch without the launch's own cost: loops of K and 4K collectives,
    timed like every mode (_time_events), and the slope (T(4K) - T(K)) / 3K.  Divided by K
    alone, one launch of K = 100 carried the host's launch call and the kernel's set-up, start
    and end: 0.1-0.15 us per op more than the slope (2xH200, 7910a12: one-shot LL 1.02-1.11 us
    at 128 B-4 KiB in the bench, 0.86-0.93 with K = 1000 in bench/latency_lab.py)."""
    t1 = _time_events(mpi_comm, stream, lambda: launch_k(k), k, 1) * k
    t4 = _time_events(mpi_comm, stream, lambda: launch_k(4 * k), 4 * k, 1) * 4 * k
    return (t4 - t1) / (3 * k)


def time_graph(mpi_comm, fn_on_stream, iters: int, *, check=None, calls: int = GRAPH_OPS) -> float:
    """Per-op µs of a graph of GRAPH_OPS ops (`calls` calls of fn_on_stream: one call may issue
    several ops, a group all of them), replayed max(1, iters // GRAPH_OPS) times.
    check(g, s), if given, runs after capture on every rank and raises when the replay is wrong."""
    g = s = None
    why = None
    try:
        g, s = _cupy_graph(fn_on_stream, calls)
        if check is not None:
            check(g, s)
    except Exception as exc:  # noqa: BLE001
        why = _err(exc)
    whys = mpi_comm.allgather(why)
    if any(whys):
        raise Skip("graph capture failed: " + "; ".join(f"rank {r}: {w}" for r, w in enumerate(whys) if w))
    return _time_events(mpi_comm, s, lambda: g.launch(s), GRAPH_OPS, max(1, iters // GRAPH_OPS))


def _rerun_checks(mpi_comm, case, rerun, wait, outs=None) -> list:
    """Zero the outputs (the case's own, or `outs`), rerun(), wait(), then check each output
    against the reference; this rank's results (collective: every output is checked on every
    rank)."""
    import cupy

    if outs is None:
        case.reset(full=True)
    else:
        for out in outs:
            out[...] = 0
    cupy.cuda.Device().synchronize()
    rerun()
    wait()
    return [case.check(mpi_comm, case.host_result(out)) for out in (outs or [None])]


GROUP_MAX_BYTES = 4 << 20  # the group mode's largest size (20 outputs of it are allocated)


def time_graph_group(comm, case, iters: int, **kw) -> float:
    """graph_group_us: per-op µs of a graph holding ONE group (Communicator.group) of GRAPH_OPS
    Allreduce calls, each from the case's input into an output of its own (a group's calls must
    not overlap each other's outputs).  hpccoll fuses them into launches of up to 32 calls; NCCL
    runs them as an NCCL group.  Checked after capture: every output of one replay."""
    if case.collective != "allreduce" or case.nbytes > GROUP_MAX_BYTES:
        raise Skip(f"allreduce up to {fmt_bytes(GROUP_MAX_BYTES)} only")
    import cupy

    mpi = comm.mpi_comm
    outs = getattr(case, "group_outs", None)
    if outs is None:
        outs = case.group_outs = [cupy.empty_like(case.recv) for _ in range(GRAPH_OPS)]

    def group(s):
        with comm.group():
            for out in outs:
                comm.Allreduce(case.send, out, stream=s, **kw)

    def check(g, s):
        oks = _rerun_checks(mpi, case, lambda: g.launch(s), s.synchronize, outs)
        if not all(oks):
            raise RuntimeError(f"wrong result in {oks.count(False)} of {len(oks)} outputs after a group replay")

    return time_graph(mpi, group, iters, check=check, calls=1)


# -- speed of light ------------------------------------------------------------------------



def open_lab(name: str):
    """A lab script's start (bench/latency_lab.py, bench/bw_lab.py): a 2-rank CUDA
    Communicator, a print on rank 0, the SoL model measured first (before any collective: see
    measure_sol), and every timed region aligned by a device barrier.  -> (comm, say, sol)."""
    import hpccoll

    global _ALIGN
    comm = hpccoll.Communicator(backend="cuda")
    if comm.size != 2:
        raise SystemExit(f"{name}: run with exactly 2 ranks (mpiexec -n 2)")

    log = functools.partial(say, comm.rank)
    sol = measure_sol(comm, log)
    log(f"SoL {sol.get('sol_us')} us (fence {sol.get('fence_ns')} ns, ping-pong {sol.get('pingpong_roundtrip_ns')} ns); "
        f"peer copy {sol.get('bw_GBps')} GB/s; graph floor with one peer store {sol.get('floor_store_pdl_us')} us")
    _ALIGN = lambda h: comm._backend.barrier(stream=h, sync=False)  # noqa: E731
    return comm, log, sol


def measure_sol(comm, log) -> dict:
    """The paper's model, measured here: SoL = 2 L_L2_RTT + (L_pingpong - 2 L_L2_RTT) / 2,
    plus a peer-copy bandwidth term.  Must run before any collective: the bandwidth copy
    writes into the peers' two-shot region, which is re-armed (sentinel) afterwards."""
    import cupy

    from .._abi import Args, const
    from ..backends.cuda.driver import Launcher, Module, launch_raw
    from ..backends.cuda.nvrtc import compile_module

    dev, mpi = comm._backend, comm.mpi_comm
    rank, n = comm.rank, comm.size
    res: dict = {}
    why = mod = None

    def build():
        m = Module(compile_module("sol.cu", "float32", dev.arch))
        return m, m.fn("hc_sol_fence"), m.fn("hc_sol_pingpong"), m.fn("hc_sol_empty"), m.fn("hc_sol_store")

    # node rank 0 compiles (or finds the cache) first; the others then load from the cache
    for first in (True, False):
        if (dev.node.Get_rank() == 0) == first:
            try:
                mod, f_fence, f_pp, f_empty, f_store = build()
            except Exception as exc:  # noqa: BLE001
                why = _err(exc)
        if first:
            dev.node.Barrier()
    whys = mpi.allgather(why)
    if any(whys):
        raise Skip("sol.cu: " + "; ".join(f"rank {r}: {w}" for r, w in enumerate(whys) if w))
    # collective: compiles collectives.cu (float32) for the barrier's Args on every rank
    base_args = _guarded(mpi, lambda: dev.kernels.launcher("float32", "hc_barrier", (0, 0)).args)

    # Every step that runs locally goes through _guarded: ranks agree it worked before the next
    # collective, so one rank's failure skips the model on all ranks instead of hanging them.
    s = _guarded(mpi, lambda: cupy.cuda.Stream(non_blocking=True))
    out = _guarded(mpi, lambda: cupy.zeros(4, dtype=cupy.uint64))

    # L_L2_RTT: one thread, `iters` __threadfence() in a row
    iters = 10000

    def fence_once():
        launch_raw(f_fence, 1, 1, s.ptr, ctypes.c_void_p(out.data.ptr), ctypes.c_int(iters))
        s.synchronize()
        return int(out[0].get()) / iters

    fences = [_guarded(mpi, fence_once) for _ in range(5)]
    fence_ns = _max(mpi, statistics.median(fences))
    res["fence_ns"] = fence_ns
    if n < 2:
        return res

    # Ping-pong between ranks 0 and 1 (rank 0 times it).  Both reset their own word first.
    # Rank 0 starts ~4 ms later (20000 fences first on its stream), so rank 1 has read its
    # base word before rank 0's first store lands (sol.cu reads the base, then polls).
    a = Args()
    ctypes.memmove(ctypes.addressof(a), ctypes.addressof(base_args), ctypes.sizeof(Args))
    pp_iters = 1000
    a.iters, a.timeoutNs = pp_iters, int(5e9)
    word = dev.ws.peers[rank] + const("HC_OFF_PINGPONG")

    def reset():
        cupy.cuda.runtime.memset(word, 0, 8)
        out.fill(0)
        cupy.cuda.runtime.deviceSynchronize()

    def pingpong():
        if rank == 0:
            launch_raw(f_fence, 1, 1, s.ptr, ctypes.c_void_p(out.data.ptr + 8), ctypes.c_int(20000))
        if rank in (0, 1):
            launch_raw(f_pp, 1, 1, s.ptr, a, ctypes.c_void_p(out.data.ptr))
        s.synchronize()
        return int(out[0].get())

    rts = []
    for _ in range(5):
        _guarded(mpi, reset)
        mpi.Barrier()
        total = _guarded(mpi, pingpong)
        rts.append(mpi.bcast(total / pp_iters if rank == 0 and total > 0 else None, root=0))
    rts = [r for r in rts if r]
    if rts:
        rt = statistics.median(rts)
        res.update(pingpong_roundtrip_ns=rt, one_way_ns=rt / 2, remote_store_ns=(rt - 2 * fence_ns) / 2)
        res["sol_ns"] = 2 * fence_ns + res["remote_store_ns"]
        res["sol_us"] = res["sol_ns"] / 1e3
    else:
        log("SoL: the ping-pong timed out on every try (no round trip measured)")

    # The kernel boundary, the graph column's floor: GRAPH_OPS launches in a CUDA graph of an
    # empty kernel and of one that also stores to a peer (sol.cu), 256 threads like a small
    # collective, with and without programmatic dependent launch.
    for name, fn in (("empty", f_empty), ("store", f_store)):
        for pdl in (True, False):
            lau = Launcher(fn, a, pdl=pdl)
            key = f"floor_{name}{'_pdl' if pdl else ''}_us"
            try:
                res[key] = time_graph(mpi, lambda st: lau(1, 256, st.ptr), 2000)
            except Skip as exc:
                log(f"SoL: {key} skipped: {exc}")

    # Bandwidth: every rank copies its own two-shot region into the next rank's at once
    # (both hold the idle sentinel pattern; every region is re-armed afterwards anyway).
    L = dev.layout
    nbytes = min(L.sub_twoshot * 2 * n, 16 * MiB)
    src, dst = dev.ws.peers[rank] + L.ts1, dev.ws.peers[(rank + 1) % n] + L.ts1

    def copy_warm():
        cupy.cuda.runtime.memcpyAsync(dst, src, nbytes, 4, s.ptr)  # 4: cudaMemcpyDefault
        s.synchronize()

    try:
        _guarded(mpi, copy_warm)
        copies = 4
        t_ns = _time_events(mpi, s, lambda: cupy.cuda.runtime.memcpyAsync(dst, src, nbytes, 4, s.ptr),
                            1, copies) * 1e3
        res.update(copy_bytes=nbytes, copy_ns=t_ns, bw_GBps=nbytes / t_ns)
    except Skip as exc:
        log(f"SoL: peer-copy bandwidth skipped: {exc}")
    finally:
        # re-arm: every rank's sentinel regions back to the idle pattern before any collective
        _sync_all(mpi, True)
        _guarded(mpi, dev._init_regions)
        _sync_all(mpi, True)
    return res


def sol_us_for(sol: dict, nbytes: int) -> float | None:
    if not sol or "sol_us" not in sol:
        return None
    bw = sol.get("bw_GBps")
    return sol["sol_us"] + (nbytes / bw / 1e3 if bw else 0.0)


# -- baselines ---------------------------------------------------------------------------

class TorchSymm:
    """torch symmetric-memory one-shot / two-shot allreduce in the same processes."""

    def __init__(self, comm, dtype: str):
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        os.environ["NCCL_NVLS_ENABLE"] = "0"
        import torch
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        self.torch, self.dist, self.symm = torch, dist, symm_mem
        mpi = comm.mpi_comm
        dev = comm.device
        torch.cuda.set_device(dev)
        self.device = torch.device("cuda", dev)
        port = None
        if comm.rank == 0:
            with socket.socket() as sk:
                sk.bind(("127.0.0.1", 0))
                port = sk.getsockname()[1]
        port = mpi.bcast(port, root=0)
        self.owned = False
        if not dist.is_initialized():
            kw = dict(init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size,
                      timeout=datetime.timedelta(seconds=120))
            try:
                dist.init_process_group("nccl", device_id=self.device, **kw)
            except TypeError:
                dist.init_process_group("nccl", **kw)
            self.owned = True
        self.group = dist.group.WORLD.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            try:
                symm_mem.enable_symm_mem_for_group(self.group)
            except Exception:  # noqa: BLE001 - newer torch: not needed
                pass
        want = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        self.dtype = want.get(dtype, torch.bfloat16)
        self.dtype_name = str(self.dtype).replace("torch.", "")
        self._tick = torch.zeros(1, device=self.device)

    def tensor(self, count: int, rank: int):
        t = self.symm.empty(count, device=self.device, dtype=self.dtype)
        self.symm.rendezvous(t, self.group)
        g = self.torch.Generator(device="cpu").manual_seed(1000 + rank)
        t.copy_(self.torch.rand(count, generator=g, dtype=self.torch.float32).to(self.dtype))
        return t

    def op(self, which: str, t):
        ops = self.torch.ops.symm_mem
        if which == "torch_one_shot":
            return lambda: ops.one_shot_all_reduce(t, "sum", self.group)
        return lambda: ops.two_shot_all_reduce_(t, "sum", self.group)

    def sync(self) -> None:
        self.torch.cuda.current_stream().synchronize()

    def time_graph(self, mpi_comm, fn, iters: int) -> float:
        torch = self.torch
        why = None
        g = None
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(GRAPH_OPS):
                    fn()
            g.replay()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            why = _err(exc)
        whys = mpi_comm.allgather(why)
        if any(whys):
            raise Skip("torch graph capture failed: " + "; ".join(w for w in whys if w))
        launches = max(1, iters // GRAPH_OPS)
        per = []
        for _ in range(REPS):
            torch.cuda.synchronize()
            mpi_comm.Barrier()
            if _ALIGN is None:  # before hpccoll opens (torch_baselines_first): NCCL aligns the streams
                self.dist.all_reduce(self._tick)
            _align(torch.cuda.current_stream().cuda_stream)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(launches):
                g.replay()
            e1.record()
            e1.synchronize()
            per.append(e0.elapsed_time(e1) * 1e3 / (launches * GRAPH_OPS))
        return _max(mpi_comm, statistics.median(per))

    def close(self) -> None:
        if self.owned:
            try:
                self.dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


# -- the sweep ---------------------------------------------------------------------------

def algorithm_list(collective: str, spec: str, dtype: str, deterministic: bool, peer_atomics: bool,
                   on_gpu: bool) -> list[str]:
    """The hpccoll algorithms a sweep runs (host backend: just 'mpi')."""
    from .. import policy as select

    if not on_gpu:
        return ["mpi"]
    call = COLLECTIVE_CALL[collective]
    op = "SUM" if collective in ("allreduce", "reduce_scatter") else None
    if spec == "all":
        out = []
        for a in ALGORITHMS_OF[collective]:
            try:
                select.validate(a, call, dtype, op, deterministic, peer_atomics)
            except Exception:  # noqa: BLE001 - not valid for this dtype / policy / machine
                continue
            out.append(a)
        return out + ["auto"]
    return [a.strip() for a in spec.split(",") if a.strip()]


def _row(collective, algorithm, dtype, case, **kw) -> dict:
    row = {"collective": collective, "algorithm": algorithm, "dtype": dtype, "bytes": case.nbytes,
           "count": case.count, **dict.fromkeys(k for k in ROW_KEYS if k.endswith("_us")), "ok": None}
    row.update(kw)
    return row


def _mode(row: dict, key: str, fn, log) -> None:
    """Run one timing mode; a Skip / failure records the reason instead of a number."""
    try:
        row[key] = fn()
    except Skip as exc:
        row.setdefault("skipped", {})[key] = str(exc)
        log(f"  {row['algorithm']} {fmt_bytes(row['bytes'])}: {key} skipped: {exc}")


def _guarded(mpi_comm, fn):
    """fn() on every rank; raise Skip on all ranks when it failed on any."""
    why, val = None, None
    try:
        val = fn()
    except Exception as exc:  # noqa: BLE001
        why = _err(exc)
    whys = mpi_comm.allgather(why)
    if any(whys):
        raise Skip("; ".join(f"rank {r}: {w}" for r, w in enumerate(whys) if w))
    return val


def bench_hpccoll(comm, case, algo, opts, gpu: bool, log) -> dict:
    """One (size, algorithm) row of hpccoll itself (or 'mpi' on the host backend)."""
    mpi = comm.mpi_comm
    det = opts.deterministic
    row = _row(opts.collective, algo, opts.dtype, case)
    sync = (lambda: comm.synchronize()) if gpu else (lambda: None)
    flat = comm.backend == "cuda"  # single node: kernel-level modes apply; hierarchical: eager, graph
    if flat and algo == "auto":
        try:
            call = case.prepare()
            op = call.op.name if call.op else None
            row["resolved"] = comm._backend.resolve(call.name, call.recv.dtype, op, call.send.nbytes, det, "auto")
        except Exception:  # noqa: BLE001
            pass
    # correctness once (also compiles the kernel)
    try:
        case.reset()
        _guarded(mpi, lambda: (case.call(comm, algo, det), sync()))
        row["ok"] = case.check(mpi, case.host_result())
    except Skip as exc:
        row["ok"] = False
        row.setdefault("skipped", {})["all"] = str(exc)
        log(f"  {algo} {fmt_bytes(case.nbytes)}: failed: {exc}")
        return row
    _mode(row, "eager_us", lambda: time_eager(mpi, case.bound(comm, algo, det), sync, opts.iters, gpu), log)
    if not gpu:
        return row
    import cupy

    if getattr(opts, "persistent", False) and flat and _engine_takes(opts, algo, case):
        _mode(row, "eager_persistent_us", lambda: _eager_persistent(comm, case, algo, det, opts, row, log), log)

    def graph_check(g, s):
        """One replay into a zeroed output, checked like the eager result."""
        if not all(_rerun_checks(mpi, case, lambda: g.launch(s), s.synchronize)):
            raise RuntimeError("wrong result after a graph replay")

    _mode(row, "graph_us", lambda: time_graph(
        mpi, lambda s: case.call(comm, algo, det, stream=s), opts.iters, check=graph_check), log)
    one_shot = flat and algo in ("auto", "oneshot_sentinel", "oneshot_ll") and case.collective == "allreduce"
    fuser = comm._backend.fuser if one_shot else None
    if fuser is not None:
        def unfused():
            comm._backend.fuser = None
            try:
                return time_graph(mpi, lambda s: case.call(comm, algo, det, stream=s), opts.iters,
                                  check=graph_check)
            finally:
                comm._backend.fuser = fuser

        _mode(row, "graph_unfused_us", unfused, log)
    if one_shot:
        _mode(row, "graph_group_us", lambda: time_graph_group(
            comm, case, opts.iters, algorithm=algo, deterministic=det), log)

    def in_kernel():
        call = case.prepare()
        s = cupy.cuda.Stream(non_blocking=True)
        _guarded(mpi, lambda: (comm._backend.run(call, det, algo, s, iters=1), comm.synchronize(s)))
        t = in_kernel_slope(mpi, s, lambda k: comm._backend.run(call, det, algo, s, iters=k), opts.iters)
        comm.synchronize(s)
        # one more loop into a zeroed output, checked (every collective of it reads the same input)
        ok = all(_rerun_checks(mpi, case, lambda: comm._backend.run(call, det, algo, s, iters=opts.iters),
                               lambda: comm.synchronize(s)))
        if not all(mpi.allgather(ok)):
            row["ok"] = False
            raise Skip("wrong result after an in-kernel loop")
        return t

    if not flat:
        row.setdefault("skipped", {})["in_kernel"] = "hierarchical communicator: several launches and MPI/NCCL per call"
        return row
    _mode(row, "in_kernel_us", in_kernel, log)
    _blocking(comm, row, lambda s: case.call(comm, algo, det, stream=s), opts, log)
    return row


def _engine_takes(opts, algo: str, case) -> bool:
    from ..backends.cuda.workspace import S_ENGINE
    from ..policy import ENGINE_ALGORITHMS as ENGINE_ALGOS

    return opts.collective == "allreduce" and algo in ENGINE_ALGOS and 0 < case.nbytes <= S_ENGINE


def _eager_persistent(comm, case, algo, det, opts, row, log) -> float:
    """eager_us with the eager engine running: checked once, then timed the same way; the
    engine must have served every call.  Then, with the engine still up, the same call as a
    persistent request (row's eager_request_us), checked and counted the same way.  Up to the
    engine's largest call (256 KiB), beyond start_persistent's default (64 KiB), to show where
    it stops paying.  The engine is start_persistent's default (4 blocks) where that takes the
    call (<= 128 KiB), else the fewest blocks that do: what a user of the defaults gets."""
    from ..backends.cuda.engine import BYTES_PER_BLOCK, DEFAULT_BLOCKS
    from ..ops import dtype_name

    mpi = comm.mpi_comm
    case.reset(full=True)  # its kernel runs now, loaded before the engine starts (see _engine.py)
    order = getattr(opts, "engine_order", "stream")
    blocks = max(DEFAULT_BLOCKS, -(-case.nbytes // BYTES_PER_BLOCK))
    _guarded(mpi, lambda: comm.start_persistent(opts.dtype, blocks=blocks, max_bytes=blocks * BYTES_PER_BLOCK,
                                                order=order))
    try:
        eng = comm._backend.engines.engines()[dtype_name(opts.dtype)]
        _guarded(mpi, lambda: (case.call(comm, algo, det), comm.synchronize()))
        if not case.check(mpi, case.host_result()):
            raise Skip("wrong result through the eager engine")
        t = _time_on_engine(mpi, eng, case.bound(comm, algo, det), comm.synchronize, opts, "calls")
        _mode(row, "eager_request_us", lambda: _eager_request(comm, case, algo, det, opts, eng), log)
        return t
    finally:
        comm.stop_persistent()


def _eager_request(comm, case, algo, det, opts, eng) -> float:
    """One blocking call as Start + Wait of a persistent request (Communicator.Allreduce_init):
    checked once into a cleared output, then timed like eager_us; the engine must serve it."""
    mpi = comm.mpi_comm
    req = comm.Allreduce_init(case.send, case.recv, algorithm=algo, deterministic=det)
    try:
        case.reset(full=True)
        comm.synchronize()
        _guarded(mpi, lambda: (req.Start(), req.Wait()))
        if not case.check(mpi, case.host_result()):
            raise Skip("wrong result through a persistent request")
        return _time_on_engine(mpi, eng, req.Start, req.Wait, opts, "Starts")
    finally:
        req.Free()


def _time_on_engine(mpi, eng, fn, sync, opts, what: str) -> float:
    """time_eager of blocking calls the running engine `eng` must serve, every one of them."""
    before = eng.calls
    t = time_eager(mpi, fn, sync, opts.iters, True, device_wide=False)
    served = _max(mpi, eng.calls - before)
    if served != opts.iters + min(EAGER_WARMUP, opts.iters):
        raise Skip(f"the engine served {served} of the timed {what}")
    return t


def _barrier_graph_us(comm, opts):
    return time_graph(comm.mpi_comm, lambda s: comm._backend.barrier(stream=s, sync=False), opts.iters)


def _blocking(comm, row, fn_on_stream, opts, log) -> None:
    """blocking_us = per-op time of a graph of (op, device barrier) minus a barrier's."""
    def both(s):
        fn_on_stream(s)
        comm._backend.barrier(stream=s, sync=False)

    def run():
        bar = _barrier_graph_us(comm, opts)
        tot = time_graph(comm.mpi_comm, both, opts.iters)
        row["barrier_us"] = bar
        return tot - bar

    _mode(row, "blocking_us", run, log)


def bench_nccl(nccl_comm, cuda_comm, case, opts, log) -> dict:
    mpi = nccl_comm.mpi_comm
    row = _row(opts.collective, "nccl", opts.dtype, case)
    sync = lambda: nccl_comm.synchronize()  # noqa: E731
    try:
        case.reset()
        _guarded(mpi, lambda: (case.call(nccl_comm), sync()))
        row["ok"] = case.check(mpi, case.host_result())
    except Skip as exc:
        row["ok"] = False
        row.setdefault("skipped", {})["all"] = str(exc)
        return row
    _mode(row, "eager_us", lambda: time_eager(mpi, case.bound(nccl_comm), sync, opts.iters, True), log)
    _mode(row, "graph_us", lambda: time_graph(mpi, lambda s: case.call(nccl_comm, stream=s), opts.iters), log)
    if case.collective == "allreduce":
        _mode(row, "graph_group_us", lambda: time_graph_group(nccl_comm, case, opts.iters), log)
    if cuda_comm is not None:
        _blocking(cuda_comm, row, lambda s: case.call(nccl_comm, stream=s), opts, log)
    return row


def bench_torch(ts: TorchSymm, which: str, comm, case, opts, log) -> dict:
    mpi = comm.mpi_comm
    row = _row(opts.collective, which, ts.dtype_name, case)
    esize = ts.torch.empty(0, dtype=ts.dtype).element_size()
    count = max(1, case.nbytes // esize)
    row.update(count=count, bytes=count * esize)
    try:
        t = _guarded(mpi, lambda: ts.tensor(count, comm.rank))
        ref = mpi.allreduce(t.float().cpu().numpy().astype(np.float64))
        fn = ts.op(which, t)
        inp = t.clone()

        def check():
            t.copy_(inp)
            out = fn()
            out = t if out is None else out
            ts.sync()
            return out.float().cpu().numpy()

        res = _guarded(mpi, check)
        tol = 2e-2 * comm.size if ts.dtype_name != "float32" else 1e-5 * comm.size
        row["ok"] = _agree(mpi, bool(np.allclose(res, ref, rtol=tol, atol=tol * comm.size)))
    except Skip as exc:
        row["ok"] = False
        row.setdefault("skipped", {})["all"] = str(exc)
        log(f"  {which} {fmt_bytes(case.nbytes)}: failed: {exc}")
        return row
    # two_shot_all_reduce_ is in place: values grow over repetitions; latency does not care
    _mode(row, "eager_us", lambda: time_eager(mpi, fn, ts.sync, opts.iters, True), log)
    _mode(row, "graph_us", lambda: ts.time_graph(mpi, fn, opts.iters), log)
    return row


def _progress_line(r: dict) -> None:
    print(f"# {r['bytes']} B {r['algorithm']}: eager {r.get('eager_us')} graph {r.get('graph_us')} "
          f"group {r.get('graph_group_us')} in-kernel {r.get('in_kernel_us')} ok {r.get('ok')}", flush=True)


def torch_baselines_first(opts, sizes, world, log) -> tuple[dict, str | None]:
    """torch symmetric memory's one/two-shot rows for every size, in these processes but before
    hpccoll opens anything on the GPU: run after hpccoll's CUDA backend, torch failed on every
    rank with "SyntaxError: source code string cannot contain null bytes" (2xH200, 2026-11-30,
    while no torch source file read back bad in that process; bench/NOTES.md).  Returns
    ({bytes: rows}, None) or ({}, why skipped)."""
    from mpi4py import MPI

    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    ts = None
    try:
        def shim():
            import torch

            if not torch.cuda.is_available():
                raise Skip("torch sees no CUDA device")
            dev = node.Get_rank() % torch.cuda.device_count()
            import cupy  # the timing helpers synchronize through CuPy: the same GPU as torch

            cupy.cuda.Device(dev).use()
            return types.SimpleNamespace(rank=world.Get_rank(), size=world.Get_size(), mpi_comm=world, device=dev)

        comm = _guarded(world, shim)
        ts = _guarded(world, lambda: TorchSymm(comm, opts.dtype))
        rows: dict = {}
        for nbytes in sizes:
            case = types.SimpleNamespace(nbytes=nbytes, count=None)
            rows[nbytes] = [bench_torch(ts, which, comm, case, opts, log)
                            for which in ("torch_one_shot", "torch_two_shot")]
            if world.Get_rank() == 0:
                for r in rows[nbytes]:
                    _progress_line(r)
        return rows, None
    except Skip as exc:
        log(f"torch symm_mem baselines skipped: {exc}")
        return {}, str(exc)
    finally:
        if ts is not None:
            ts.close()
        node.Free()


def run_sweep(opts, log=None) -> dict:
    """The whole benchmark (collective over MPI.COMM_WORLD); returns the result dict on every rank."""
    import hpccoll
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    log = log or (lambda *m: say(world.Get_rank(), *m))
    sizes = parse_sizes(opts.sizes) if isinstance(opts.sizes, str) else list(opts.sizes)
    torch_first: dict = {}   # bytes -> torch rows, measured before hpccoll opens the GPU
    torch_skip = None
    if getattr(opts, "baselines", False) and opts.collective == "allreduce" and opts.baselines != "nccl":
        torch_first, torch_skip = torch_baselines_first(opts, sizes, world, log)
    comm = hpccoll.Communicator(backend="auto", check=False)
    gpu = comm.device is not None     # device buffers (flat CUDA backend, or hierarchical on GPUs)
    flat = comm.backend == "cuda"     # one node: SoL, in-kernel, blocking and baselines apply
    rank, n = comm.rank, comm.size
    skipped: dict = {}
    result = {"machine": machine_info(comm), "commit": git_commit(), "date": _now(), "ranks": n,
              "backend": comm.backend, "collective": opts.collective, "dtype": opts.dtype,
              "deterministic": bool(opts.deterministic), "iters": opts.iters, "graph_ops": GRAPH_OPS,
              "engine_order": getattr(opts, "engine_order", "stream"),
              "command": getattr(opts, "command", None) or " ".join(["hpccoll"] + sys.argv[1:]),
              "sol_us": None, "sol": {}, "rows": [], "skipped": skipped}
    if not gpu:
        log("hpccoll bench: no usable GPU / CUDA backend: host backend, eager mode, algorithm 'mpi' only")
    if flat:
        try:
            result["sol"] = measure_sol(comm, log)
            result["sol_us"] = result["sol"].get("sol_us")
        except Skip as exc:
            skipped["sol"] = str(exc)
            log(f"SoL model skipped: {exc}")
        except Exception as exc:  # noqa: BLE001
            skipped["sol"] = _err(exc)
            log(f"SoL model skipped: {_err(exc)}")
    peer_atomics = bool(getattr(comm._backend, "peer_atomics", False)) if gpu else False
    algos = algorithm_list(opts.collective, opts.algorithms, opts.dtype, opts.deterministic,
                           peer_atomics, gpu) if flat or not gpu else ["auto"]

    # baselines
    nccl_comm = host_comm = None
    if getattr(opts, "baselines", False):
        if gpu and not flat:
            skipped["baselines"] = "hierarchical communicator: run the baselines on a single-node layout"
            log("baselines skipped: hierarchical communicator")
        elif not gpu:
            skipped["baselines"] = "no GPU: the host run is the MPI path itself"
            log("baselines skipped: no GPU (the host run is the MPI path itself)")
        else:
            try:
                nccl_comm = _guarded(comm.mpi_comm, lambda: hpccoll.Communicator(backend="nccl", check=False))
            except Skip as exc:
                skipped["nccl"] = str(exc)
                log(f"nccl baseline skipped: {exc}")
            if opts.baselines == "nccl":  # hpccoll tune: NCCL only (the fallback candidate)
                pass
            elif opts.collective == "allreduce":
                if torch_skip:
                    skipped["torch"] = torch_skip
            else:
                skipped["torch"] = "torch symm_mem baselines are allreduce only"
            if opts.baselines != "nccl":
                host_comm = hpccoll.Communicator(backend="host", check=False)

    xp = np
    if gpu:
        import cupy as xp  # noqa: F811
    bar = None
    total = len(sizes) * (len(algos) + (nccl_comm is not None) + (host_comm is not None))
    if rank == 0 and sys.stderr.isatty():
        try:
            from tqdm import tqdm

            bar = tqdm(total=total, desc=f"bench {opts.collective}", unit="run", leave=False)
        except ImportError:
            bar = None
    prev = log

    def log(*m):  # noqa: F811 - keep progress bar output intact
        if bar is not None:
            if rank == 0:
                bar.write(" ".join(str(x) for x in m))
        else:
            prev(*m)

    rows = result["rows"]
    global _ALIGN
    if flat:
        _ALIGN = lambda h: comm._backend.barrier(stream=h, sync=False)  # noqa: E731
    result["aligned_start"] = flat
    try:
        for nbytes in sizes:
            try:
                case = Case(opts.collective, nbytes, opts.dtype, rank, n, xp)
            except Exception as exc:  # noqa: BLE001 - e.g. a dtype this array library lacks
                raise SystemExit(f"hpccoll bench: cannot make {opts.dtype} buffers of "
                                 f"{fmt_bytes(nbytes)} on the {comm.backend} backend: {_err(exc)}") from None
            for algo in algos:
                if bar is not None:
                    bar.set_postfix_str(f"{fmt_bytes(nbytes)} {algo}")
                rows.append(bench_hpccoll(comm, case, algo, opts, gpu, log))
                if rank == 0 and bar is None:  # progress without a tty: one line per row
                    _progress_line(rows[-1])
                bar and bar.update(1)
            if nccl_comm is not None:
                rows.append(bench_nccl(nccl_comm, comm, case, opts, log))
                bar and bar.update(1)
            rows.extend(torch_first.get(nbytes, []))
            if host_comm is not None:
                r = bench_hpccoll(host_comm, case, "mpi", opts, False, log)
                rows.append(r)
                bar and bar.update(1)
            del case
    finally:
        _ALIGN = None
        if bar is not None:
            bar.close()
        for c in (nccl_comm, host_comm):
            if c is not None:
                c.Free()
        comm.Free()
    for r in rows:
        annotate(r, result, n)
    return result


def annotate(row: dict, result: dict, nranks: int) -> None:
    """busbw, x SoL, speed-ups vs NCCL and the best torch baseline (graph / graph)."""
    t = row.get("graph_us") or row.get("eager_us")
    b = row["bytes"]
    coll = row["collective"]
    if t:
        if coll == "allreduce":
            bus = b * 2 * (nranks - 1) / nranks
        elif coll in ("allgather", "reduce_scatter"):
            bus = b * nranks * (nranks - 1) / nranks
        else:
            bus = b
        row["busbw_GBps"] = bus / (t * 1e3)
    sol = sol_us_for(result.get("sol"), b)
    row["sol_us"] = sol
    row["ratio_to_sol"] = (row["in_kernel_us"] / sol) if (sol and row.get("in_kernel_us")) else None

    def graph_of(name, key="graph_us"):
        return [r[key] for r in result["rows"]
                if r["algorithm"] == name and r["bytes"] == b and r.get(key)]

    g = row.get("graph_us")
    nccl = graph_of("nccl")
    torch = graph_of("torch_one_shot") + graph_of("torch_two_shot")
    row["speedup_vs_nccl"] = (nccl[0] / g) if (g and nccl) else None
    row["speedup_vs_torch"] = (min(torch) / g) if (g and torch) else None
    gg = row.get("graph_group_us")
    nccl_group = graph_of("nccl", "graph_group_us")
    row["group_speedup_vs_nccl"] = (nccl_group[0] / gg) if (gg and nccl_group) else None


# -- report -----------------------------------------------------------------------------

def _f(v, w: int = 8, p: int = 2) -> str:
    if v is None:
        return "-".rjust(w)
    if isinstance(v, float):
        return f"{v:{w}.{p}f}"
    return str(v).rjust(w)


COLUMNS = [("size", 8), ("count", 10), ("dtype", 8), ("algorithm", 17), ("eager", 8), ("eager*", 7), ("req*", 6),
           ("graph", 8), ("unfused", 8), ("group", 7),
           ("in-kern", 8), ("blocking", 8), ("busbw", 7), ("xSoL", 6), ("vsNCCL", 6), ("vsTorch", 7),
           ("ok", 3)]


def format_table(result: dict) -> str:
    """nccl-tests-like table: latencies in µs, busbw in GB/s."""
    lines = [f"# hpccoll bench {result.get('collective')}  ranks {result.get('ranks')}  "
             f"backend {result.get('backend')}  dtype {result.get('dtype')}  "
             f"{result.get('machine', {}).get('gpu') or ''}"]
    sol = result.get("sol") or {}
    if result.get("sol_us"):
        lines.append(f"# SoL {result['sol_us']:.3f} us = 2*{sol.get('fence_ns', 0):.0f} ns fence + "
                     f"({sol.get('pingpong_roundtrip_ns', 0):.0f} ns ping-pong - 2*fence)/2; "
                     f"peer copy {sol.get('bw_GBps', 0):.1f} GB/s")
    floors = [(k[6:-3].replace("_", "+"), v) for k, v in sol.items() if k.startswith("floor_") and v]
    if floors:
        lines.append("# graph floor (us per launch of a kernel that does nothing: empty, or one "
                     "peer store; +pdl: programmatic launch): "
                     + ", ".join(f"{k} {v:.2f}" for k, v in floors))
    lines.append("# times: us per op (eager: blocking Python call; eager*: the same with the eager "
                 "engine running; req*: Start + Wait of a persistent request, engine running; "
                 f"engine order: {result.get('engine_order', 'stream')}; "
                 f"graph: per op in a CUDA graph of {GRAPH_OPS} calls (hpccoll's one-shot calls "
                 "captured back to back run as one node); unfused: the same, a node per call; group: per op in a CUDA graph of one "
                 f"group of {GRAPH_OPS} calls (comm.group(); NCCL: an NCCL group); in-kern: per op "
                 "inside one launch, the slope between loops of K and 4K ops; blocking: graph op + "
                 "device barrier - barrier)")
    lines.append("".join(h.rjust(w + 1) for h, w in COLUMNS))
    for r in result.get("rows", []):
        algo = r["algorithm"] + (f"({r['resolved']})" if r.get("resolved") else "")
        ok = {True: "yes", False: "NO", None: "-"}[r.get("ok")]
        cells = [fmt_bytes(r["bytes"]), r["count"], r["dtype"], algo[:17],
                 r.get("eager_us"), r.get("eager_persistent_us"), r.get("eager_request_us"), r.get("graph_us"),
                 r.get("graph_unfused_us"), r.get("graph_group_us"),
                 r.get("in_kernel_us"),
                 r.get("blocking_us"),
                 r.get("busbw_GBps"), r.get("ratio_to_sol"), r.get("speedup_vs_nccl"),
                 r.get("speedup_vs_torch"), ok]
        lines.append("".join(c.rjust(w + 1) if isinstance(c, str) else " " + _f(c, w)
                             for c, (_, w) in zip(cells, COLUMNS)))
    if result.get("skipped"):
        for k, v in result["skipped"].items():
            lines.append(f"# skipped {k}: {v}")
    return "\n".join(lines)


def write_json(result: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
        f.write("\n")


def write_lab_json(comm, opts, sol: dict, rows: list, script: str, **extra) -> None:
    """A lab's record (bench/*_lab.py), on rank 0 when --json was given: machine, commit, the SoL
    measured at its start, its rows, how it timed them and the command line."""
    if comm.rank != 0 or not opts.json:
        return
    write_json({"machine": machine_info(comm), "commit": git_commit(), "sol": sol,
                "median_of": REPS, "rows": rows, **extra,
                "command": f"{script} " + " ".join(f"--{k} {v}" for k, v in vars(opts).items() if v)},
               opts.json)


def plot(result: dict, path: str) -> None:
    """Latency vs size (log-log): graph mode per algorithm / baseline, dashed in-kernel, SoL line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    by: dict[str, list] = {}
    for r in result.get("rows", []):
        by.setdefault(r["algorithm"], []).append(r)
    for i, (algo, rows) in enumerate(by.items()):
        rows = sorted(rows, key=lambda r: r["bytes"])
        color = f"C{i % 10}"
        pts = [(r["bytes"], r.get("graph_us") or r.get("eager_us")) for r in rows]
        pts = [p for p in pts if p[1]]
        if pts:
            mode = "graph" if any(r.get("graph_us") for r in rows) else "eager"
            ax.plot(*zip(*pts), "-o", ms=3, color=color, label=f"{algo} ({mode})")
        ik = [(r["bytes"], r["in_kernel_us"]) for r in rows if r.get("in_kernel_us")]
        if ik:
            ax.plot(*zip(*ik), "--", color=color, label=f"{algo} (in-kernel)")
    if result.get("sol_us"):
        ax.axhline(result["sol_us"], color="k", ls=":", label=f"SoL {result['sol_us']:.2f} us")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("latency per op (us)")
    m = result.get("machine", {})
    ax.set_title(f"hpccoll {result.get('collective')}: {m.get('gpu') or m.get('hostname')}, "
                 f"{result.get('ranks')} ranks, {result.get('dtype')}, {result.get('date', '')[:10]}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- provenance ----------------------------------------------------------------------------

def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def git_commit() -> str | None:
    """HPCCOLL_COMMIT when set (a copy of the tree may carry a stale git HEAD), else git's HEAD."""
    from ..config import Config

    commit = Config.from_env().commit
    if commit:
        return commit
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def machine_info(comm) -> dict:
    info = {"hostname": socket.gethostname(), "gpu": None, "driver": None, "cuda_runtime": None,
            "cuda_driver": None, "backend": comm.backend}
    if comm.device is not None:
        try:
            import cupy

            rt = cupy.cuda.runtime
            props = rt.getDeviceProperties(comm.device)
            name = props["name"]
            info["gpu"] = name.decode() if isinstance(name, bytes) else name
            info["cuda_runtime"] = rt.runtimeGetVersion()
            info["cuda_driver"] = rt.driverGetVersion()
            info["cupy"] = cupy.__version__
        except Exception:  # noqa: BLE001
            pass
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            if out.returncode == 0:
                info["driver"] = out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
    return info


# -- tune --------------------------------------------------------------------------------

def tuning_rows(winners: list[tuple[int, str]]) -> list[list]:
    """[(bytes, algorithm)] ascending -> [[max_bytes, algorithm], ..., [None, last]]."""
    rows: list[list] = []
    for nbytes, algo in sorted(winners):
        if rows and rows[-1][1] == algo:
            rows[-1][0] = nbytes
        else:
            rows.append([nbytes, algo])
    if rows:
        rows[-1][0] = None
    return rows


def winners_of(rows: list[dict], also=()) -> list[tuple[int, str]]:
    """Fastest algorithm per size (graph time, else eager) among hpccoll's and `also` (e.g.
    "nccl" for the non-deterministic table: auto falls back to NCCL where it wins).  The graph
    time of one node per call where the row has it: the table serves calls alone, and the
    captured chains choose their own one-shot (backends/cuda.py, FUSE_LL_MAX)."""
    best: dict[int, tuple[float, str]] = {}
    for r in rows:
        t = r.get("graph_unfused_us") or r.get("graph_us") or r.get("eager_us")
        if r.get("ok") and t and (r["algorithm"] in ALLREDUCE_ALGORITHMS or r["algorithm"] in also):
            if r["bytes"] not in best or t < best[r["bytes"]][0]:
                best[r["bytes"]] = (t, r["algorithm"])
    return [(b, a) for b, (t, a) in best.items()]


class _Opts:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def tune(opts) -> int:
    from mpi4py import MPI

    from .. import policy as select

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    tables, gpu_name, sweeps = {}, None, {}
    for det in (False, True):
        o = _Opts(collective="allreduce", sizes=opts.sizes, dtype=opts.dtype, iters=opts.iters,
                  algorithms="all", deterministic=det, baselines=False if det else "nccl", json=None, plot=None,
                  command=" ".join(["hpccoll"] + sys.argv[1:]))
        res = run_sweep(o)
        if res["backend"] != "cuda":
            say(rank, "hpccoll tune: needs the cuda backend (no GPU here); nothing written")
            return 2
        gpu_name = res["machine"].get("gpu")
        key = "allreduce_deterministic" if det else "allreduce"
        tables[key] = tuning_rows(winners_of(res["rows"], also=() if det else ("nccl",)))
        sweeps[key] = res
        say(rank, format_table(res))
    if rank == 0:
        path = opts.out or str(select.tuning_path())
        table: dict = {}
        if os.path.exists(path):
            try:
                with open(path) as f:
                    table = json.load(f)
            except (OSError, ValueError):
                table = {}
            if table.get("gpu") != gpu_name:
                table = {}
        if not table:
            table = json.loads(json.dumps(select.shipped_table("generic")))
        table["gpu"] = gpu_name
        table["note"] = f"measured by hpccoll tune on {socket.gethostname()} at {_now()}"
        n = str(world.Get_size())
        for key, rows in tables.items():
            if rows:
                table.setdefault(key, {})[n] = rows
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(table, f, indent=1)
            f.write("\n")
        print(f"hpccoll tune: wrote {path}: " + json.dumps({k: v for k, v in tables.items()}), flush=True)
        if opts.json:
            write_json(sweeps, opts.json)
    return 0


