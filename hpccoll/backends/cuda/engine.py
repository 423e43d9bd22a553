"""The eager engine: a resident kernel (cuda/persistent.cu) that runs blocking Allreduce calls
posted through mapped host memory, with no kernel launch and no stream synchronize per call.

One engine per (communicator, dtype), started and stopped collectively by
`Communicator.start_persistent` / `stop_persistent` (or the `persistent()` context).  While it
runs, every eligible Allreduce (this dtype, device buffers (through an aligned copy where not
16-byte aligned), at most `max_bytes`, algorithm 'auto' or 'oneshot_ll', the stream not
capturing) is blocking: it waits until the caller's stream has completed, posts the call, and
returns when every block of the engine has finished it.  Results are the one-shot's: reduced in rank order, bitwise identical
on every rank.  Floating types travel on sentinel slots (as in the launched sentinel kernels, an
input NaN whose bits are the sentinel's arrives as the canonical NaN), integers on LL slots.

What the engine costs the rest of the program: it keeps `blocks` SMs busy (the collective
kernels' grid cap shrinks to leave them free where it must), and anything that synchronizes
the whole device waits for the engine, so it blocks until `stop_persistent`:
- cudaDeviceSynchronize, cudaFree, cudaFreeHost: synchronize streams instead;
- the first launch of a kernel that is not loaded yet: CUDA loads kernels lazily by default
  (CUDA_MODULE_LOADING=LAZY), and loading may synchronize the context.  hpccoll loads all of its
  own kernels before an engine starts; run your own kernels (CuPy's included) once before
  starting it.  CUDA_MODULE_LOADING=EAGER does not cover CuPy's, which compiles and loads each
  kernel's module at the kernel's first use (a first use inside an engine block hung so).
These are the hazards of any kernel that runs until told to stop."""
from __future__ import annotations

import ctypes
import time

from ..._abi import OP_CODES, PACK, Args, EngineArgs, const
from ...errors import CollectiveTimeout, HpccollError
from .driver import check, host_device_pointer, libcuda

# The engine's mapped host memory and its call rules, from cuda/hc_abi.h (HC_ENGINE_*).
HOST_BYTES = const("HC_ENGINE_HOST_BYTES")
DESC, DONE = const("HC_ENGINE_DESC_BYTE"), const("HC_ENGINE_DONE_BYTE")
MAX_BLOCKS = const("HC_ENGINE_MAX_BLOCKS")
FULL_RING = const("HC_ENGINE_FULL_RING")
CMD_STOP = const("HC_ENGINE_STOP")
BLOCK = const("HC_ENGINE_BLOCK")
PACKS_PER_THREAD = const("HC_ENGINE_PPT")  # before a call takes another block
PACKS_KEPT = const("HC_ENGINE_KEEP")  # the most a thread takes: max_bytes <= blocks * BYTES_PER_BLOCK
BYTES_PER_BLOCK = PACKS_KEPT * BLOCK * PACK
DEFAULT_BLOCKS = 4  # Communicator.start_persistent's blocks
_NOT_READY = 600  # CUDA_ERROR_NOT_READY (the driver's enum, not the kernels' ABI)


