"""The NCCL backend's watchdog without GPUs: which queued call it finds late (Watchdog), and the
backend's thread aborting NCCL and turning every later call into CollectiveTimeout (fakes for
NCCL's communicator and CUDA's events)."""
from __future__ import annotations

import threading
import time
import types

import pytest

from hpccoll.backends.nccl import NcclBackend, Watchdog
from hpccoll.errors import CollectiveTimeout


class Ev:
    def __init__(self, done=False):
        self.done = done


def test_the_clock_of_a_call_starts_when_the_work_before_it_on_its_stream_is_done():
    w = Watchdog(10.0)
    a0, a1, b0, b1, c0, c1 = (Ev() for _ in range(6))
    w.note(1, a0, a1, "Allreduce")
    w.note(1, b0, b1, "Bcast")
    w.note(2, c0, c1, "Allgather")
    assert w.poll(100.0) is None and w.pending()         # nothing has started: no clock runs
    a0.done = True
    assert w.poll(101.0) is None                         # a's clock starts at 101
    assert w.poll(110.9) is None
    assert w.poll(111.5) == ("Allreduce", 10.5)
    a1.done = b0.done = True
    assert w.poll(112.0) is None                         # b is the oldest now: its clock starts at 112
    name, waited = w.poll(122.5)
    assert name == "Bcast" and waited == pytest.approx(10.5)
    b1.done = c0.done = True
    assert w.poll(130.0) is None                         # stream 2's call: its clock starts at 130
    name, waited = w.poll(140.5)
    assert name == "Allgather" and waited == pytest.approx(10.5)
    c1.done = True
    assert w.poll(200.0) is None and not w.pending()
    assert sorted(map(id, w.spare)) == sorted(map(id, (a0, a1, b0, b1, c0, c1)))  # for reuse


def test_long_work_queued_before_a_call_never_counts_against_it():
    """A call behind an hour of other GPU work on its stream: no timeout until that work is
    done and the call itself then waits past the timeout."""
    w = Watchdog(1.0)
    start, end = Ev(), Ev()
    w.note(7, start, end, "Allreduce")
    assert w.poll(3600.0) is None
    start.done = True
    assert w.poll(3600.5) is None
    assert w.poll(3601.4) is None
    assert w.poll(3601.6)[0] == "Allreduce"


def _backend(timeout: float, monkeypatch):
    """An NcclBackend with its NCCL communicator and CUDA calls replaced by fakes."""
    b = NcclBackend.__new__(NcclBackend)
    aborted = threading.Event()

    class Comm:
        def abort(self):
            aborted.set()

    class Request:
        def Wait(self):
            pass

        def Test(self):
            return True

    class Mpi:
        def Ibarrier(self):
            return Request()

    b.comm, b.timeout, b.broken, b.device_id, b.mpi = Comm(), timeout, None, 0, Mpi()
    b.captured, b.releaser, b.on_abort = False, None, None
    b.watchdog = Watchdog(timeout)
    b._stop, b._aborted = threading.Event(), threading.Event()
    monkeypatch.setattr(NcclBackend, "_use_device", lambda self: None)
    b._thread = threading.Thread(target=b._watch, daemon=True)
    return b, aborted


def test_a_late_call_aborts_nccl_and_every_later_call_raises(monkeypatch):
    b, aborted = _backend(0.2, monkeypatch)
    owner = []  # the owner (the cuda backend's NCCL fallback) hears the reason before the abort
    b.on_abort = lambda why: owner.append((why, aborted.is_set()))
    b._thread.start()
    b.watchdog.note(0, Ev(True), Ev(), "Allreduce")
    assert aborted.wait(5.0), "the watchdog did not abort NCCL"
    b._thread.join(5.0)
    assert not b._thread.is_alive()
    with pytest.raises(CollectiveTimeout, match=r"Allreduce: an NCCL call did not finish .* aborted"):
        b._check()
    assert owner == [(b.broken, False)]
    with pytest.raises(CollectiveTimeout):
        b.run(None, None, 0)                             # raises before touching the call


