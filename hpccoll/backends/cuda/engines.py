"""The eager engines of one CudaBackend: starting and stopping them (collectively), the regions
they run in, the SMs they keep (the launches' grid cap shrinks to leave them free), and which
calls they take (policy.engine_takes)."""
from __future__ import annotations

import numpy as np

from ... import policy
from ..._abi import SENTINEL_U32
from ...ops import np_dtype
from ..base import ranks_differ
from .engine import HOST_BYTES, Engine
from .kernels import INTEGERS, aligned, through_aligned_copy
from .workspace import ENGINES


def engine_rest(dtype: str) -> int:
    """The u32 pattern of an engine's slots at rest (cuda/persistent.cu, EngineProto): the
    sentinel for floating types, zero (LL) for integers."""
    return 0 if dtype in INTEGERS else SENTINEL_U32


class EngineSet:
    """The running engines (dtype -> (Engine, region index)) and the streams launched on while
    they run (`pending`: synchronize waits for those; engine calls return finished)."""

    def __init__(self, backend):
        self.b = backend
        self.active: dict[str, tuple[Engine, int]] = {}
        self.epochs = [0] * ENGINES  # epochs each engine region has consumed
        self.pending: set[int] = set()
        self._host = 0  # mapped host memory of the engines (HOST_BYTES each), freed in free()

    def note_launch(self, s: int) -> None:
        """A kernel was launched on stream s: while engines run, synchronize must wait for it."""
        if self.active:
            self.pending.add(s)

    def blocks_used(self) -> int:
        return sum(e.blocks for e, _ in self.active.values())

    def for_call(self, call, algorithm: str):
        """The running engine that takes this call, or None (then it is launched as usual)."""
        if not self.active:
            return None
        entry = self.active.get(call.recv.dtype)
        if entry is None:
            return None
        eng = entry[0]
        if not eng.running or not policy.engine_takes(call.name, algorithm, call.recv.flat.nbytes, eng.max_bytes):
            return None
        return eng  # (decided by values every rank shares: a peer launching instead would never meet it)

    @staticmethod
    def call(eng: Engine, call, op: str, s: int) -> bool:
        """Run `call` on the engine `for_call` gave (False: a poll timed out).  Buffers not
        16-byte aligned go through an aligned copy, which is on the stream before the call; the
        copy back is waited for, so the call stays blocking (its result final on return)."""
        send, recv = call.send.flat, call.recv.flat
        if aligned(send) and aligned(recv):
            return eng.call(send.data.ptr, recv.data.ptr, recv.size, op, s)
        import cupy

        def run(tmp) -> bool:
            cupy.cuda.runtime.streamSynchronize(s)  # (order="caller" calls find their stream idle)
            return eng.call(tmp.data.ptr, tmp.data.ptr, tmp.size, op, s)

        if not through_aligned_copy(send, recv, s, run):
            return False
        cupy.cuda.runtime.streamSynchronize(s)
        return True

    def start(self, dtype: str, blocks: int, max_bytes: int, order: str = "stream", verify: bool = False) -> None:
        """Start the eager engine for `dtype` (collective; arguments validated by the caller)."""
        b = self.b
        b.check_error()
        differ = ranks_differ(b.comm, (dtype, blocks, max_bytes, order))
        if differ:
            raise ValueError(f"start_persistent: ranks passed different (dtype, blocks, max_bytes, order): {differ}")
        if dtype in self.active:
            raise ValueError(f"start_persistent: an engine for {dtype} already runs on this communicator")
        if len(self.active) >= ENGINES:
            raise ValueError(f"start_persistent: at most {ENGINES} engines (dtypes) run at once; "
                             "stop_persistent one first")
        per_rank = b.min_sms // b.ranks_per_gpu
        used = self.blocks_used()
        if per_rank - used - blocks < 1:
            raise ValueError(f"start_persistent: blocks={blocks}: with {b.ranks_per_gpu} rank(s) per GPU "
                             f"of {b.min_sms} SMs and {used} engine block(s) running, at most "
                             f"{per_rank - used - 1} more leave an SM for the collective kernels: pass fewer")
        # Kernels are loaded lazily by default (CUDA_MODULE_LOADING=LAZY), and loading one may
        # synchronize the context, which would wait for a running engine forever.  So every
        # kernel hpccoll may launch while engines run is loaded now, with no engine running:
        # the running ones are stopped and restarted around it (the same on every rank).
        running = [(d, e.blocks, e.max_bytes, e.order, e.verify) for d, (e, _) in self.active.items()]
        self.stop_all()
        b.kernels.module(dtype)
        if b.fuser is not None:
            b.kernels.module(dtype, loop=True)  # the chains of captured calls (fusion.py)
        b.kernels.engine_module(dtype)
        b.kernels.preload()  # (hc_engine included)
        specs = running + [(dtype, blocks, max_bytes, order, verify)]
        import cupy

        for k, spec in enumerate(specs):  # engine k runs in region k, its slots at rest for its dtype
            b.ws.view(b.layout.engine[k], b.layout.engine_bytes, np.uint32).fill(engine_rest(spec[0]))
        cupy.cuda.runtime.deviceSynchronize()  # (no engine runs now)
        b.comm.Barrier()  # every rank's regions are at rest and its earlier kernels were queued
        for k, spec in enumerate(specs):
            self._launch(k, *spec)

    def _launch(self, k: int, dtype: str, blocks: int, max_bytes: int, order: str, verify: bool) -> None:
        b = self.b
        a = b.ws.kernel_args(b.timeout_ns)
        a.region, a.sub = b.layout.engine[k], b.layout.sub_engine
        if self._host == 0:
            import cupy

            self._host = cupy.cuda.runtime.hostAlloc(HOST_BYTES * ENGINES, 2)  # mapped
        eng = Engine(b.kernels.engine_module(dtype).fn("hc_engine"), a, blocks, self.epochs[k], max_bytes,
                     b.timeout_ns / 1e9, b.ws.host_error, self._host + HOST_BYTES * k,
                     np_dtype(dtype).itemsize, order, verify)
        self.active[dtype] = (eng, k)
        b.set_grid_cap()

    def stop(self, dtype: str) -> None:
        entry = self.active.pop(dtype, None)
        if entry is None:
            raise ValueError(f"stop_persistent: no engine runs for {dtype} on this communicator")
        eng, k = entry
        self.epochs[k] += eng.stop()
        self.b.set_grid_cap()

    def stop_all(self) -> None:
        for dtype in list(self.active):
            self.stop(dtype)

    def engines(self) -> dict[str, Engine]:
        return {d: e for d, (e, _) in self.active.items()}

    def free(self) -> None:
        """Stop every engine and release the mapped host memory (after a device synchronize)."""
        self.stop_all()
        if self._host:
            import cupy

            cupy.cuda.runtime.deviceSynchronize()
            cupy.cuda.runtime.freeHost(self._host)
            self._host = 0