def validate_engine_args(blocks, max_bytes, order) -> None:
    """start_persistent's arguments (local, before any communication)."""
    from .workspace import S_ENGINE

    if isinstance(blocks, bool) or not isinstance(blocks, int) or not 1 <= blocks <= MAX_BLOCKS:
        raise ValueError(f"start_persistent: blocks={blocks!r}: pass an int from 1 to {MAX_BLOCKS}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 16 <= max_bytes <= S_ENGINE:
        raise ValueError(f"start_persistent: max_bytes={max_bytes!r}: pass an int from 16 to {S_ENGINE}")
    if max_bytes > blocks * BYTES_PER_BLOCK:
        need = -(-max_bytes // BYTES_PER_BLOCK)
        raise ValueError(f"start_persistent: max_bytes={max_bytes} needs blocks >= {need} (a block takes "
                         f"{BYTES_PER_BLOCK // 1024} KiB of a call): pass blocks={need} or a smaller max_bytes")
    if order not in ("stream", "caller"):
        raise ValueError(f"start_persistent: order={order!r}: pass 'stream' (each call waits for its "
                         "stream) or 'caller' (the caller synchronizes before each call)")


def _driver_fns():
    lib = libcuda()
    lib.cuStreamQuery.argtypes = [ctypes.c_void_p]
    lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
    return lib


class Engine:
    """One running engine kernel.  `call` is the hot path: a few driver calls and stores."""

    def __init__(self, fn, args: Args, blocks: int, epoch0: int, max_bytes: int, timeout_s: float,
                 host_error, host: int, esize: int = 4, order: str = "stream", verify: bool = False):
        """host: HOST_BYTES of mapped host memory, owned by the caller (freeing pinned memory
        synchronizes the device, so it must outlive every engine).  A call stores its fields
        (when they changed) and then the doorbells of the blocks it needs into that memory; each
        block polls its own over PCIe.
        order: Communicator.start_persistent's.  "stream": the host first asks whether the
        caller's stream has finished (cuStreamQuery, synchronizing if not).  "caller": the caller
        has finished the work that writes or reads the call's buffers (CUDA-aware MPI's
        contract), so the call is posted at once.  verify (caller order only): query anyway, and
        raise when the stream still had work (the communicator's check mode)."""
        import cupy

        self.blocks, self.max_bytes = blocks, max_bytes
        self.seq = 0
        self.calls = 0  # calls served (tests check the engine really ran them)
        self._timeout = timeout_s
        self._host_error = host_error
        self._lib = _driver_fns()
        self._host = host
        ctypes.memset(self._host, 0, HOST_BYTES)
        self._bells = [ctypes.c_uint64.from_address(self._host + 64 * b) for b in range(MAX_BLOCKS)]
        self._desc = (ctypes.c_uint64 * 4).from_address(self._host + DESC)
        self._done = [ctypes.c_uint64.from_address(self._host + DONE + 8 * b) for b in range(MAX_BLOCKS)]
        self._ver = 0  # desc's version (low 32 bits; the blocks start holding version 0)
        self.full_ring = FULL_RING  # (tests ring every block more often)
        self.esize = esize
        self._last = None  # the last call's (in, out, count, cmd): desc is rewritten only on change
        self.order, self.verify = order, verify and order == "caller"
        self._ordered = order == "stream"  # the stream query before posting
        self._query = cupy.cuda.runtime.streamQuery
        self._is_capturing = cupy.cuda.runtime.streamIsCapturing  # CuPy's binding: a direct C call (ctypes: ~1 us)
        # non-blocking: the legacy default stream must never wait for this kernel
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._args = Args.from_buffer_copy(args)
        self._args.iters = 1
        self._eargs = EngineArgs(host=host_device_pointer(self._host), seq0=0, epoch0=epoch0)
        params = (ctypes.c_void_p * 2)(ctypes.addressof(self._args), ctypes.addressof(self._eargs))
        check(self._lib.cuLaunchKernel(fn, blocks, 1, 1, BLOCK, 1, 1, 0, self.stream.ptr, params, None),
              "cuLaunchKernel(hc_engine)")
        self.running = True

    def capturing(self, stream: int) -> bool:
        if not stream:
            return False  # the legacy default stream cannot be captured (and asking costs 1 us)
        return self._is_capturing(stream) != 0

    def blocks_for(self, count: int) -> int:
        """The blocks a call of `count` elements needs (cuda/persistent.cu, blocksFor)."""
        per = PACKS_PER_THREAD * BLOCK
        need = ((count * self.esize + PACK - 1) // PACK + per - 1) // per
        return min(self.blocks, max(1, need))

    def call(self, in_ptr: int, out_ptr: int, count: int, op: str, stream: int) -> bool:
        """Run one Allreduce after `stream`'s earlier work; return when it has finished (True),
        or when a poll of the engine timed out (False: the caller raises from the error record)."""
        return self.call_cmd((in_ptr, out_ptr, count, OP_CODES[op]), stream, self.blocks_for(count))

    def call_cmd(self, call: tuple, stream: int, nb: int) -> bool:
        """`call` with its fields ready: (in, out, count, cmd), on `nb` blocks (the hot path:
        EnginePlan prepares them once)."""
        if self._ordered:
            res = self._query(stream)  # CuPy's binding: a direct C call (ctypes costs ~0.3 us more)
            if res:
                if res != _NOT_READY:
                    check(res, "cuStreamQuery")
                check(self._lib.cuStreamSynchronize(stream), "cuStreamSynchronize")
        elif self.verify:
            self._check_idle(stream)
        if not (self.seq + 1) & self.full_ring:  # every block, now and then: its 32-bit reads stay exact
            nb = self.blocks
        seq = self._post(call, nb)
        for d in self._done[:nb]:  # block by block: each a tight spin (done within microseconds)
            if d.value != seq:
                n = 2000
                while d.value != seq:
                    n -= 1
                    if not n:
                        if not self._wait(nb):
                            return False
                        break
        self.calls += 1
        return True

    def _check_idle(self, stream: int) -> None:
        """order="caller" under the check mode: the caller's stream must have no work left."""
        res = self._query(stream)
        if res == _NOT_READY:
            raise HpccollError(
                "start_persistent(order='caller'): a call was made while its stream still had "
                "unfinished work, which may write or read the call's buffers: synchronize the stream "
                "before the call (as CUDA-aware MPI requires), or start the engine with order='stream'")
        if res:
            check(res, "cuStreamQuery")

    def _post(self, call: tuple, nb: int) -> int:
        """Post the next call (in, out, count, cmd) to blocks 0..nb-1; its sequence number."""
        self.seq += 1
        seq = self.seq
        if call != self._last:  # a line nobody polls: these stores do not wait for the GPU's reads
            d = self._desc
            d[0], d[1], d[2], d[3] = call
            self._last = call
            self._ver = (self._ver + 1) & 0xFFFFFFFF
        w = (seq & 0xFFFFFFFF) << 32 | self._ver
        for b in self._bells[:nb]:  # x86: each seen after the desc stores
            b.value = w
        return seq

    def _finished(self, nb: int) -> bool:
        seq = self.seq
        return all(d.value == seq for d in self._done[:nb])

    def _wait(self, nb: int) -> bool:
        """Until blocks 0..nb-1 have finished call self.seq (after call_cmd's spins missed);
        False when a poll timed out."""
        deadline = time.perf_counter() + self._timeout + 5.0
        n = 0
        while not self._finished(nb):
            n += 1
            if n & 1023 == 0:
                if self._host_error():
                    self.running = False  # the blocks that timed out have left
                    return False
                if time.perf_counter() > deadline:
                    self.running = False
                    raise CollectiveTimeout(f"the eager engine did not finish an Allreduce within "
                                            f"{self._timeout + 5.0:.0f} s and raised no error: it is unusable")
        return True

    def stop(self) -> int:
        """Stop the kernel (waits for it to leave); the epochs it consumed."""
        if self._host:
            self._post((0, 0, 0, CMD_STOP), self.blocks)  # every block, waiting or not
            self.stream.synchronize()  # every block leaves at STOP, or left at a timeout
            self._host = 0
        self.running = False
        return self.seq - 1  # every call but the STOP consumed one epoch