def test_the_timeout_is_raised_only_once_ncclcommabort_has_returned(monkeypatch):
    """Until ncclCommAbort returns, NCCL's kernels may still read and write the buffers of the
    call that timed out: the caller gets CollectiveTimeout (and its buffers back) only after."""
    b, aborted = _backend(0.1, monkeypatch)
    returned = threading.Event()

    class SlowAbort:
        def abort(self):
            time.sleep(0.3)
            returned.set()

    b.comm = SlowAbort()
    b._thread.start()
    b.watchdog.note(0, Ev(True), Ev(), "Allreduce")
    while not b.broken:
        time.sleep(0.005)
    with pytest.raises(CollectiveTimeout):
        b._check()
    assert returned.is_set(), "CollectiveTimeout came while ncclCommAbort was still running"
    b._thread.join(5.0)


def test_calls_that_finish_in_time_never_trip_it(monkeypatch):
    b, aborted = _backend(0.3, monkeypatch)
    b._thread.start()
    for _ in range(20):
        e = Ev()
        b.watchdog.note(0, Ev(True), e, "Allreduce")
        time.sleep(0.02)
        e.done = True
    time.sleep(0.5)
    b._stop.set()
    b._thread.join(5.0)
    assert not aborted.is_set() and b.broken is None
    b._check()


@pytest.mark.parametrize("captured", [False, True])
def test_free_leaves_nccls_destroy_to_a_thread_only_after_a_capture(monkeypatch, captured):
    """NCCL's destroy waits for the graphs that captured the communicator's calls: after a
    capture it runs on a thread and Free returns at once; without one it runs in Free."""
    b, aborted = _backend(5.0, monkeypatch)
    graphs_gone, destroyed = threading.Event(), threading.Event()

    class Comm:
        def destroy(self):
            if captured:
                graphs_gone.wait(10.0)
            destroyed.set()

        def abort(self):
            aborted.set()

    b.comm, b.captured = Comm(), captured
    b._thread.start()
    t0 = time.monotonic()
    b.free()
    assert time.monotonic() - t0 < 2.0 and not b._thread.is_alive()
    if captured:
        assert b.releaser.is_alive() and not destroyed.is_set()
        graphs_gone.set()
        b.releaser.join(5.0)
    else:
        assert b.releaser is None
    assert destroyed.is_set() and not aborted.is_set()


def test_the_hierarchical_synchronize_raises_when_the_nccl_between_nodes_was_aborted():
    """The node phase's synchronize passes (its kernels ran on whatever NCCL left); the NCCL
    communicator between nodes then raises its watchdog's CollectiveTimeout."""
    from hpccoll.backends.hier import Hierarchical

    class Local:
        def synchronize(self, stream=None):
            waited.append(("local", stream))

    class Stripe:
        def synchronize(self, stream=None):
            waited.append(("nccl", stream))
            raise CollectiveTimeout("Allreduce: an NCCL call did not finish")

    h = Hierarchical.__new__(Hierarchical)
    waited = []
    h.node, h.stripe_nccl = types.SimpleNamespace(main=Local()), None
    h.synchronize(7)
    assert waited == [("local", 7)]
    h.stripe_nccl = types.SimpleNamespace(main=Stripe())
    with pytest.raises(CollectiveTimeout, match="did not finish"):
        h.synchronize(7)
    assert waited == [("local", 7), ("local", 7), ("nccl", 7)]


def test_synchronize_spins_before_it_sleeps(monkeypatch):
    """While watched calls are pending, synchronize polls the stream: a short call's wait must
    not sleep (a sleep's overshoot, tens of µs, would land on every short call's latency)."""
    import hpccoll.backends.nccl as nccl_mod

    b, _ = _backend(5.0, monkeypatch)
    b.watchdog.note(0, Ev(True), Ev(), "Allreduce")
    polls, sleeps = [], []
    monkeypatch.setattr(nccl_mod, "stream_idle", lambda s: polls.append(s) or len(polls) > 200)
    monkeypatch.setattr(nccl_mod.time, "sleep", lambda t: sleeps.append(t))
    b.synchronize()
    assert len(polls) == 201 and sleeps == []
    polls.clear()
    monkeypatch.setattr(nccl_mod, "SPIN_S", 0.0)  # a long wait: past the spin, it sleeps between polls
    b.synchronize()
    assert len(sleeps) == 200


