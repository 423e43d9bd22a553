"""Free from another thread while calls are in flight (host backend, 2 and 3 ranks).

Each rank's main thread repeats an Allreduce (the repeated call's fast path) while a second
thread frees the communicator.  Every rank's loop ends with HpccollError: "freed" where the
call came after this rank's Free, CollectiveTimeout where it waited for a peer that had freed
already.  Afterwards every call of every kind raises HpccollError, never MPI's raw "Invalid
communicator" nor the shared-memory segment's ValueError."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import HpccollError

pytestmark = pytest.mark.mpi(min_size=2)
WORLD = MPI.COMM_WORLD
TIMEOUT = 1.5  # seconds: a rank whose peer freed first waits this long


def every_call(c, x, y, req):
    """(name, call) of every kind, the repeated Allreduce and a persistent request's Start first."""
    n, size = 4, WORLD.size
    return [
        ("Allreduce", lambda: c.Allreduce(x, y)),  # the fast path's arrays
        ("Allreduce_init request: Start", req.Start),
        ("Allreduce", lambda: c.Allreduce(np.ones(n), np.empty(n))),
        ("Bcast", lambda: c.Bcast(np.ones(n))),
        ("Reduce_scatter_block", lambda: c.Reduce_scatter_block(np.ones(n * size), np.empty(n))),
        ("Allgather", lambda: c.Allgather(np.ones(n), np.empty(n * size))),
        ("Alltoall", lambda: c.Alltoall(np.ones(n * size), np.empty(n * size))),
        ("Alltoallv", lambda: c.Alltoallv((np.ones(size), [1] * size), (np.empty(size), [1] * size))),
        ("Allreduce_init", lambda: c.Allreduce_init(np.ones(n), np.empty(n))),
        ("Barrier", c.Barrier),
        ("Dup", c.Dup),
        ("Split", lambda: c.Split(0)),
        ("group", lambda: c.group().__enter__()),
    ]


@pytest.mark.parametrize("count", [16, 8192], ids=["shared-memory", "MPI"])
def test_free_from_another_thread_while_calls_run(count):
    for trial in range(3):
        c = hpccoll.Communicator(backend="host", timeout=TIMEOUT)
        rank, size = WORLD.rank, WORLD.size
        x, y = np.full(count, rank + 1.0), np.empty(count)
        req = c.Allreduce_init(x, y)
        freed = []

        def free_soon(delay=0.02 + 0.01 * trial + 0.005 * rank):  # the ranks free at different calls
            time.sleep(delay)
            try:
                c.Free()
            except BaseException as exc:  # noqa: BLE001 - reported below
                freed.append(exc)

        freer = threading.Thread(target=free_soon)
        freer.start()
        calls = 0
        with pytest.raises(HpccollError) as ended:
            while True:
                c.Allreduce(x, y)
                assert y[0] == size * (size + 1) / 2
                calls += 1
        freer.join()
        assert not freed, f"Free raised {freed[0]!r}"
        assert "this communicator was freed" in str(ended.value) or isinstance(
            ended.value, hpccoll.CollectiveTimeout), repr(ended.value)
        for name, call in every_call(c, x, y, req):
            with pytest.raises(HpccollError, match=f"{name}: this communicator was freed: make a new one"):
                call()
        req.Free()
        c.Free()  # a no-op
        WORLD.Barrier()


@pytest.mark.parametrize("count", [16, 8192], ids=["shared-memory", "MPI"])
def test_a_call_after_free_never_reaches_mpi(count):
    """Free waits for the call in flight and then keeps the call lock: a repeat that looked up
    its fast path before Free cleared it finds the lock taken and raises HpccollError."""
    c = hpccoll.Communicator(backend="host", timeout=TIMEOUT)
    x, y = np.ones(count), np.empty(count)
    c.Allreduce(x, y)
    c.Allreduce(x, y)  # noted, with its prepared launch
    fast = c._fast["Allreduce"]
    c.Free()
    c._fast["Allreduce"] = fast  # as if looked up before Free cleared it
    with pytest.raises(HpccollError, match="Allreduce: this communicator was freed"):
        c.Allreduce(x, y)
