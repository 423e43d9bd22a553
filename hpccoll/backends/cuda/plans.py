"""Prepared launches: a repeated call (the Communicator's fast path, persistent requests) issued
without validation, algorithm choice or argument packing, as one driver call."""
from __future__ import annotations

from ..._abi import OP_CODES, Args
from ..._validate import Call
from . import launch
from .driver import Launcher
from .kernels import aligned
from ..streams import stream_ptr


class FastLaunch:
    """One prepared kernel launch: `launch(stream)` = error check + one driver call.  `fuse`:
    the backend's `fused` arguments where the call may join a captured chain (fusion.py)."""

    __slots__ = ("backend", "launcher", "grid", "block", "fuse")

    def __init__(self, backend, launcher: Launcher, grid: tuple[int, int], fuse=None):
        self.backend, self.launcher = backend, launcher
        self.grid, self.block = grid
        self.fuse = fuse

    def launch(self, stream) -> None:
        backend = self.backend
        backend.check_error()
        s = stream_ptr(stream)
        if self.fuse is not None and s and backend.is_capturing(s) and backend.fused(s, *self.fuse):
            return
        self.launcher(self.grid, self.block, s)
        if backend.engines.active:
            backend.engines.pending.add(s)


class EnginePlan:
    """FastLaunch's counterpart for a call a running engine takes: posted to the engine, or
    launched as usual (`fallback`) while the stream is being captured into a graph."""

    __slots__ = ("backend", "engine", "call", "nb", "fallback", "_ws", "_current")

    def __init__(self, backend, engine, in_ptr, out_ptr, count, op, fallback: FastLaunch):
        import cupy

        self.backend, self.engine, self.fallback = backend, engine, fallback
        self.call = (in_ptr, out_ptr, count, OP_CODES[op])
        self.nb = engine.blocks_for(count)
        self._ws = backend.ws
        self._current = cupy.cuda.get_current_stream

    def launch(self, stream) -> None:
        # The hot path of a blocking call: attribute reads, no Python frames but the engine's.
        backend = self.backend
        if backend.broken or self._ws.err_word.value:
            backend.check_error()
        s = self._current().ptr if stream is None else stream_ptr(stream)
        eng = self.engine
        if not eng.running or (s and eng.capturing(s)):
            self.fallback.launch(stream)
            return
        if not eng.call_cmd(self.call, s, self.nb):
            backend.check_error()  # a poll timed out: raises CollectiveTimeout with its record


def make_plan(b, call: Call, route):
    """A FastLaunch repeating exactly this call as its route says, without re-validating it (an
    EnginePlan where a running engine takes it), or None when the call needs more than one kernel launch (staging,
    chunking) or another collective."""
    flat = call.recv.flat
    if call.recv.device != b.device_id or not (aligned(flat) and aligned(call.send.flat)):
        return None
    esize, n = flat.itemsize, flat.size
    op = call.op.name if call.op else None
    algo = route.algorithm
    if algo == "nccl":
        return None
    eng = b.engines.for_call(call, route.requested)
    fuse = None
    if call.name == "Allreduce":
        lau, cap = launch.allreduce_launcher(b.site, call.recv.dtype, algo, op)
        if n * esize > cap:
            return None
        grid = launch.allreduce_grid(b.site, algo, n, esize)
        chain = route.chain
        if chain is not None:
            fuse = (call.recv.dtype, chain, op, call.send.flat.data.ptr, flat.data.ptr, n)
    elif call.name == "Bcast":
        lau = launch.bcast_launcher(b.site, call.recv.dtype)
        grid = launch.bcast_grid(b.site, n * esize)
    else:
        return None
    a = Args.from_buffer_copy(lau.args)  # its own parameter block: launches are one ctypes call
    a.in_, a.out, a.count, a.iters = call.send.flat.data.ptr, flat.data.ptr, n, 1
    a.root = call.root or 0
    fast = FastLaunch(b, Launcher(lau.fn, a, pdl=b.kernels.pdl), grid, fuse)
    if eng is not None:
        return EnginePlan(b, eng, call.send.flat.data.ptr, flat.data.ptr, n, op, fast)
    return fast
