"""Communicator lifecycle on the host backend: rank/size, Dup, Split, Free, context manager."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import HpccollError

pytestmark = pytest.mark.mpi(min_size=2)

WORLD = MPI.COMM_WORLD


def allreduce_sum(c, value, **kw) -> int:
    x = np.array([value], dtype=np.int64)
    out = np.empty_like(x)
    c.Allreduce(x, out, **kw)
    return int(out[0])


def test_rank_and_size(comm):
    assert comm.rank == comm.Get_rank() == WORLD.Get_rank()
    assert comm.size == comm.Get_size() == WORLD.Get_size()
    assert comm.backend == "host" and comm.device is None
    assert repr(comm) == f"<hpccoll.Communicator rank {comm.rank}/{comm.size} backend=host>"


def test_traffic_on_a_duplicate_of_the_callers_comm(comm):
    """hpccoll duplicates the communicator it wraps: same group, different context."""
    assert comm.mpi_comm != WORLD
    assert MPI.Comm.Compare(comm.mpi_comm, WORLD) == MPI.CONGRUENT


def test_wraps_a_given_communicator():
    with hpccoll.Communicator(MPI.COMM_SELF, backend="host") as c:
        assert (c.rank, c.size) == (0, 1)
        assert allreduce_sum(c, 5) == 5


def test_dup_is_independent_and_inherits_settings():
    with hpccoll.Communicator(backend="host", deterministic=True, check=True, timeout=12.5) as c:
        d = c.Dup()
        assert (d.rank, d.size) == (c.rank, c.size)
        assert (d.backend, d.deterministic, d.check, d.timeout) == ("host", True, True, 12.5)
        assert MPI.Comm.Compare(d.mpi_comm, c.mpi_comm) == MPI.CONGRUENT
        assert allreduce_sum(d, d.rank) == d.size * (d.size - 1) // 2
        d.Free()
        assert allreduce_sum(c, 1) == c.size  # freeing the duplicate leaves the original usable


@pytest.mark.parametrize("reverse", [False, True], ids=["key_rank", "key_reversed"])
def test_split_even_odd(comm, reverse):
    color = comm.rank % 2
    key = -comm.rank if reverse else comm.rank
    sub = comm.Split(color, key)
    try:
        members = [r for r in range(comm.size) if r % 2 == color]
        if reverse:
            members = members[::-1]
        assert sub.size == len(members)
        assert sub.rank == members.index(comm.rank)
        assert sub.backend == "host"
        assert allreduce_sum(sub, comm.rank) == sum(members)
        got = np.empty(sub.size, dtype=np.int64)
        sub.Allgather(np.array([comm.rank], dtype=np.int64), got)
        assert got.tolist() == members
    finally:
        sub.Free()


def test_split_undefined_gives_none(comm):
    color = MPI.UNDEFINED if comm.rank == 0 else 1
    sub = comm.Split(color)
    if comm.rank == 0:
        assert sub is None
    else:
        assert sub.size == comm.size - 1
        assert allreduce_sum(sub, 1) == comm.size - 1
        sub.Free()


def test_free_then_use_raises_and_free_twice_is_fine():
    c = hpccoll.Communicator(backend="host")
    c.Free()
    c.Free()
    with pytest.raises(HpccollError, match="Allreduce: this communicator was freed"):
        c.Allreduce(np.ones(3), np.empty(3))
    with pytest.raises(HpccollError, match="Bcast: this communicator was freed"):
        c.Bcast(np.ones(3), root=0)


def test_context_manager_frees(comm):
    with comm.Dup() as d:
        assert allreduce_sum(d, 2) == 2 * d.size
    with pytest.raises(HpccollError, match="freed"):
        d.Allgather(np.ones(1), np.empty(comm.size))


def test_context_manager_frees_on_exception():
    with pytest.raises(RuntimeError, match="boom"):
        with hpccoll.Communicator(backend="host") as c:
            raise RuntimeError("boom")
    with pytest.raises(HpccollError, match="freed"):
        c.Allreduce(np.ones(1), np.empty(1))


def test_auto_backend_falls_back_to_host_without_gpu():
    from hpccoll.backends.factory import device_unavailable_reason

    if device_unavailable_reason() is None:
        pytest.skip("a GPU is usable here; auto picks the device backend")
    with hpccoll.Communicator() as c:
        assert c.backend == "host"
        assert allreduce_sum(c, 1) == c.size


@pytest.mark.parametrize("algorithm,why", [("twoshot_ll128", "runs device buffers on the cuda backend"),
                                           ("sentinel", "runs device buffers on the cuda backend"),
                                           ("bogus", "is unknown: use 'auto' or 'mpi'")])
def test_device_algorithm_on_host_raises_on_every_rank(comm, algorithm, why):
    with pytest.raises(ValueError, match=f"Allreduce: algorithm='{algorithm}' {why}"):
        comm.Allreduce(np.ones(3), np.empty(3), algorithm=algorithm)
    assert allreduce_sum(comm, 1) == comm.size  # nothing was sent: the next call is clean


@pytest.mark.parametrize("algorithm", ["auto", "mpi", "host"])
def test_host_algorithms_accepted(comm, algorithm):
    assert allreduce_sum(comm, 3, algorithm=algorithm) == 3 * comm.size


def test_bad_root_raises_before_communication(comm):
    for root in (-1, comm.size, 1.5):
        with pytest.raises(ValueError, match=rf"Bcast: root={root!r} is not a rank"):
            comm.Bcast(np.ones(3), root=root)
    assert allreduce_sum(comm, 1) == comm.size


def test_numpy_integer_root(comm):
    buf = np.full(3, comm.rank, dtype=np.int32)
    comm.Bcast(buf, root=np.int64(comm.size - 1))
    assert buf.tolist() == [comm.size - 1] * 3


def test_persistent_engine_arguments_and_backend(comm):
    """The eager engine: bad arguments name the argument and the fix; on the host backend it is
    refused with the reason (no GPU path), and stopping is a no-op."""
    with pytest.raises(TypeError):
        comm.start_persistent("complex64")
    with pytest.raises(ValueError, match="blocks=0: pass an int from 1 to 8"):
        comm.start_persistent("float32", blocks=0)
    with pytest.raises(ValueError, match="blocks=True"):
        comm.start_persistent("float32", blocks=True)
    with pytest.raises(ValueError, match="max_bytes=8: pass an int from 16 to 262144"):
        comm.start_persistent("float32", max_bytes=8)
    with pytest.raises(ValueError, match=r"max_bytes=131072 needs blocks >= 4 .*: pass blocks=4 or a smaller max_bytes"):
        comm.start_persistent("float32", blocks=3, max_bytes=128 * 1024)
    with pytest.raises(ValueError, match="max_bytes=32769 needs blocks >= 2"):
        comm.start_persistent("float32", blocks=1, max_bytes=32 * 1024 + 1)
    with pytest.raises(ValueError, match="order='host': pass 'stream' .* or 'caller'"):
        comm.start_persistent("float32", order="host")
    if comm.backend == "host":
        with pytest.raises(HpccollError, match="needs the single-node cuda backend"):
            comm.start_persistent("float32")
        with pytest.raises(HpccollError, match="needs the single-node cuda backend"):
            with comm.persistent("float32"):
                pass
        comm.stop_persistent()  # nothing runs: nothing to do
        x = np.arange(5.0) + comm.rank
        out = np.empty_like(x)
        comm.Allreduce(x, out)  # the communicator is still usable
        assert np.array_equal(out, sum(np.arange(5.0) + r for r in range(comm.size)))


def test_group_issues_its_calls_in_order_at_exit(comm):
    """Inside `with comm.group():` calls are validated at once and run when the block exits (on
    the host backend one by one, in order); results only exist after the block."""
    rng = np.random.default_rng([comm.rank, 31])
    xs = [rng.standard_normal(n) for n in (1, 7, 1000)]
    outs = [np.zeros_like(x) for x in xs]
    b = np.array([comm.rank + 1.0])
    with comm.group() as g:
        assert g is comm
        for x, out in zip(xs, outs):
            comm.Allreduce(x, out)
        comm.Bcast(b, root=comm.size - 1)
        comm.Allreduce(hpccoll.IN_PLACE, outs[0])  # depends on the first call's result: order kept
        assert not outs[1].any(), "a queued call ran before the block exited"
    for x, out in zip(xs[1:], outs[1:]):
        assert np.allclose(out, sum(WORLD.allgather(x)))
    assert np.allclose(outs[0], comm.size * sum(WORLD.allgather(xs[0])))
    assert b[0] == comm.size


def test_group_misuse_raises_and_a_raising_block_issues_nothing(comm):
    x, out = np.ones(4), np.zeros(4)
    with pytest.raises(ValueError, match="recvbuf has 3 elements"):
        with comm.group():
            comm.Allreduce(x, np.zeros(3))  # validated at the call, inside the block
    with comm.group():
        with pytest.raises(HpccollError, match="groups do not nest"):
            with comm.group():
                pass
        with pytest.raises(HpccollError, match="Barrier: not allowed inside a group"):
            comm.Barrier()
    with pytest.raises(RuntimeError, match="boom"):
        with comm.group():
            comm.Allreduce(x, out)
            raise RuntimeError("boom")
    assert not out.any(), "a call queued in a block that raised was issued"
    assert allreduce_sum(comm, 1) == comm.size  # and the communicator is usable after it


def test_a_gpu_ordinal_out_of_range_on_one_rank_raises_on_every_rank():
    """backends.base.agreed_device (the cuda and nccl backends' device choice): the last rank
    asks for a GPU it does not have; every rank raises, naming it, instead of the others going
    on to the next exchange."""
    from hpccoll.backends.base import agreed_device

    world = MPI.COMM_WORLD
    last = world.Get_size() - 1
    asked = 5 if world.Get_rank() == last else None
    with pytest.raises(ValueError, match=f"rank {last}: device=5, it has GPUs 0..1.*device=None"):
        agreed_device(world, asked, world.Get_rank() % 2, 2)
    assert agreed_device(world, None, world.Get_rank() % 2, 2) == world.Get_rank() % 2
    assert agreed_device(world, 1, 0, 2) == 1


class _FakeRuntime:
    """The part of cupy.cuda.runtime the workspace uses, failing where told to."""

    def __init__(self, fail_malloc: bool, fail_open: bool):
        self.fail_malloc, self.fail_open, self.log = fail_malloc, fail_open, []

    def malloc(self, n):
        if self.fail_malloc:
            raise MemoryError("out of memory")
        return 4096

    def memset(self, *args):
        pass

    def deviceSynchronize(self):
        pass

    def ipcGetMemHandle(self, ptr):
        return b"handle"

    def ipcOpenMemHandle(self, handle):
        if self.fail_open:
            raise RuntimeError("peer access unsupported")
        return 8192

    def ipcCloseMemHandle(self, ptr):
        self.log.append(("close", ptr))

    def free(self, ptr):
        self.log.append(("free", ptr))


@pytest.mark.parametrize("stage", ["malloc", "open"])
def test_a_workspace_failure_on_one_rank_raises_on_every_rank(monkeypatch, stage):
    """The cuda backend's symmetric workspace (a fake CUDA runtime): the last rank fails to
    allocate, or to map a peer; every rank raises CudaUnavailable naming it and releases what it
    holds, where before the others waited for it in the next exchange."""
    import sys
    import types

    from hpccoll.backends.cuda.workspace import CudaUnavailable, Workspace

    last = WORLD.Get_size() - 1
    me = WORLD.Get_rank() == last
    rt = _FakeRuntime(fail_malloc=me and stage == "malloc", fail_open=me and stage == "open")
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(runtime=rt)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    why = "out of memory" if stage == "malloc" else "peer access unsupported"
    with pytest.raises(CudaUnavailable, match=f"CUDA IPC setup failed: rank {last}.*{why}"):
        Workspace(WORLD, 1024)
    if not (me and stage == "malloc"):
        assert ("free", 4096) in rt.log
    if stage == "open" and not me:
        assert rt.log.count(("close", 8192)) == WORLD.Get_size() - 1


def test_release_together_waits_for_every_rank_or_gives_up_after_a_bound(caplog):
    """Teardown after a timeout (backends.base.release_together): with every rank there, each
    releases; with the last rank late, the others give up after the bound, release nothing and
    say so, and the last rank, arriving later, still passes (their barrier stays posted)."""
    import time

    from hpccoll.backends.base import release_together

    comm = WORLD.Dup()
    released = []
    assert release_together(comm, lambda: released.append(1), None, "Free")
    assert release_together(comm, lambda: released.append(2), 5.0, "Free")
    assert released == [1, 2]
    late = WORLD.Get_rank() == WORLD.Get_size() - 1
    if not late:
        t0 = time.monotonic()
        with caplog.at_level("WARNING", logger="hpccoll"):
            assert not release_together(comm, lambda: released.append(3), 0.3, "Free")
        assert 0.3 <= time.monotonic() - t0 < 5
        assert "did not come within 0.3 s" in caplog.text
    WORLD.Barrier()
    if late:
        assert release_together(comm, lambda: released.append(3), None, "Free")
        assert released == [1, 2, 3]
    else:
        assert released == [1, 2]
    WORLD.Barrier()


def test_free_leaves_the_mpi_communicator_when_the_backend_gave_up():
    """A device backend whose teardown gave up on a peer (`abandoned`) leaves the MPI
    communicator alone (freeing it could wait for the pending barrier); otherwise Free frees it."""
    from hpccoll.backends.base import Backend

    class GaveUp(Backend):
        def run(self, *a):
            raise AssertionError("not called")

        def barrier(self):
            pass

        def free(self):
            self.abandoned = True

    for gives_up in (True, False):
        c = hpccoll.Communicator(WORLD, backend="host")
        mpi_comm = c.mpi_comm
        if gives_up:
            c._backends.main = GaveUp()
        c.Free()
        assert (mpi_comm != MPI.COMM_NULL) == gives_up
        if gives_up:
            assert mpi_comm.Get_size() == WORLD.Get_size()
            mpi_comm.Free()


def test_persistent_block_stops_the_engine_on_exit_but_leaves_a_timeout_as_itself(monkeypatch):
    """`with c.persistent()`: stop_persistent on a normal exit and after an ordinary exception;
    after a CollectiveTimeout (which stopped every engine already) no stop, whose own error
    ('no engine runs') would replace the timeout.  The engine calls are stand-ins (no GPU)."""
    c = hpccoll.Communicator(MPI.COMM_SELF, backend="host")
    try:
        stops = []
        monkeypatch.setattr(c, "start_persistent", lambda dtype="float32", **kw: None)
        monkeypatch.setattr(c, "stop_persistent", lambda dtype=None: stops.append(dtype))
        with c.persistent("float64"):
            pass
        assert stops == ["float64"]
        with pytest.raises(RuntimeError, match="user code"):
            with c.persistent("float32"):
                raise RuntimeError("user code")
        assert stops == ["float64", "float32"]
        with pytest.raises(hpccoll.CollectiveTimeout, match="a peer"):
            with c.persistent("float32"):
                raise hpccoll.CollectiveTimeout("a peer never came")
        assert stops == ["float64", "float32"]
    finally:
        c.Free()
