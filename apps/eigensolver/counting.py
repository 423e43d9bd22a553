"""A counting/timing proxy around an hpccoll Communicator, and per-phase wall timers.

Every collective the solver issues goes through `CountingComm`, which records its name,
byte size, phase and (optionally synchronised) wall time, so a report can show how many
collectives of which sizes each phase needed and the share of time spent in them."""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

from .linalg._xp import get_xp, sync


class CountingComm:
    """Forwards Allreduce/Bcast/Allgather/Reduce_scatter_block/Alltoall/Alltoallv to `comm`,
    counting each call.

    sync_each: wait for the device before and after each call so its time is the
    collective's own (adds one host sync per collective on GPU; no effect on the host).  Not on
    a communicator of one rank: its collectives move nothing, and the syncs would only stall
    the device queue (one rank's ormtr issues a Bcast per panel of reflectors)."""

    def __init__(self, comm, *, sync_each: bool = True):
        self.comm = comm
        self.sync_each = sync_each
        self._sync = sync_each and comm.Get_size() > 1   # what _timed does (see above)
        self.phase = "other"
        self.records: list[tuple[str, str, int, float]] = []  # (phase, name, bytes, seconds)
        self.estimated: set[str] = set()  # phases whose collective seconds are estimates

    @property
    def uncounted(self):
        """The communicator underneath (for collectives captured into CUDA graphs, which the
        caller then reports through `record`)."""
        return self.comm

    def record(self, name: str, nbytes: int, count: int, seconds: float, *, estimated: bool = False) -> None:
        """Account `count` collectives of `nbytes` issued outside this proxy (e.g. replayed in a
        graph), taking `seconds` together; `estimated`: the time is not a direct measurement."""
        for _ in range(count):
            self.records.append((self.phase, name, int(nbytes), seconds / count if count else 0.0))
        if estimated:
            self.estimated.add(self.phase)

    def restart(self) -> None:
        """Forget the collectives counted so far (the next solve of a solver that holds this proxy
        is counted alone)."""
        self.records = []
        self.estimated = set()

    # -- passthrough -----------------------------------------------------------
    def Get_rank(self) -> int:
        return self.comm.Get_rank()

    def Get_size(self) -> int:
        return self.comm.Get_size()

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    @property
    def mpi_comm(self):
        return self.comm.mpi_comm

    @property
    def backend(self) -> str:
        return getattr(self.comm, "backend", "?")

    # -- counted collectives ---------------------------------------------------
    def _timed(self, name, buf, fn, *args, **kw):
        xp = get_xp(buf)
        if self._sync:
            sync(xp)
        t0 = time.perf_counter()
        fn(*args, **kw)
        if self._sync:
            sync(xp)
        self.records.append((self.phase, name, int(buf.nbytes), time.perf_counter() - t0))

    def Allreduce(self, sendbuf, recvbuf, *args, **kw):
        self._timed("Allreduce", recvbuf, self.comm.Allreduce, sendbuf, recvbuf, *args, **kw)

    def Bcast(self, buf, root=0, **kw):
        self._timed("Bcast", buf, self.comm.Bcast, buf, root, **kw)

    def Allgather(self, sendbuf, recvbuf, **kw):
        self._timed("Allgather", recvbuf, self.comm.Allgather, sendbuf, recvbuf, **kw)

    def Reduce_scatter_block(self, sendbuf, recvbuf, *args, **kw):
        self._timed("Reduce_scatter_block", sendbuf, self.comm.Reduce_scatter_block,
                    sendbuf, recvbuf, *args, **kw)

    def Alltoallv(self, sendbuf, recvbuf, **kw):
        """Recorded with the bytes this rank receives."""
        self._timed("Alltoallv", recvbuf[0], self.comm.Alltoallv, sendbuf, recvbuf, **kw)

    def Barrier(self):
        self.comm.Barrier()

    # -- summaries -------------------------------------------------------------
    def summary(self, phases=None) -> dict:
        """{phase: {name: {count, bytes, seconds, min_bytes, max_bytes}}} plus a 'total' entry."""
        out: dict = defaultdict(dict)
        for phase, name, nbytes, sec in self.records:
            for key in (phase, "total"):
                if phases is not None and phase not in phases:
                    continue
                e = out[key].setdefault(name, {"count": 0, "bytes": 0, "seconds": 0.0,
                                               "min_bytes": nbytes, "max_bytes": nbytes})
                e["count"] += 1
                e["bytes"] += nbytes
                e["seconds"] += sec
                e["min_bytes"] = min(e["min_bytes"], nbytes)
                e["max_bytes"] = max(e["max_bytes"], nbytes)
        return dict(out)

    def size_histogram(self, phases=None) -> dict:
        """Counts of collectives per power-of-two byte bucket ('<=1KiB', '<=2KiB', ...)."""
        hist: dict[int, int] = defaultdict(int)
        for phase, _name, nbytes, _sec in self.records:
            if phases is not None and phase not in phases:
                continue
            b = 1024
            while nbytes > b:
                b *= 2
            hist[b] += 1
        return {_fmt_bytes(b): hist[b] for b in sorted(hist)}


def _fmt_bytes(b: int) -> str:
    for unit in ("KiB", "MiB", "GiB"):
        b /= 1024
        if b < 1024:
            return f"<={b:g}{unit}"
    return f"<={b:g}TiB"


class PhaseTimer:
    """Wall time per named phase, with a device sync at each boundary; tags the comm's phase."""

    def __init__(self, xp, comm=None, progress=None):
        self.xp = xp
        self.comm = comm
        self.progress = progress
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        sync(self.xp)
        if self.comm is not None and hasattr(self.comm, "phase"):
            self.comm.phase = name
        if self.progress is not None:
            self.progress.set_description(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            sync(self.xp)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
            if self.comm is not None and hasattr(self.comm, "phase"):
                self.comm.phase = "other"
            if self.progress is not None:
                self.progress.update(1)
