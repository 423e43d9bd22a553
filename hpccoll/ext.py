"""The device-extension API: write your own collective kernel on hpccoll's LLBuffer primitives.

A custom collective (a fused allreduce + bias + residual, an allreduce with a norm, a solver's
column step) is a few dozen lines of CUDA on the headers hpccoll's own kernels use:
cuda/ll_buffer.cuh (LLBuffer<Proto>: send, bcast, recv, recvReduce, reset, epochBegin /
epochEnd, bounded polls) and the protocols proto_sentinel.cuh, proto_ll.cuh, proto_ll128.cuh.
This module gives such a kernel what it needs from a Communicator, and nothing private:

    sym = hpccoll.ext.SymmetricMemory(comm, nbytes)      # collective: mapped on every rank
    mod = cupy.RawModule(code=src, options=hpccoll.ext.compile_options("float32", comm.size))
    kern = mod.get_function("my_collective")
    args = sym.kernel_args(region=sym.data_offset, sub=..., count=n)   # struct Args, by value
    kern((blocks,), (threads,), (args, x, y, ...))                     # blocks <= max_blocks(comm)
    sym.check()                                          # after a sync: CollectiveTimeout if a poll gave up

The rules a kernel must keep (the library's kernels keep them too; docs/design.md explains why):
- Every block of the grid must be resident at once (blocks poll their peers' blocks): launch at
  most `max_blocks(comm)` blocks of at most 512 threads, the same grid on every rank, and the
  same thread-to-slot mapping on every rank.
- One collective per epoch: read the epoch with epochBegin(a) and end with epochEnd(a, e, used);
  the counter lives in the SymmetricMemory's control region (on the device, so CUDA graph
  replays advance it), separate from the communicator's own collectives.
- Double buffering is the credit: in every epoch each rank must hear from every peer (directly
  or through a rank that did), as Allreduce does.  Sentinel slots must be armed before the first
  use (`arm`) and are re-armed by recv.
- Only one kernel on this SymmetricMemory in flight at a time, in the same order on every rank.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from ._abi import CTRL_BYTES, DTYPE_CODES, MAX_RANKS, PACK, SENTINEL_U32, Args, const, cuda_dir
from .backends.base import release_together
from .errors import HpccollError

DATA_ALIGN = 1024  # the data region and its sub-buffers start on 1 KiB (LL slot groups)


def include_dir() -> Path:
    """The folder of hpccoll's device headers (hc_abi.h, hc_common.cuh, ll_buffer.cuh, proto_*.cuh)."""
    return cuda_dir()


def compile_options(dtype: str = "float32", nranks: int | None = None) -> tuple[str, ...]:
    """NVRTC options (CuPy RawModule `options=`) for a kernel on the headers: the include path,
    the element type T of `Pack` (HC_DTYPE), the rank count as a constant when given (the
    protocols then keep no code for other counts), C++17, and no fused multiply-add (results
    round every step as the host's reference does)."""
    if dtype not in DTYPE_CODES:
        raise ValueError(f"compile_options: dtype={dtype!r}: use one of {', '.join(DTYPE_CODES)}")
    from .backends.cuda.nvrtc import base_options

    opts = base_options(dtype)
    if nranks is not None:
        if not 1 <= int(nranks) <= MAX_RANKS:
            raise ValueError(f"compile_options: nranks={nranks}: hpccoll's kernels support 1..{MAX_RANKS} ranks")
        opts.append(f"-DHC_NRANKS={int(nranks)}")
    return tuple(opts)


def compile_cubin(source, options=(), arch: str = "sm_90", name: str = "kernel.cu") -> bytes:
    """Compile CUDA source (text, bytes, or a path) with NVRTC for `arch`, with `options` (e.g.
    compile_options(...)), and return the cubin.  Needs no GPU: for checking extension kernels
    in CI.  Raises HpccollError with NVRTC's log when the source does not compile."""
    from .backends.cuda.nvrtc import compile_source

    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and source.endswith((".cu", ".cuh"))):
        name, source = Path(source).name, Path(source).read_bytes()
    src = source.encode() if isinstance(source, str) else bytes(source)
    return compile_source(src, name, [f"--gpu-architecture={arch}", *options])


def _device_backend(comm, what: str):
    comm._live(what)
    caps = comm.capabilities
    if not caps.extension:
        raise HpccollError(f"{what}: needs a communicator on hpccoll's single-node cuda backend "
                           f"(this one's backend is {comm.backend!r}): open it with backend='cuda'")
    return comm._backend


def max_blocks(comm) -> int:
    """The most blocks a kernel on this communicator may launch: every block must be resident,
    with the ranks that share a GPU and a running eager engine's SMs taken into account (the same
    value on every rank)."""
    return _device_backend(comm, "max_blocks").grid_cap


def ranks_per_gpu(comm) -> int:
    """The most ranks any GPU of this communicator serves (MPS or several processes per GPU)."""
    return _device_backend(comm, "ranks_per_gpu").ranks_per_gpu


