"""CUDA backend: hpccoll's barrier-free kernels over symmetric memory on one node.

Owns the workspace layout (region offsets and sizes), kernel modules and launch
configuration; the algorithm comes from hpccoll.select."""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import numpy as np

from .. import _env, select
from .._driver import GROUP_MAX, MAX_RANKS, Args, Group, Launcher, Module, p2p_native_atomics
from .._engine import CMD_OF_OP, HOST_BYTES, Engine
from .._fuse import Fuser
from .._nvrtc import compile_module
from .._symm import CTRL_BYTES, CudaUnavailable, Workspace
from .._validate import Call
from ..ops import np_dtype
from ..errors import CollectiveTimeout

__all__ = ["CudaBackend", "CudaUnavailable"]

KiB, MiB = 1024, 1024 * 1024
S_ONESHOT = 4 * MiB      # payload per source of one one-shot sentinel launch (2 parities x n of them)
S_LL = 256 * KiB         # payload per source of one LL launch
S_LLB = 2 * MiB          # Bcast's chunk (payload per LL sub-buffer of its own region): 256 KiB chunks
                         # took ~8 ms per 128 MiB (one arrival round trip per chunk, 32 blocks busy)
S_TWOSHOT = 8 * MiB      # message bytes of one two-shot launch
S_ENGINE = 256 * KiB     # most payload of one eager-engine call (hpccoll/_engine.py)
ENGINES = 2              # engines (dtypes) one communicator can run at once: a region each
ENGINE_ALGOS = ("auto", "oneshot_ll")  # the calls an engine takes (its one-shot: engine_rest)
GROUP_ALGOS = ("oneshot_sentinel", "oneshot_ll")  # the algorithms a group launch runs
# The most bytes for which a captured chain of 'auto' calls runs the one-shot LL
# (CudaBackend._chain_algo).  2xH200, one bench run (80b5074), fp32 graph per op fused: LL
# 0.98-1.21 us at 128 B-16 KiB, 1.19/1.31 at 64/128 KiB, 2.02 at 256 KiB; sentinel 1.43-1.58,
# 1.59/1.68, 1.66 (its re-arms need a fence between calls; LL's flags do not).
FUSE_LL_MAX = 128 * KiB
PACK = 16
COLL_NAMES = {1: "Allreduce", 2: "Bcast", 3: "Allgather", 4: "Reduce_scatter_block", 5: "Barrier"}
log = logging.getLogger("hpccoll")
OPS = {"SUM": "sum", "PROD": "prod", "MAX": "max", "MIN": "min"}
SENTINEL_BYTE_PATTERN = 0xFFFAFFFA  # the same bytes for every dtype width (see proto_sentinel.cuh)
_MODULES: dict[tuple, Module] = {}  # (device, source, dtype, compile defines) -> loaded kernels


LOOP_FENCE = "-DHC_LOOP_FENCE=1"  # the define of the in-kernel loop module (CudaBackend._module)


def kernel_names(dtype: str, loop: bool = False) -> set[str]:
    """Every entry point of cuda/collectives.cu's module for dtype (sentinel and LL128 need
    floats); loop: of the in-kernel loop module, which also holds the chains (hpccoll/_fuse.py)."""
    names = {"hc_bcast_ll", "hc_allgather_ll", "hc_barrier"}
    for op in OPS.values():
        names |= {f"hc_allreduce_oneshot_ll_{op}", f"hc_allreduce_twoshot_ll_{op}", f"hc_reduce_scatter_ll_{op}"}
        if dtype not in ("int32", "int64"):
            names |= {f"hc_allreduce_oneshot_sentinel_{op}", f"hc_allreduce_twoshot_sentinel_{op}",
                      f"hc_reduce_scatter_sentinel_{op}"}
    oneshots = [n for n in names if n.startswith("hc_allreduce_oneshot_")]
    names |= {f"{n}_group" for n in oneshots}
    if loop:
        names |= {f"{n}_chain" for n in oneshots}
    if dtype not in ("int32", "int64"):
        names.add("hc_allreduce_twoshot_ll128_sum")
    return names


def engine_rest(dtype: str) -> int:
    """The u32 pattern of an engine's slots at rest (cuda/persistent.cu, EngineProto): the
    sentinel for floating types, zero (LL) for integers."""
    return 0 if dtype in ("int32", "int64") else SENTINEL_BYTE_PATTERN


def _align(n: int, a: int = 256) -> int:
    return (n + a - 1) // a * a


def _packs(flat) -> int:
    """16-byte packs of a buffer (the last one partial): its slots in a one-shot launch."""
    return (flat.nbytes + PACK - 1) // PACK


