"""The CUDA backend's kernels: compiled modules, their entry points, reusable launchers, and
the launch configuration (grid) rule.

Every module is built for the communicator's rank count (HC_NRANKS, hc_common.cuh's nranksOf):
the kernels then keep no code for other counts.  Loaded modules are shared by the process's
communicators; compiling is cached on disk (nvrtc.py)."""
from __future__ import annotations

from ..._abi import PACK, Args, const
from .driver import Launcher, Module
from .nvrtc import compile_module

LOOP_FENCE = "-DHC_LOOP_FENCE=1"  # the define of the in-kernel loop module (collectives.cu, loopFence)
OPS = {"SUM": "sum", "PROD": "prod", "MAX": "max", "MIN": "min"}
MAX_THREADS = const("HC_MAX_THREADS")
MAX_GRID = 128  # blocks per launch at most (every block of a collective must be resident)
_MODULES: dict[tuple, Module] = {}  # (device, source, dtype, compile defines) -> loaded kernels
INTEGERS = ("int32", "int64")


def kernel_names(dtype: str, loop: bool = False) -> set[str]:
    """Every entry point of cuda/collectives.cu's module for dtype (sentinel and LL128 need
    floats); loop: of the in-kernel loop module, which also holds the chains (fusion.py)."""
    names = {"hc_bcast_ll", "hc_allgather_ll", "hc_alltoall_ll", "hc_barrier"}
    for op in OPS.values():
        names |= {f"hc_allreduce_oneshot_ll_{op}", f"hc_allreduce_twoshot_ll_{op}", f"hc_reduce_scatter_ll_{op}"}
        if dtype not in INTEGERS:
            names |= {f"hc_allreduce_oneshot_sentinel_{op}", f"hc_allreduce_twoshot_sentinel_{op}",
                      f"hc_reduce_scatter_sentinel_{op}"}
    oneshots = [n for n in names if n.startswith("hc_allreduce_oneshot_")]
    names |= {f"{n}_group" for n in oneshots}
    if loop:
        names |= {f"{n}_chain" for n in oneshots}
    if dtype not in INTEGERS:
        names.add("hc_allreduce_twoshot_ll128_sum")
    return names


