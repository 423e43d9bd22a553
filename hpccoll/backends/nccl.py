"""NCCL backend (through CuPy's NCCL bindings): the baseline hpccoll is measured against, and
the eigensolver's `--comm nccl` path.  Not deterministic; NCCL picks its own algorithms
(NVLink multicast stays off: NCCL_NVLS_ENABLE=0 is forced).

A missing peer leaves an NCCL kernel waiting forever, and whatever synchronizes with its
stream with it.  So every call queued outside a graph capture records an event before it and
one after, and a watchdog thread (as PyTorch's ProcessGroupNCCL has) aborts the NCCL
communicator when the oldest unfinished call of a stream has been waiting longer than the
timeout since the work before it on that stream finished: NCCL's kernels then return, the
waits on the stream end, and this communicator's next call (or `synchronize`) raises
CollectiveTimeout.  That CollectiveTimeout comes once ncclCommAbort has returned (or ABORT_WAIT_S
has passed, where a CUDA graph that captured this communicator's calls holds the abort back):
NCCL's kernels have stopped then, so no call of this communicator reads or writes the caller's
buffers after the exception, and a peer arriving late finds no partner (NCCL is gone) instead
of one whose buffers the caller has reused."""
from __future__ import annotations

import collections
import logging
import os
import threading
import time

from .._validate import Call
from ..errors import CollectiveTimeout, HpccollError
from .base import Backend, Capabilities, agreed_device, ranks_reasons, release_together
from .streams import stream_idle, stream_ptr, synchronize_stream
from .topology import ranks_sharing_gpus


log = logging.getLogger("hpccoll")
SPIN_S = 0.01  # synchronize's busy polling before it sleeps between polls
ABORT_WAIT_S = 10.0  # how long a CollectiveTimeout waits for the watchdog's ncclCommAbort to return