class SymmetricMemory:
    """`nbytes` of device memory on every rank of a cuda communicator, mapped into every peer
    over CUDA IPC (collective), behind a control region of its own (epoch counters, abort flag,
    error record).  `peers[r]` is rank r's base address; the data region starts at
    `data_offset` on every rank."""

    def __init__(self, comm, nbytes: int):
        b = _device_backend(comm, "SymmetricMemory")
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"SymmetricMemory: nbytes={nbytes!r}: pass a non-negative int")
        from .backends.cuda.workspace import Workspace

        self._comm = comm
        self._mpi = comm.mpi_comm
        self.rank, self.nranks = comm.rank, comm.size
        self.data_offset = -(-CTRL_BYTES // DATA_ALIGN) * DATA_ALIGN
        self.nbytes = nbytes
        self._timeout_ns = b.timeout_ns
        self._ws = Workspace(self._mpi, self.data_offset + -(-max(nbytes, 1) // DATA_ALIGN) * DATA_ALIGN)
        self._ws.probe_peers(self._mpi)
        self.peers = tuple(self._ws.peers)
        self._freed = False

    def _live(self, what: str):
        if self._freed:
            raise HpccollError(f"SymmetricMemory.{what}: this memory was freed")

    def view(self, offset: int, nbytes: int, dtype=np.uint8):
        """A CuPy array over this rank's bytes [data_offset + offset, + nbytes)."""
        self._live("view")
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"SymmetricMemory.view: [{offset}, {offset + nbytes}) is outside the "
                             f"{self.nbytes} bytes of the data region")
        return self._ws.view(self.data_offset + offset, nbytes, dtype)

    def arm(self, offset: int = 0, nbytes: int | None = None, protocol: str = "sentinel") -> None:
        """Put slots at rest for `protocol` ("sentinel": the sentinel word; "ll" / "ll128": zero),
        then wait for the device (collective: every rank's slots are at rest before any rank writes
        into them)."""
        import cupy

        self._live("arm")
        nbytes = self.nbytes - offset if nbytes is None else nbytes
        if protocol not in ("sentinel", "ll", "ll128"):
            raise ValueError(f"SymmetricMemory.arm: protocol={protocol!r}: use 'sentinel', 'll' or 'll128'")
        if nbytes % 4 or offset % 4:
            raise ValueError("SymmetricMemory.arm: offset and nbytes must be multiples of 4")
        self.view(offset, nbytes, np.uint32).fill(SENTINEL_U32 if protocol == "sentinel" else 0)
        cupy.cuda.runtime.deviceSynchronize()
        self._mpi.Barrier()

    def kernel_args(self, *, region: int | None = None, sub: int = 0, region2: int = 0, sub2: int = 0,
                    count: int = 0, root: int = 0, inp: int = 0, out: int = 0) -> np.ndarray:
        """`struct Args` (cuda/hc_abi.h) for a kernel on this memory, as a one-element numpy array
        that CuPy passes by value: every rank's base, this rank and the rank count, the poll
        bound and the error word, plus the fields given here.  `region` (default data_offset) and
        `region2` are byte offsets from each rank's base; `sub`, `sub2` the bytes of one (parity,
        source) sub-buffer of them; `inp` / `out` raw device pointers (or 0)."""
        self._live("kernel_args")
        a = self._ws.kernel_args(self._timeout_ns)
        a.region = self.data_offset if region is None else region
        a.sub, a.region2, a.sub2 = sub, region2, sub2
        a.count, a.root, a.in_, a.out = count, root, inp or None, out or None
        arr = np.zeros(1, dtype=np.dtype(Args))
        ctypes.memmove(arr.ctypes.data, ctypes.addressof(a), ctypes.sizeof(a))
        return arr

    def epoch(self, block: int = 0) -> int:
        """This rank's epoch counter of `block` (collectives run on this memory so far), read
        from the device: for tests and debugging."""
        self._live("epoch")
        val = np.zeros(1, dtype=np.uint64)
        self._ws.rt.memcpy(val.ctypes.data, self._ws.ptr + const("HC_OFF_EPOCHS") + 8 * block, 8, 4)
        return int(val[0])

    def check(self) -> None:
        """Raise CollectiveTimeout when a poll of a kernel on this memory gave up (read the error
        word after synchronizing the kernel's stream)."""
        self._live("check")
        if self._ws.host_error():
            raise self._ws.timeout_error(self.rank, "a kernel on SymmetricMemory", "user kernel",
                                         "This memory is unusable: free it")

    def free(self) -> None:
        """Release the memory (collective: no peer may still write into it).  After a poll gave
        up (check() raises) the wait for the peers is bounded by the timeout; past it the memory
        is left to the end of the process."""
        if self._freed:
            return
        self._freed = True
        within = self._timeout_ns / 1e9 if self._ws.host_error() else None
        release_together(self._mpi, self._ws.free, within, "SymmetricMemory.free")

    def __repr__(self) -> str:
        state = "freed" if self._freed else f"{self.nbytes} bytes at offset {self.data_offset}"
        return f"<hpccoll.ext.SymmetricMemory rank {self.rank}/{self.nranks}: {state}>"


__all__ = ["SymmetricMemory", "compile_cubin", "compile_options", "include_dir", "max_blocks", "ranks_per_gpu", "PACK"]