def grid_block_cap(devices, sms) -> tuple[int, int]:
    """(most ranks on one GPU, blocks per collective launch) from every rank's GPU and its SM
    count: the same on every rank, whatever GPU the caller has.  The whole grid must be
    resident (spinning blocks wait for their peers): at most one 512-thread block per SM
    (<= 128 registers a thread fill an SM's register file), the SMs of the fewest-SM GPU shared
    by the most ranks any GPU serves, and at most MAX_GRID blocks."""
    devices = list(devices)
    per_gpu = max(devices.count(d) for d in devices)
    return per_gpu, max(1, min(MAX_GRID, *sms) // per_gpu)


class Kernels:
    """The modules and launchers of one CudaBackend (launch configurations must be the same on
    every rank: the same thread handles pack p, and Bcast's block b waits for block b of every
    peer, so the grid comes from values every rank shares)."""

    def __init__(self, device_id: int, arch: str, nranks: int, args: Args, pdl: bool, small_block: int):
        self.device_id, self.arch, self.pdl = device_id, arch, pdl
        self.defines = (f"-DHC_NRANKS={nranks}",)
        self.base_args = args  # workspace, timeout, error word, rank: every launcher's copy starts here
        self.small_block = small_block
        self.grid_cap = 1  # set by the backend (grid_block_cap, minus the engines' blocks)
        self._launchers: dict[tuple, Launcher] = {}

    # -- modules ---------------------------------------------------------------------------
    def module(self, dtype: str, loop: bool = False) -> Module:
        """The kernels for dtype; loop=True: the module for in-kernel loops (iters > 1, the
        benchmark's in-kernel mode) and the captured chains, with a fence between iterations."""
        # No MPI inside a collective: a rank whose peer never arrives must reach the kernel's
        # bounded poll, not hang in a barrier.  Ranks compiling at once is safe: the disk cache
        # is written atomically.
        return self._load("collectives.cu", dtype, self.defines_for(loop))

    def defines_for(self, loop: bool = False) -> tuple[str, ...]:
        """The compile defines of collectives.cu's launched (loop=False) or loop module."""
        return self.defines + ((LOOP_FENCE,) if loop else ())

    def loaded(self, dtype: str, loop: bool = False) -> bool:
        """Is collectives.cu's module for dtype (launched or loop) loaded on this device?"""
        return (self.device_id, "collectives.cu", dtype, self.defines_for(loop)) in _MODULES

    def engine_module(self, dtype: str) -> Module:
        return self._load("persistent.cu", dtype, self.defines)

    def _load(self, source: str, dtype: str, extra: tuple[str, ...]) -> Module:
        key = (self.device_id, source, dtype, extra)
        mod = _MODULES.get(key)
        if mod is None:
            mod = _MODULES[key] = Module(compile_module(source, dtype, self.arch, extra))
        return mod

    def preload(self) -> None:
        """cuModuleGetFunction (which loads a kernel) of every kernel of every module loaded
        here: a lazily loaded kernel may synchronize the context, which waits for a running
        eager engine forever."""
        for (device, source, dtype, extra), mod in list(_MODULES.items()):
            if device == self.device_id:
                names = ("hc_engine",) if source == "persistent.cu" else kernel_names(dtype, LOOP_FENCE in extra)
                for name in names:
                    mod.fn(name)

    # -- launchers ---------------------------------------------------------------------------
    def launcher(self, dtype: str, kernel: str, region, region2=(0, 0), loop: bool = False) -> Launcher:
        """A reusable launcher of `kernel` over (region, sub) [and (region2, sub2)]."""
        key = (dtype, kernel, loop)
        lau = self._launchers.get(key)
        if lau is None:
            a = Args.from_buffer_copy(self.base_args)
            a.region, a.sub = region
            a.region2, a.sub2 = region2
            lau = self._launchers[key] = Launcher(self.module(dtype, loop).fn(kernel), a, pdl=self.pdl)
        return lau

    def grid(self, work_items: int, threads_per_item: int = 1) -> tuple[int, int]:
        """(blocks, threads): one thread per 16-byte pack up to the block cap, then loop.
        Launches that fit the cap in blocks of small_block threads use those, on more SMs."""
        threads_needed = max(32, work_items * threads_per_item)
        limit = self.small_block if threads_needed <= self.grid_cap * self.small_block else MAX_THREADS
        block = min(limit, (threads_needed + 31) // 32 * 32)
        blocks = min(self.grid_cap, (threads_needed + block - 1) // block)
        return blocks, block


def packs_of(nbytes: int) -> int:
    """16-byte packs of `nbytes` (the last one partial)."""
    return (nbytes + PACK - 1) // PACK


def packs(flat) -> int:
    """16-byte packs of a buffer: its slots in a one-shot launch."""
    return packs_of(flat.nbytes)


def aligned(flat) -> bool:
    """Kernels read and write 16-byte packs: unaligned user buffers go through aligned copies."""
    return flat.data.ptr % PACK == 0


def aligned_copy(flat, s: int, fill: bool = True):
    """A fresh (so aligned) contiguous device array like `flat`, holding its values if `fill`,
    on stream `s`.  Copies here and in copy_to are the copy engine's (cudaMemcpyAsync), not a
    kernel: nothing to load while an eager engine runs (loading a module may wait for it)."""
    import cupy

    with cupy.cuda.ExternalStream(s):
        tmp = cupy.empty(flat.shape, flat.dtype)
    if fill:
        copy_to(tmp, flat, s)
    return tmp


def through_aligned_copy(send, recv, s: int, run) -> bool:
    """A single-buffer call (Allreduce, Bcast, the engine's Allreduce) whose buffers are not
    16-byte aligned: run(tmp) in place on an aligned copy of `send`, then recv[...] = tmp, both
    on stream `s`; False, and no copy back, when run returns False (a poll timed out)."""
    tmp = aligned_copy(send, s)
    if run(tmp) is False:
        return False
    copy_to(recv, tmp, s)
    return True


def copy_to(dst, src, s: int) -> None:
    """dst[...] = src for contiguous device arrays of the same bytes, on stream `s`."""
    import cupy

    cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, 3, s)  # device to device