class Watchdog:
    """Which queued call has waited too long: per stream, the calls in the order queued, each
    with an event recorded before it (the work before it on its stream is done) and one after
    (the call is done).  `poll(now)` drops the finished calls and returns the first unfinished
    one whose start event was seen done more than `timeout` seconds ago (None if none): GPU work
    queued before a call, however long, never counts against it.  Events need only `.done`;
    those of finished calls go to `spare` for reuse.  Thread-safe for one thread calling `note`
    and one calling `poll`."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.queues: dict[int, collections.deque] = {}
        self.spare: collections.deque = collections.deque()  # (append / pop: atomic in CPython)
        self.lock = threading.Lock()

    def note(self, stream: int, start, end, name: str) -> None:
        with self.lock:
            self.queues.setdefault(stream, collections.deque()).append([start, end, name, None])

    def poll(self, now: float):
        """(name, waited seconds) of the first call past the timeout, else None."""
        with self.lock:
            for q in self.queues.values():
                while q and q[0][1].done:
                    start, end, _, _ = q.popleft()
                    self.spare.extend((start, end))
                if not q:
                    continue
                head = q[0]
                if head[3] is None:
                    if head[0].done:
                        head[3] = now  # its clock starts: the work before it has finished
                elif now - head[3] > self.timeout:
                    return head[2], now - head[3]
        return None

    def pending(self) -> bool:
        with self.lock:
            return any(self.queues.values())


def nccl_unavailable_reason() -> str | None:
    try:
        from cupy.cuda import nccl
    except Exception as exc:  # noqa: BLE001
        return f"cupy.cuda.nccl not importable ({exc})"
    if not getattr(nccl, "available", True):
        return "CuPy found no NCCL library (pip install nvidia-nccl-cu13)"
    return None


class NcclBackend(Backend):
    name = "nccl"
    caps = Capabilities(device=True, collectives=frozenset({"Allreduce", "Bcast", "Allgather",
                                                             "Reduce_scatter_block", "Alltoall"}),
                        groups=True, asynchronous=True)

    def __init__(self, mpi_comm, device, timeout: float):
        os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast on shared hosts
        # every rank comes to each agreement before any raises (a rank raising alone would leave
        # its peers waiting in the next exchange)
        why = ranks_reasons(mpi_comm, nccl_unavailable_reason())
        if why:
            raise HpccollError(f"Communicator: backend='nccl' is not available: {why}")
        import cupy
        from cupy.cuda import nccl
        from mpi4py import MPI

        node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
        local = node.Get_rank()
        node.Free()
        ndev = cupy.cuda.runtime.getDeviceCount()
        self.device_id = agreed_device(mpi_comm, device, local % ndev, ndev)
        cupy.cuda.Device(self.device_id).use()
        self.size, self.rank = mpi_comm.Get_size(), mpi_comm.Get_rank()
        # NCCL refuses two ranks on one GPU of one host (NCCL_ERROR_INVALID_USAGE, no reason
        # given): say which ranks share which GPU, on every rank alike
        shared = ranks_sharing_gpus(mpi_comm, self.device_id)
        if shared:
            raise HpccollError(f"Communicator: backend='nccl' needs one GPU per rank, and {shared}: use "
                               "backend='cuda' (hpccoll's kernels serve several ranks per GPU, under MPS) "
                               "or start one rank per GPU")
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = mpi_comm.bcast(uid, root=0)
        self.nccl = nccl
        try:
            self.comm = nccl.NcclCommunicator(self.size, uid, self.rank)
        except Exception as exc:  # noqa: BLE001 - CuPy's NcclError, whatever its module
            bus = cupy.cuda.Device(self.device_id).pci_bus_id
            raise HpccollError(f"Communicator: backend='nccl': NCCL could not open a communicator of "
                               f"{self.size} ranks on this rank's GPU {bus} ({exc}); "
                               "NCCL_DEBUG=WARN makes NCCL say why") from exc
        self.mpi = mpi_comm
        self.types = {"float64": nccl.NCCL_FLOAT64, "float32": nccl.NCCL_FLOAT32,
                      "float16": nccl.NCCL_FLOAT16, "int32": nccl.NCCL_INT32, "int64": nccl.NCCL_INT64}
        if hasattr(nccl, "NCCL_BFLOAT16"):
            self.types["bfloat16"] = nccl.NCCL_BFLOAT16
        self.ops = {"SUM": nccl.NCCL_SUM, "PROD": nccl.NCCL_PROD, "MAX": nccl.NCCL_MAX, "MIN": nccl.NCCL_MIN}
        self.timeout, self.broken, self.captured, self.releaser = timeout, None, False, None
        self.watch = True  # False: calls go unwatched (the benchmark's NCCL-itself eager timing)
        self._runtime = cupy.cuda.runtime
        self._new_event = lambda: cupy.cuda.Event(block=False, disable_timing=True)
        self.on_abort = None  # an owner's callback, given the reason before the watchdog aborts NCCL
        self.watchdog = Watchdog(timeout)
        self._stop = threading.Event()
        self._aborted = threading.Event()  # the watchdog's ncclCommAbort has returned
        self._thread = threading.Thread(target=self._watch, name="hpccoll-nccl-watchdog", daemon=True)
        self._thread.start()

    # -- the watchdog ----------------------------------------------------------------------------
    def _use_device(self) -> None:
        import cupy

        cupy.cuda.Device(self.device_id).use()  # (event queries in this thread)

    def _watch(self) -> None:
        self._use_device()
        period = min(0.05, self.timeout / 20)
        while not self._stop.wait(period):
            late = self.watchdog.poll(time.monotonic())
            if late is not None:
                name, waited = late
                self.broken = (f"{name}: an NCCL call did not finish {waited:.1f} s after the work before it on "
                               f"its stream (a peer missing or far behind); the NCCL communicator was aborted and "
                               f"this communicator is unusable: Free() it (raise HPCCOLL_TIMEOUT if ranks are "
                               f"legitimately that far apart)")
                log.error("hpccoll: %s", self.broken)
                if self.on_abort is not None:
                    self.on_abort(self.broken)
                self.comm.abort()  # NCCL's kernels return; waits on their streams end
                self._aborted.set()
                return

    def wait_aborted(self) -> None:
        """Once the watchdog has decided to abort: return when ncclCommAbort has (NCCL's kernels
        no longer touch the calls' buffers), or after ABORT_WAIT_S."""
        if self.broken and not self._aborted.wait(ABORT_WAIT_S):
            log.warning("hpccoll: ncclCommAbort has not returned %g s after the watchdog called it (a CUDA "
                        "graph that captured this communicator's calls may hold it back); NCCL kernels may "
                        "still run on the buffers of the calls that timed out", ABORT_WAIT_S)

    def _check(self) -> None:
        if self.broken:
            self.wait_aborted()
            raise CollectiveTimeout(self.broken)

    def _mark(self, s: int):
        """An event recorded on stream s now, before a call; None while s is captured into a
        graph (a replay is not a queued call, and an event recorded in a capture is a graph
        node) or while calls go unwatched."""
        if not self.watch:
            return None
        if s and self._runtime.streamIsCapturing(s):
            self.captured = True  # (NCCL now frees the communicator only after that graph: free)
            return None
        return self._record(s)

    def _record(self, s: int):
        spare = self.watchdog.spare
        ev = spare.pop() if spare else self._new_event()
        self._runtime.eventRecord(ev.ptr, s)  # (Event.record would wrap s in a Stream object first)
        return ev

    def _watch_call(self, s: int, start, name: str) -> None:
        """The call just queued on stream s after `start` (from _mark before it) goes to the
        watchdog, with an event recorded after it (no capture check: _mark just made it)."""
        if start is not None:
            self.watchdog.note(s, start, self._record(s), name)

    def run(self, call: Call, route, stream, iters: int = 1) -> None:
        self._check()
        s = stream_ptr(stream)
        start = self._mark(s)
        self._issue(call, s, iters)
        self._watch_call(s, start, call.name)

    def _issue(self, call: Call, s: int, iters: int) -> None:
        """Queue the call on stream s (no watchdog: run and run_group watch it)."""
        t = self.types.get(call.recv.dtype)
        if t is None:
            raise HpccollError(f"{call.name}: this NCCL build has no {call.recv.dtype}: use backend='cuda'")
        send, recv = call.send.flat, call.recv.flat
        size, rank = self.size, self.rank
        for _ in range(iters):
            if call.name == "Allreduce":
                self.comm.allReduce(send.data.ptr, recv.data.ptr, recv.size, t, self.ops[call.op.name], s)
            elif call.name == "Bcast":
                self.comm.bcast(recv.data.ptr, recv.size, t, call.root, s)
            elif call.name == "Allgather":
                n = recv.size // size
                src = recv[rank * n:] if call.in_place else send
                self.comm.allGather(src.data.ptr, recv.data.ptr, n, t, s)
            elif call.name == "Reduce_scatter_block":
                n = recv.size // size if call.in_place else recv.size
                self.comm.reduceScatter(send.data.ptr, recv.data.ptr, n, t, self.ops[call.op.name], s)
            elif call.name == "Alltoall":
                self._alltoall(call, t, s)

    def _alltoall(self, call: Call, t, s: int) -> None:
        """Pairwise sends and receives in one NCCL group (NCCL has no Alltoall of its own)."""
        import cupy

        size = self.size
        recv = call.recv.flat
        n = recv.size // size
        src = call.send.flat
        if call.in_place:
            with cupy.cuda.ExternalStream(s):
                src = recv.copy()
        esize = recv.itemsize
        self.nccl.groupStart()
        try:
            for peer in range(size):
                self.comm.send(src.data.ptr + peer * n * esize, n, t, peer, s)
                self.comm.recv(recv.data.ptr + peer * n * esize, n, t, peer, s)
        finally:
            self.nccl.groupEnd()

    def run_group(self, items, check: bool = False) -> None:
        """A group's calls inside ncclGroupStart / ncclGroupEnd: NCCL issues them together."""
        self._check()
        ptrs = [stream_ptr(item[2]) for item in items]
        streams = dict.fromkeys(ptrs)  # each stream once, in order
        starts = {s: self._mark(s) for s in streams}
        self.nccl.groupStart()
        try:
            for item, s in zip(items, ptrs):
                self._issue(item[0], s, 1)
        finally:
            self.nccl.groupEnd()
        for s in streams:
            self._watch_call(s, starts[s], "group")

    def synchronize(self, stream=None) -> None:
        """Wait for the stream; raise CollectiveTimeout if the watchdog aborted NCCL.  While
        watched calls are pending the wait polls, so that it ends when the watchdog does: it
        spins for the first SPIN_S seconds (a sleep there would add its overshoot, tens of µs, to
        every short call's latency), then sleeps between polls."""
        self._check()
        if not self.watchdog.pending():
            synchronize_stream(stream)
        else:
            t0 = time.perf_counter()
            while not stream_idle(stream):
                if time.perf_counter() - t0 > SPIN_S:
                    time.sleep(1e-4)
        self._check()

    def barrier(self, stream=None, iters: int = 1, sync: bool = True) -> None:
        import cupy

        self._check()
        s = stream_ptr(stream)
        with cupy.cuda.ExternalStream(s):  # (on s: filled before, and its memory reused only after, the allreduces)
            x = cupy.zeros(1, dtype=cupy.float32)
        start = self._mark(s)
        for _ in range(iters):
            self.comm.allReduce(x.data.ptr, x.data.ptr, 1, self.nccl.NCCL_FLOAT32, self.nccl.NCCL_SUM, s)
        self._watch_call(s, start, "Barrier")
        if sync:
            self.synchronize(stream)

    def free(self, within: float | None = None) -> None:
        """Destroy the NCCL communicator once every rank is here (collective); `within` bounds
        the wait (the cuda backend's teardown after a CollectiveTimeout), past which the
        communicator is aborted instead (local).  NCCL's destroy and abort both wait until every
        CUDA graph that captured this communicator's calls is destroyed: after a capture they run
        on a thread of their own, so Free returns while such graphs live, and NCCL releases the
        communicator when the last of them goes."""
        self._stop.set()
        while self._thread.is_alive() and not self.broken:  # (its abort may wait for graphs)
            self._thread.join(0.05)
        if self.broken:  # aborted by the watchdog: nothing to destroy; peers may never come
            if within is None:
                within = self.timeout
            self.abandoned = not release_together(self.mpi, lambda: None, within, "Free (NCCL)")
            return
        if not release_together(self.mpi, lambda: self._release(self.comm.destroy), within, "Free (NCCL)"):
            self._release(self.comm.abort)

    def _release(self, fn) -> None:
        """NCCL's destroy or abort: here, or after a capture on a daemon thread (see free)."""
        if not self.captured:
            fn()
            return
        log.info("hpccoll: Free (NCCL): calls of this communicator were captured into CUDA graphs; NCCL "
                 "releases it when the last such graph is destroyed")
        self.releaser = threading.Thread(target=fn, name="hpccoll-nccl-release", daemon=True)
        self.releaser.start()