class Layout:
    """Byte offsets of the regions in every rank's workspace (identical on all ranks)."""

    def __init__(self, nranks: int):
        n = nranks
        self.sub_oneshot = S_ONESHOT
        self.sub_ll = 2 * S_LL                                   # LL: 16 B of slot per 8 B of data
        self.sub_twoshot = _align((S_TWOSHOT // 120 // n + 2) * 128)  # >= LL128 lines per owner
        off = CTRL_BYTES
        self.oneshot = off; off += 2 * n * self.sub_oneshot      # sentinel
        self.ll = off; off += 2 * n * self.sub_ll                # LL
        self.ll2 = off; off += 2 * n * self.sub_ll               # LL (two-shot phase 2)
        self.sub_llb = 2 * S_LLB
        self.llb = off; off += 2 * n * self.sub_llb              # LL (Bcast)
        self.ts1 = off; off += 2 * n * self.sub_twoshot          # sentinel (reduce-scatter)
        self.ts2 = off; off += 2 * n * self.sub_twoshot          # sentinel (all-gather)
        self.ll128 = off; off += 2 * self.sub_twoshot            # zeroed lines
        self.sub_engine = 2 * S_ENGINE                           # the eager engines (engine_rest)
        self.engine_bytes = 2 * n * self.sub_engine              # one engine's region
        self.engine = []
        for _ in range(ENGINES):
            self.engine.append(off); off += self.engine_bytes
        self.total = _align(off, 2 * MiB)
        # LL slots lie in groups of 32 packs, 1 KiB each (cuda/proto_ll.cuh, LL::at)
        assert self.sub_ll % KiB == self.sub_llb % KiB == self.sub_engine % KiB == 0
        # allreduce algorithm -> (bytes per launch, (region, sub), (region2, sub2))
        self.allreduce = {
            "oneshot_sentinel": (S_ONESHOT, (self.oneshot, self.sub_oneshot), (0, 0)),
            "oneshot_ll": (S_LL, (self.ll, self.sub_ll), (0, 0)),
            "twoshot_ll": (S_LL * n, (self.ll, self.sub_ll), (self.ll2, self.sub_ll)),
            "twoshot_sentinel": (S_TWOSHOT, (self.ts1, self.sub_twoshot), (self.ts2, self.sub_twoshot)),
            "twoshot_ll128": (S_TWOSHOT, (self.ll128, self.sub_twoshot), (self.ts2, self.sub_twoshot)),
        }
        self.sentinel_regions = [(self.oneshot, self.ll), (self.ts1, self.ll128)]


def grid_block_cap(devices: Sequence[int], sms: Sequence[int]) -> tuple[int, int]:
    """(most ranks on one GPU, blocks per collective launch) from every rank's GPU and its SM
    count: the same on every rank, whatever GPU the caller has.  The whole grid must be
    resident (spinning blocks wait for their peers): at most one 512-thread block per SM
    (<= 128 registers a thread fill an SM's register file), the SMs of the fewest-SM GPU shared
    by the most ranks any GPU serves, and at most 128 blocks."""
    per_gpu = max(devices.count(d) for d in devices)
    return per_gpu, max(1, min(128, *sms) // per_gpu)


_current_stream = None  # cupy.cuda.get_current_stream, looked up once


def _stream_ptr(stream) -> int:
    global _current_stream
    if stream is None:
        if _current_stream is None:
            import cupy

            _current_stream = cupy.cuda.get_current_stream
        return _current_stream().ptr
    if isinstance(stream, int):
        return stream
    for attr in ("ptr", "cuda_stream", "handle"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError(f"stream must be a CuPy/torch stream or a raw handle (int), not {type(stream).__name__}")


class FastLaunch:
    """One prepared kernel launch: `launch(stream)` = error check + one driver call.  `fuse`:
    CudaBackend._fused's arguments where the call may join a captured chain (hpccoll/_fuse.py)."""

    __slots__ = ("backend", "launcher", "grid", "block", "fuse")

    def __init__(self, backend, launcher: Launcher, grid: tuple[int, int], fuse=None):
        self.backend, self.launcher = backend, launcher
        self.grid, self.block = grid
        self.fuse = fuse

    def launch(self, stream) -> None:
        backend = self.backend
        backend.check_error()
        s = _stream_ptr(stream)
        if self.fuse is not None and s and backend._is_capturing(s) and backend._fused(s, *self.fuse):
            return
        self.launcher(self.grid, self.block, s)
        if self.backend._engines:
            self.backend._pending.add(s)


class EnginePlan:
    """FastLaunch's counterpart for a call a running engine takes: posted to the engine, or
    launched as usual (`fallback`) while the stream is being captured into a graph."""

    __slots__ = ("backend", "engine", "call", "nb", "fallback", "_ws", "_current")

    def __init__(self, backend, engine, in_ptr, out_ptr, count, op, fallback: FastLaunch):
        import cupy

        self.backend, self.engine, self.fallback = backend, engine, fallback
        self.call = (in_ptr, out_ptr, count, CMD_OF_OP[op])
        self.nb = engine.blocks_for(count)
        self._ws = backend.ws
        self._current = cupy.cuda.get_current_stream

    def launch(self, stream) -> None:
        # The hot path of a blocking call: attribute reads, no Python frames but the engine's
        # (each frame costs ~0.1 us; the whole Python share of a call was 1.1-2.5 us, 66566a5).
        backend = self.backend
        if backend._broken or self._ws.err_word.value:
            backend.check_error()
        s = self._current().ptr if stream is None else _stream_ptr(stream)
        eng = self.engine
        if not eng.running or (s and eng.capturing(s)):
            self.fallback.launch(stream)
            return
        if not eng.call_cmd(self.call, s, self.nb):
            backend.check_error()  # a poll timed out: raises CollectiveTimeout with its record


class CudaBackend:
    name = "cuda"

    def __init__(self, mpi_comm, device=None, *, timeout: float = 30.0):
        import cupy
        from mpi4py import MPI

        self.comm = mpi_comm
        node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=mpi_comm.Get_rank())
        try:
            nodes = mpi_comm.allreduce(1 if node.Get_rank() == 0 else 0)
            if nodes > 1:
                raise CudaUnavailable(f"communicator spans {nodes} nodes; the device path is single-node")
            if node.Get_size() > MAX_RANKS:
                raise CudaUnavailable(f"{node.Get_size()} ranks on this node; the kernels support {MAX_RANKS}")
        except CudaUnavailable:
            node.Free()
            raise
        self.node = node
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        ndev = cupy.cuda.runtime.getDeviceCount()
        self.device_id = int(device) if device is not None else node.Get_rank() % ndev
        if not 0 <= self.device_id < ndev:
            raise ValueError(f"device={device}: this node has GPUs 0..{ndev - 1}")
        cupy.cuda.Device(self.device_id).use()
        props = cupy.cuda.runtime.getDeviceProperties(self.device_id)
        name = props["name"]
        self.gpu_name = name.decode() if isinstance(name, bytes) else name
        self.sms = int(props["multiProcessorCount"])
        self.arch = f"sm_{props['major']}{props['minor']}"
        # PDL: the next collective is scheduled while the previous kernel runs (Hopper+)
        self.pdl = _env.pdl_mode() and int(props["major"]) >= 9
        # Every module is built for this communicator's rank count (HC_NRANKS, hc_common.cuh's
        # nranksOf): the kernels then keep no code for other counts (2 ranks: one-shot LL 4520 ->
        # 1656 SASS lines, 124 -> 54 registers).  2xH200, bench/bw_lab.py at 07d437e, one run:
        # one-shot sentinel per op in a graph 0.04-0.09 us faster at every size from 128 B to
        # 1 MiB (2.47 -> 2.42 at 128 B, 2.84 -> 2.75 at 64 KiB, 5.76 -> 5.67 at 1 MiB).
        # HPCCOLL_RANK_MODULES=0: the generic modules instead.
        self.rank_defines = (f"-DHC_NRANKS={self.size}",) if _env.rank_specialized() else ()
        self.small_block = _env.small_block()
        devices, sms, small = zip(*mpi_comm.allgather((self.device_id, self.sms, self.small_block)))  # per rank
        # Launch configurations must be the same on every rank (the same thread handles pack p,
        # and Bcast's block b waits for block b of every peer): so the most ranks any GPU
        # serves and the fewest SMs, not this rank's own.  3 ranks on 2 GPUs once gave the rank
        # alone on its GPU 128 blocks and the others 64: a Bcast's blocks 64-127 waited for
        # arrivals that never came (CollectiveTimeout, a32dcd6).
        self.ranks_per_gpu, self.grid_cap = grid_block_cap(devices, sms)
        if len(set(small)) > 1:
            raise ValueError("HPCCOLL_SMALL_BLOCK differs between ranks: set the same value on every rank")
        self._base_cap, self._min_sms = self.grid_cap, min(sms)
        self.peer_atomics = self._agree(all(
            d == self.device_id or p2p_native_atomics(self.device_id, d)
            for d in devices))
        access = all(d == self.device_id or cupy.cuda.runtime.deviceCanAccessPeer(self.device_id, d)
                     for d in devices)
        if not self._agree(access):
            raise CudaUnavailable("some GPUs of this node cannot access each other (no P2P)")
        self.timeout_ns = int(timeout * 1e9)
        self.layout = Layout(self.size)
        self.ws = Workspace(mpi_comm, self.layout.total)
        self._init_regions()
        self.ws.probe_peers(mpi_comm)
        self.table = select.load_table(self.gpu_name)
        self._nccl = self._open_nccl_fallback(mpi_comm)
        self._launchers: dict[tuple, Launcher] = {}
        self._broken: str | None = None
        self._engines: dict[str, tuple[Engine, int]] = {}  # dtype -> (engine, its region index)
        self._engine_epochs = [0] * ENGINES  # epochs each engine region has consumed
        self._pending: set[int] = set()  # streams launched on while engines run, not yet synchronized
        self._engine_host = 0  # mapped host memory of the engines (HOST_BYTES each)
        # capture fusion (hpccoll/_fuse.py): back-to-back captured one-shot Allreduce calls
        self.fuser = Fuser(self.pdl) if _env.fuse_mode() else None
        self._is_capturing = cupy.cuda.runtime.streamIsCapturing  # CuPy's binding: a direct C call
        mpi_comm.Barrier()  # nobody writes into a workspace before its owner initialised it

    def _open_nccl_fallback(self, mpi_comm):
        """NCCL for the sizes where the tuning table prefers it (collective; None otherwise).

        Opt-in (HPCCOLL_NCCL_FALLBACK=1, the same on every rank): its GPU test hung at 2 ranks
        on 2xH200 (379c1df; no shipped table prefers NCCL), so by default hpccoll's own kernels
        serve every size."""
        if not select.wants_nccl(self.table, self.size):
            return None
        if os.environ.get("HPCCOLL_NCCL_FALLBACK", "0") != "1":
            log.info("hpccoll: the tuning table prefers NCCL for large Allreduce; the NCCL fallback "
                     "is opt-in (HPCCOLL_NCCL_FALLBACK=1): hpccoll's kernels serve those sizes")
            return None
        from .nccl import NcclBackend, nccl_unavailable_reason

        why = nccl_unavailable_reason()
        if why is None and self.ranks_per_gpu > 1:
            # NCCL refuses two ranks on one GPU (ncclInvalidUsage, seen with 4 ranks on 2 H200s)
            why = "several ranks share a GPU, which NCCL does not support"
        if not self._agree(why is None):
            log.info("hpccoll: the tuning table prefers NCCL for large Allreduce but it is "
                     "unavailable (%s): hpccoll's two-shot kernels serve those sizes", why)
            return None
        return NcclBackend(mpi_comm, self.device_id)

    def _agree(self, ok: bool) -> bool:
        return all(self.comm.allgather(bool(ok)))

    def _init_regions(self) -> None:
        import cupy

        for lo, hi in self.layout.sentinel_regions:
            self.ws.view(lo, hi - lo, np.uint32).fill(SENTINEL_BYTE_PATTERN)
        cupy.cuda.runtime.deviceSynchronize()

    # -- kernels ----------------------------------------------------------------
    def _module(self, dtype: str, loop: bool = False) -> Module:
        """The kernels for dtype; loop=True: the module for in-kernel loops (iters > 1, the
        benchmark's in-kernel mode), with a fence between iterations (collectives.cu, loopFence)."""
        # No MPI inside a collective: a rank whose peer never arrives must reach the kernel's
        # bounded poll, not hang in a barrier.  Ranks compiling at once is safe: the disk cache
        # is written atomically.  Loaded modules are shared by the process's communicators.
        return self._load("collectives.cu", dtype, self.rank_defines + ((LOOP_FENCE,) if loop else ()))

    def _engine_module(self, dtype: str) -> Module:
        return self._load("persistent.cu", dtype, self.rank_defines)

    def _load(self, source: str, dtype: str, extra: tuple[str, ...]) -> Module:
        key = (self.device_id, source, dtype, extra)
        mod = _MODULES.get(key)
        if mod is None:
            mod = _MODULES[key] = Module(compile_module(source, dtype, self.arch, extra))
        return mod

    def _launcher(self, dtype: str, kernel: str, region, region2=(0, 0), loop: bool = False) -> Launcher:
        key = (dtype, kernel, loop)
        lau = self._launchers.get(key)
        if lau is None:
            a = self.ws.kernel_args(self.timeout_ns)
            a.region, a.sub = region
            a.region2, a.sub2 = region2
            lau = self._launchers[key] = Launcher(self._module(dtype, loop).fn(kernel), a, pdl=self.pdl)
        return lau

    def _grid(self, work_items: int, threads_per_item: int = 1) -> tuple[int, int]:
        """(blocks, threads): one thread per 16-byte pack up to the block cap, then loop.
        Launches that fit the block cap in blocks of small_block threads (128) use those, on
        more SMs: 2xH200, one run with 512 and with 128 (bf86d70), per op at 8-64 KiB in a
        graph 2.77/2.84/2.97 -> 2.55/2.65/2.83 us, in-kernel one-shot LL at 8 KiB 0.97 -> 0.94,
        sentinel at 8-256 KiB 1.43-1.54 -> 1.29-1.41; the same within noise at <= 4 KiB."""
        threads_needed = max(32, work_items * threads_per_item)
        limit = self.small_block if threads_needed <= self.grid_cap * self.small_block else 512
        block = min(limit, (threads_needed + 31) // 32 * 32)
        blocks = min(self.grid_cap, (threads_needed + block - 1) // block)
        return blocks, block

    # -- errors -------------------------------------------------------------------
    def check_error(self) -> None:
        if self._broken:
            raise CollectiveTimeout(self._broken)
        if self.ws.host_error():
            import cupy

            self.stop_engines()  # their blocks still polling a doorbell leave; device sync can return
            cupy.cuda.runtime.deviceSynchronize()
            rec = self.ws.error_record()
            coll = COLL_NAMES.get(rec["collective"], "?")
            self._broken = (f"{coll}: rank {self.rank} waited {rec['waited_ns'] / 1e9:.1f} s for rank "
                            f"{rec['peer']} (slot {rec['slot']}); a peer never joined or died. This "
                            "communicator is unusable: Free() it (raise HPCCOLL_TIMEOUT if ranks are "
                            "legitimately that far apart)")
            raise CollectiveTimeout(self._broken, collective=coll, peer=rec["peer"], slot=rec["slot"],
                                    waited_s=rec["waited_ns"] / 1e9)

    def synchronize(self, stream=None) -> None:
        if self._engines:
            # engine calls have finished when they return: only launches need waiting for
            if self._pending:
                s = _stream_ptr(stream)
                if s in self._pending:
                    import cupy

                    cupy.cuda.runtime.streamSynchronize(s)
                    self._pending.discard(s)
            if self._broken or self.ws.err_word.value:
                self.check_error()
            return
        import cupy

        if stream is None:
            cupy.cuda.get_current_stream().synchronize()
        else:
            cupy.cuda.runtime.streamSynchronize(_stream_ptr(stream))
        self.check_error()

    # -- dispatch -----------------------------------------------------------------
    def run(self, call: Call, deterministic: bool, algorithm: str, stream, iters: int = 1) -> None:
        self.check_error()
        if call.recv.device != self.device_id:
            raise ValueError(f"{call.name}: buffers are on GPU {call.recv.device} but this rank's "
                             f"communicator uses GPU {self.device_id}: allocate them there")
        op = call.op.name if call.op else None
        s = _stream_ptr(stream)
        if self._engines:
            eng = self._engine_for(call, algorithm) if iters == 1 else None
            if eng is not None and not eng.capturing(s):
                if not eng.call(call.send.flat.data.ptr, call.recv.flat.data.ptr, call.recv.flat.size, op, s):
                    self.check_error()  # a poll timed out: raises CollectiveTimeout with its record
                return
            self._pending.add(s)
        algo = self.resolve(call.name, call.recv.dtype, op, call.send.nbytes, deterministic, algorithm)
        if algo == "nccl":
            self._nccl.run(call, deterministic, "auto", stream, iters)
            return
        if call.name == "Allreduce":
            self._allreduce(call, algo, op, s, iters, self._chain_algo(algorithm, algo, call.send.nbytes, iters))
            return
        getattr(self, "_" + call.name.lower())(call, algo, op, s, iters)

    def resolve(self, collective, dtype, op, nbytes, deterministic, algorithm) -> str:
        """The algorithm to run: `auto`, or a communicator default that does not implement this
        collective, goes through the tuning table; unknown names raise."""
        if algorithm != "auto" and algorithm not in select.ALGORITHMS:
            select.validate(algorithm, collective, dtype, op, deterministic, self.peer_atomics)
        if algorithm == "auto" or collective not in select.ALGORITHMS[algorithm][0]:
            algorithm = select.choose(self.table, collective, dtype, op, nbytes, self.size,
                                      deterministic, self.peer_atomics, nccl=self._nccl is not None)
        if algorithm == "nccl" and self._nccl is None:
            raise ValueError(f"{collective}: algorithm='nccl' needs NCCL opened by this communicator "
                             "(it is when the tuning table prefers NCCL): use 'auto' or backend='nccl'")
        select.validate(algorithm, collective, dtype, op, deterministic, self.peer_atomics)
        return algorithm

    # Staging: kernels read/write 16-byte packs; unaligned user buffers go through aligned copies.
    @staticmethod
    def _aligned(flat):
        return flat.data.ptr % PACK == 0

    def _allreduce(self, call: Call, algo: str, op: str, s: int, iters: int, chain: str | None = None) -> None:
        import cupy

        send, recv = call.send.flat, call.recv.flat
        if not (self._aligned(send) and self._aligned(recv)):
            with cupy.cuda.ExternalStream(s):
                tmp = send.copy()  # fresh allocation: aligned
            self._allreduce_aligned(tmp, tmp, call.recv.dtype, algo, op, s, iters)
            with cupy.cuda.ExternalStream(s):
                recv[...] = tmp
            return
        self._allreduce_aligned(send, recv, call.recv.dtype, algo, op, s, iters, chain)

    def _allreduce_grid(self, algo: str, count: int, esize: int) -> tuple[int, int]:
        if algo == "twoshot_ll128":  # an 8-lane group per 128-byte line of the owner's share
            lines = (count + 128 // esize - 2) // (128 // esize - 1)
            return self._grid((lines + self.size - 1) // self.size, 8)
        packs = (count * esize + PACK - 1) // PACK  # a thread per pack (two-shot: of the owner's share)
        return self._grid(packs if algo.startswith("oneshot") else (packs + self.size - 1) // self.size)

    def _allreduce_launcher(self, dtype: str, algo: str, op: str, loop: bool = False) -> tuple[Launcher, int]:
        """The kernel of (algo, op) for dtype, and the payload bytes one launch can carry."""
        cap, region, region2 = self.layout.allreduce[algo]
        return self._launcher(dtype, f"hc_allreduce_{algo}_{OPS[op]}", region, region2, loop), cap

    def _bcast_launcher(self, dtype: str, loop: bool = False) -> Launcher:
        return self._launcher(dtype, "hc_bcast_ll", (self.layout.llb, self.layout.sub_llb), loop=loop)

    def _chain_algo(self, requested: str, algo: str, nbytes: int, iters: int = 1) -> str | None:
        """The one-shot that a captured Allreduce of `nbytes` runs in a chain node
        (hpccoll/_fuse.py), or None where it cannot join one.  `algo` is the algorithm resolved
        for the call; 'auto' calls run the LL up to FUSE_LL_MAX there (both one-shots reduce
        in rank order: the same bits)."""
        if self.fuser is None or iters != 1 or algo not in GROUP_ALGOS or nbytes <= 0:
            return None
        if requested == "auto" and nbytes <= FUSE_LL_MAX:
            algo = "oneshot_ll"
        return algo if nbytes <= self.layout.allreduce[algo][0] else None

    def _fused(self, s: int, dtype: str, algo: str, op: str, in_ptr: int, out_ptr: int, count: int) -> bool:
        """Capture this Allreduce into the stream's chain node (hpccoll/_fuse.py); False when
        the stream is not capturing after all, or the fusion is off (the caller launches it)."""
        if self.fuser is None:
            return False

        def node_spec():  # (kernel, Args to copy, grid, bytes per call): only for a new node
            esize = np_dtype(dtype).itemsize
            base, _cap = self._allreduce_launcher(dtype, algo, op)
            return (self._module(dtype, loop=True).fn(f"hc_allreduce_{algo}_{OPS[op]}_chain"), base.args,
                    self._allreduce_grid(algo, count, esize), count * esize)

        if not self.fuser.capture(s, (dtype, algo, op, count), in_ptr, out_ptr, node_spec):
            return False
        if self._engines:
            self._pending.add(s)
        return True

    def _allreduce_aligned(self, send, recv, dtype, algo, op, s, iters, chain=None) -> None:
        """chain: the one-shot to capture the call into a chain node with (_chain_algo), or None."""
        esize = send.itemsize
        n = send.size
        if chain is not None and s and self._is_capturing(s) and \
                self._fused(s, dtype, chain, op, send.data.ptr, recv.data.ptr, n):
            return
        lau, cap = self._allreduce_launcher(dtype, algo, op, iters > 1)
        step = cap // esize
        a = lau.args
        a.iters = iters
        for c0 in range(0, max(n, 1), step):
            c = min(step, n - c0)
            a.in_ = send.data.ptr + c0 * esize
            a.out = recv.data.ptr + c0 * esize
            a.count = c
            lau(*self._allreduce_grid(algo, c, esize), s)

    def plan(self, call: Call, deterministic: bool, algorithm: str):
        """A FastLaunch repeating exactly this call without re-validating it, or None when the
        call needs more than one kernel launch (staging, chunking).  The Communicator keeps
        it for the next call with the same buffers (its eager fast path)."""
        flat = call.recv.flat
        if call.recv.device != self.device_id or not (self._aligned(flat) and self._aligned(call.send.flat)):
            return None
        esize, n = flat.itemsize, flat.size
        op = call.op.name if call.op else None
        algo = self.resolve(call.name, call.recv.dtype, op, call.send.nbytes, deterministic, algorithm)
        if algo == "nccl":
            return None
        eng = self._engine_for(call, algorithm) if self._engines else None
        fuse = None
        if call.name == "Allreduce":
            lau, cap = self._allreduce_launcher(call.recv.dtype, algo, op)
            if n * esize > cap:
                return None
            grid = self._allreduce_grid(algo, n, esize)
            chain = self._chain_algo(algorithm, algo, n * esize)
            if chain is not None:
                fuse = (call.recv.dtype, chain, op, call.send.flat.data.ptr, flat.data.ptr, n)
        elif call.name == "Bcast":
            lau = self._bcast_launcher(call.recv.dtype)
            grid = self._bcast_grid(n * esize)
        else:
            return None
        a = Args.from_buffer_copy(lau.args)  # its own parameter block: launches are one ctypes call
        a.in_, a.out, a.count, a.iters = call.send.flat.data.ptr, flat.data.ptr, n, 1
        a.root = call.root or 0
        fast = FastLaunch(self, Launcher(lau.fn, a, pdl=self.pdl), grid, fuse)
        if eng is not None:
            return EnginePlan(self, eng, call.send.flat.data.ptr, flat.data.ptr, n, op, fast)
        return fast

    def _bcast(self, call: Call, algo: str, op, s: int, iters: int) -> None:
        import cupy

        buf = call.recv.flat
        if not self._aligned(buf):
            with cupy.cuda.ExternalStream(s):
                tmp = buf.copy()
            self._bcast_flat(tmp, call, s, iters)
            with cupy.cuda.ExternalStream(s):
                buf[...] = tmp
            return
        self._bcast_flat(buf, call, s, iters)

    def _bcast_flat(self, buf, call, s, iters):
        """One launch whatever the size: the kernel walks the chunks of S_LLB bytes itself."""
        esize = buf.itemsize
        lau = self._bcast_launcher(call.recv.dtype, iters > 1)
        a = lau.args
        a.root, a.iters = call.root, iters
        a.in_ = a.out = buf.data.ptr
        a.count = buf.size
        lau(*self._bcast_grid(buf.size * esize), s)

    def _bcast_grid(self, nbytes: int) -> tuple[int, int]:
        """Bcast's grid: a thread per pack of one chunk (the kernel walks the chunks)."""
        return self._grid((min(nbytes, S_LLB) + PACK - 1) // PACK)

    def _blockwise(self, call: Call, kernel: str, region, cap_bytes: int, s: int, iters: int,
                   gather: bool) -> None:
        """Allgather / Reduce_scatter_block: per-rank blocks of `count`; direct when the block is
        pack-aligned and fits one launch, else staged through padded [nranks, chunk] buffers."""
        import cupy

        n = self.size
        esize = call.recv.flat.itemsize
        epp = PACK // esize
        if gather:
            count = call.recv.count // n
            src = (call.recv.flat[self.rank * count:(self.rank + 1) * count] if call.in_place
                   else call.send.flat)
        else:
            count = call.recv.count // n if call.in_place else call.recv.count
            src = call.recv.flat if call.in_place else call.send.flat
        out = call.recv.flat
        lau = self._launcher(call.recv.dtype, kernel, region, loop=iters > 1)
        a = lau.args
        a.iters = iters
        # Allgather loops over its chunks inside one launch (allgatherLL); Reduce_scatter takes
        # one launch per cap_bytes
        fits = gather or count * esize <= cap_bytes
        direct = count % epp == 0 and fits and self._aligned(src) and self._aligned(out)
        if direct:
            a.in_, a.out, a.count = src.data.ptr, out.data.ptr, count
            lau(*self._grid(min(count, cap_bytes // esize) // epp), s)
            return
        step = max(epp, cap_bytes // esize // epp * epp)
        with cupy.cuda.ExternalStream(s):
            for c0 in range(0, max(count, 1), step):
                c = min(step, count - c0)
                cp = (c + epp - 1) // epp * epp
                if gather:
                    tin = cupy.zeros(cp, dtype=out.dtype)
                    tin[:c] = src[c0:c0 + c]
                    tout = cupy.empty((n, cp), dtype=out.dtype)
                else:
                    tin = cupy.zeros((n, cp), dtype=out.dtype)
                    tin[:, :c] = src.reshape(n, -1)[:, c0:c0 + c]
                    tout = cupy.empty(cp, dtype=out.dtype)
                a.in_, a.out, a.count = tin.data.ptr, tout.data.ptr, cp
                lau(*self._grid(cp // epp), s)
                if gather:
                    out.reshape(n, count)[:, c0:c0 + c] = tout[:, :c]
                else:
                    out[c0:c0 + c] = tout[:c]

    def _allgather(self, call: Call, algo: str, op, s: int, iters: int) -> None:
        L = self.layout
        self._blockwise(call, "hc_allgather_ll", (L.ll, L.sub_ll), S_LL, s, iters, gather=True)

    def _reduce_scatter_block(self, call: Call, algo: str, op, s: int, iters: int) -> None:
        L = self.layout
        if algo == "sentinel":
            region, cap = (L.ts1, L.sub_twoshot), S_TWOSHOT // self.size
        else:
            region, cap = (L.ll, L.sub_ll), S_LL
        self._blockwise(call, f"hc_reduce_scatter_{algo}_{OPS[op]}", region, cap, s, iters, gather=False)

    # -- groups (Communicator.group) ----------------------------------------------------
    def run_group(self, items) -> None:
        """A group's calls, in order: every run of consecutive Allreduce calls that can share a
        launch (_group_run) as one one-shot launch over their buffers laid end to end, any other
        call as usual.  items: (call, deterministic, algorithm, stream) tuples."""
        i = 0
        while i < len(items):
            j, algo = self._group_run(items, i)
            if algo is None:
                self.run(*items[i])
            else:
                self._launch_group(items[i:j], algo)
            i = j

    def _groupable(self, call: Call, algorithm: str) -> bool:
        return (call.name == "Allreduce" and algorithm in ("auto",) + GROUP_ALGOS and call.recv.count > 0
                and call.recv.device == self.device_id
                and self._aligned(call.send.flat) and self._aligned(call.recv.flat))

    def _group_run(self, items, i: int) -> tuple[int, str | None]:
        """(j, algorithm): items[i:j] share one launch, or (i + 1, None).  They share it when
        they are Allreduce calls with the same dtype, op, policy, algorithm argument and stream,
        16-byte-aligned, at most GROUP_MAX, independent (no call's recvbuf overlaps another
        call's sendbuf or recvbuf), and the algorithm chosen for their total bytes is a
        one-shot that carries them in one launch."""
        call, det, algorithm, stream = items[i]
        if not self._groupable(call, algorithm):
            return i + 1, None
        key = (call.recv.dtype, call.op.name, det, algorithm, _stream_ptr(stream))
        spans: list[tuple[int, int, bool]] = []  # (lo, hi, written) of the run's buffers
        sizes: list[int] = []  # bytes each call takes in the launch (whole packs)
        total = 0
        for c, d, a, st in items[i:i + GROUP_MAX]:
            if sizes and not (self._groupable(c, a) and (c.recv.dtype, c.op.name, d, a, _stream_ptr(st)) == key):
                break
            nbytes = _packs(c.recv.flat) * PACK
            if total + nbytes > S_ONESHOT:
                break
            out = (c.recv.flat.data.ptr, c.recv.flat.data.ptr + c.recv.flat.nbytes)
            inp = (c.send.flat.data.ptr, c.send.flat.data.ptr + c.send.flat.nbytes)
            if any(lo < out[1] and out[0] < hi for lo, hi, _ in spans) or \
                    any(w and lo < inp[1] and inp[0] < hi for lo, hi, w in spans):
                break  # not independent of the calls before it
            spans += [(*out, True), (*inp, False)]
            sizes.append(nbytes)
            total += nbytes
        while len(sizes) >= 2:
            algo = self.resolve("Allreduce", call.recv.dtype, call.op.name, total, det, algorithm)
            if algo in GROUP_ALGOS and total <= self.layout.allreduce[algo][0]:
                return i + len(sizes), algo
            total -= sizes.pop()
        return i + 1, None

    def _launch_group(self, calls, algo: str) -> None:
        """One launch of hc_allreduce_<algo>_<op>_group over these calls (_group_run's run)."""
        call, _det, _algorithm, stream = calls[0]
        self.check_error()
        s = _stream_ptr(stream)
        dtype, op = call.recv.dtype, call.op.name
        base, _cap = self._allreduce_launcher(dtype, algo, op)
        a = Args.from_buffer_copy(base.args)
        a.in_ = a.out = None
        a.count, a.iters = 0, 1
        g = Group(n=len(calls))
        packs = 0
        for j, (c, *_rest) in enumerate(calls):
            g.start[j], g.in_[j], g.out[j], g.count[j] = packs, c.send.flat.data.ptr, c.recv.flat.data.ptr, c.recv.count
            packs += _packs(c.recv.flat)
        g.start[len(calls)] = packs
        fn = self._module(dtype).fn(f"hc_allreduce_{algo}_{OPS[op]}_group")
        Launcher(fn, a, pdl=self.pdl, extra=g)(*self._grid(packs), s)
        if self._engines:
            self._pending.add(s)

    # -- the eager engines (hpccoll/_engine.py, cuda/persistent.cu) ------------------
    def _engine_for(self, call: Call, algorithm: str):
        """The running engine that takes this call, or None (then it is launched as usual)."""
        if call.name != "Allreduce" or algorithm not in ENGINE_ALGOS:
            return None
        entry = self._engines.get(call.recv.dtype)
        if entry is None:
            return None
        eng = entry[0]  # (the callers have checked the buffers' GPU)
        send, recv = call.send.flat, call.recv.flat
        if not eng.running or not 0 < recv.nbytes <= eng.max_bytes:
            return None
        if not (self._aligned(send) and self._aligned(recv)):
            return None
        return eng

    def _free_regions(self) -> list[int]:
        """The engine regions no running engine uses."""
        used = {k for _, k in self._engines.values()}
        return [k for k in range(ENGINES) if k not in used]

    def start_engine(self, dtype: str, blocks: int, max_bytes: int, order: str = "stream",
                     verify: bool = False) -> None:
        """Start the eager engine for `dtype` (collective; arguments validated by the caller).
        order: "stream" (every call waits for its stream first) or "caller" (the caller has;
        verify: check that it has, on every call)."""
        self.check_error()
        mine = (dtype, blocks, max_bytes, order)
        theirs = self.comm.allgather(mine)
        if any(t != mine for t in theirs):
            raise ValueError("start_persistent: ranks passed different (dtype, blocks, max_bytes, order): "
                             + "; ".join(f"rank {r}: {t}" for r, t in enumerate(theirs)))
        if dtype in self._engines:
            raise ValueError(f"start_persistent: an engine for {dtype} already runs on this communicator")
        if not self._free_regions():
            raise ValueError(f"start_persistent: at most {ENGINES} engines (dtypes) run at once; "
                             "stop_persistent one first")
        per_rank = self._min_sms // self.ranks_per_gpu
        used = sum(e.blocks for e, _ in self._engines.values())
        if per_rank - used - blocks < 1:
            raise ValueError(f"start_persistent: blocks={blocks}: with {self.ranks_per_gpu} rank(s) per GPU "
                             f"of {self._min_sms} SMs and {used} engine block(s) running, at most "
                             f"{per_rank - used - 1} more leave an SM for the collective kernels: pass fewer")
        # Kernels are loaded lazily by default (CUDA_MODULE_LOADING=LAZY), and loading one may
        # synchronize the context, which would wait for a running engine forever.  So every
        # kernel hpccoll may launch while engines run is loaded now, with no engine running:
        # the running ones are stopped and restarted around it (the same on every rank).
        running = [(d, e.blocks, e.max_bytes, e.order, e.verify) for d, (e, _) in self._engines.items()]
        self.stop_engines()
        self._module(dtype)
        if self.fuser is not None:
            self._module(dtype, loop=True)  # the chains of captured calls (hpccoll/_fuse.py)
        self._engine_module(dtype)
        self._preload()  # (hc_engine included)
        specs = running + [(dtype, blocks, max_bytes, order, verify)]
        import cupy

        for k, spec in enumerate(specs):  # engine k runs in region k, its slots at rest for its dtype
            self.ws.view(self.layout.engine[k], self.layout.engine_bytes, np.uint32).fill(engine_rest(spec[0]))
        cupy.cuda.runtime.deviceSynchronize()  # (no engine runs now)
        self.comm.Barrier()  # every rank's regions are at rest and its earlier kernels were queued
        for k, spec in enumerate(specs):
            self._launch_engine(k, *spec)

    def _preload(self) -> None:
        """cuModuleGetFunction (which loads a kernel) of every kernel of every module loaded here."""
        for (device, source, dtype, extra), mod in list(_MODULES.items()):
            if device == self.device_id:
                names = ("hc_engine",) if source == "persistent.cu" else kernel_names(dtype, LOOP_FENCE in extra)
                for name in names:
                    mod.fn(name)

    def _launch_engine(self, k: int, dtype: str, blocks: int, max_bytes: int, order: str, verify: bool) -> None:
        a = self.ws.kernel_args(self.timeout_ns)
        a.region, a.sub = self.layout.engine[k], self.layout.sub_engine
        if self._engine_host == 0:
            import cupy

            self._engine_host = cupy.cuda.runtime.hostAlloc(HOST_BYTES * ENGINES, 2)  # mapped; freed in free()
        eng = Engine(self._engine_module(dtype).fn("hc_engine"), a, blocks, self._engine_epochs[k], max_bytes,
                     self.timeout_ns / 1e9, self.ws.host_error, self._engine_host + HOST_BYTES * k,
                     np_dtype(dtype).itemsize, order, verify)
        self._engines[dtype] = (eng, k)
        self._set_cap()

    def _set_cap(self) -> None:
        """Launches leave the engines' SMs free: the whole grid must be resident."""
        used = sum(e.blocks for e, _ in self._engines.values())
        self.grid_cap = min(self._base_cap, self._min_sms // self.ranks_per_gpu - used)

    def stop_engine(self, dtype: str) -> None:
        entry = self._engines.pop(dtype, None)
        if entry is None:
            raise ValueError(f"stop_persistent: no engine runs for {dtype} on this communicator")
        eng, k = entry
        self._engine_epochs[k] += eng.stop()
        self._set_cap()

    def stop_engines(self) -> None:
        for dtype in list(self._engines):
            self.stop_engine(dtype)

    def engines(self) -> dict[str, Engine]:
        return {d: e for d, (e, _) in self._engines.items()}

    def barrier(self, stream=None, iters: int = 1, sync: bool = True) -> None:
        self.check_error()
        lau = self._launcher("float32", "hc_barrier", (0, 0), loop=iters > 1)
        lau.args.iters = iters
        s = _stream_ptr(stream)
        lau(1, 32, s)
        if self._engines:
            self._pending.add(s)
        if sync:
            self.synchronize(stream)

    def free(self) -> None:
        import cupy

        try:
            self.stop_engines()
            cupy.cuda.runtime.deviceSynchronize()
            if self._engine_host:
                cupy.cuda.runtime.freeHost(self._engine_host)
                self._engine_host = 0
            if self._nccl is not None:
                self._nccl.free()
            if self.fuser is not None:
                self.fuser.forget()  # (its nodes' parameter blocks)
        finally:
            self.comm.Barrier()  # no peer may still be writing into a workspace we unmap
            self.ws.free()
            self.node.Free()