def test_the_cuda_backends_nccl_fallback_passes_its_watchdogs_timeout_on(monkeypatch):
    """The CUDA backend's NCCL fallback: when its watchdog aborts NCCL, the CUDA backend is
    broken too, so its synchronize and next call raise CollectiveTimeout (its own synchronize
    never asks NCCL).  NCCL, MPI and the GPU replaced by fakes."""
    import hpccoll.backends.cuda.backend as cb
    import hpccoll.backends.nccl as nccl_mod
    from hpccoll.backends.factory import open_nccl
    from hpccoll.config import Config

    made, waited = [], []

    class FakeNccl:
        def __init__(self, mpi_comm, device, timeout):
            self.on_abort = None
            made.append(self)

        def wait_aborted(self):  # (CollectiveTimeout only once NCCL's abort has returned)
            waited.append(True)

    class Mpi:
        def allgather(self, x):
            return [x]

    class Ws:
        def host_error(self):
            return False

    monkeypatch.setattr(nccl_mod, "NcclBackend", FakeNccl)
    monkeypatch.setattr(nccl_mod, "nccl_unavailable_reason", lambda: None)
    monkeypatch.setattr(cb, "ranks_sharing_gpus", lambda mpi_comm, device: None)
    b = object.__new__(cb.CudaBackend)
    b.table = {"allreduce": {"2": [[None, "nccl"]]}}  # (NCCL above every size at 2 ranks)
    b.size, b.device_id, b.comm, b.ws, b.broken = 2, 0, Mpi(), Ws(), None
    b.config = Config(nccl_fallback=True)
    nccl = b._nccl = b._open_nccl_fallback(Mpi(), open_nccl)  # (the factory's, as it passes it)
    assert nccl is made[0] and nccl.on_abort is not None
    b.check_error()                                      # nothing yet
    nccl.on_abort("Allreduce: an NCCL call did not finish 30.0 s after ...")
    with pytest.raises(CollectiveTimeout, match="did not finish"):
        b.check_error()
    assert waited == [True]


def test_a_group_is_watched_once_per_stream_from_before_its_start_to_after_its_end(monkeypatch):
    """run_group: one start event per stream before ncclGroupStart, one end event per stream
    after ncclGroupEnd, the watchdog's entry named "group"; no per-call events inside."""
    b, _ = _backend(5.0, monkeypatch)
    order = []

    class Nccl:
        def groupStart(self):
            order.append("groupStart")

        def groupEnd(self):
            order.append("groupEnd")

    def mark(s):
        order.append(("mark", s))
        return Ev()

    def record(s):
        order.append(("end", s))
        return Ev()

    b.nccl = Nccl()
    monkeypatch.setattr(b, "_mark", mark)
    monkeypatch.setattr(b, "_record", record)
    monkeypatch.setattr(b, "_issue", lambda call, stream, iters: order.append(("issue", stream)))
    import hpccoll.backends.nccl as nccl_mod

    monkeypatch.setattr(nccl_mod, "stream_ptr", lambda stream: stream)
    call = types.SimpleNamespace(name="Allreduce")
    items = [(call, None, 11), (call, None, 22), (call, None, 11)]  # (call, route, stream)
    b.run_group(items)
    assert order == [("mark", 11), ("mark", 22), "groupStart", ("issue", 11), ("issue", 22), ("issue", 11),
                     "groupEnd", ("end", 11), ("end", 22)]
    assert {s: [e[2] for e in q] for s, q in b.watchdog.queues.items()} == {11: ["group"], 22: ["group"]}


def test_events_only_around_calls_queued_outside_a_capture_while_watched(monkeypatch):
    """_mark records an event before a call on a stream that is not being captured, and
    _watch_call one after it, both noted; a capture records none (and marks the communicator
    captured); with `watch` off nothing is recorded or noted."""
    b, _ = _backend(5.0, monkeypatch)
    recorded = []
    b._runtime = types.SimpleNamespace(streamIsCapturing=lambda s: s == 7,
                                       eventRecord=lambda ptr, s: recorded.append(s))
    b._new_event = lambda: types.SimpleNamespace(ptr=0)
    b.watch = True
    assert b._mark(7) is None and b.captured and recorded == []
    b.captured = False
    b._watch_call(5, b._mark(5), "Allreduce")
    assert recorded == [5, 5] and [e[2] for e in b.watchdog.queues[5]] == ["Allreduce"]
    b.watch = False
    b._watch_call(5, b._mark(5), "Allreduce")
    assert recorded == [5, 5] and len(b.watchdog.queues[5]) == 1 and not b.captured
