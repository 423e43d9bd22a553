"""Persistent collectives (Communicator.*_init -> hpccoll.Request) on the host backend: results
against the reference with fresh data written into the bound buffers before every Start, MPI's
rules for active and freed requests, bad arguments at init, groups."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import HpccollError, Request

pytestmark = pytest.mark.mpi(min_size=2)

WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def comm():
    c = hpccoll.Communicator(backend="host")
    yield c
    c.Free()


@pytest.mark.parametrize("n", [1, 7, 1000])
def test_allreduce_init_reuses_its_buffers_with_fresh_data_every_start(comm, n):
    rng = np.random.default_rng([comm.rank, n, 41])
    x, out = np.empty(n), np.empty(n)
    req = comm.Allreduce_init(x, out, op=hpccoll.MAX)
    assert isinstance(req, Request) and not req.active
    for _ in range(5):
        x[...] = rng.standard_normal(n)  # the bound buffer, rewritten: the request must read it anew
        out[...] = np.nan
        req.Start()
        assert req.active
        req.Wait()
        assert not req.active
        assert np.array_equal(out, np.maximum.reduce(WORLD.allgather(x.copy())))
    req.Free()


def test_the_other_collectives_and_in_place(comm):
    rng = np.random.default_rng([comm.rank, 42])
    size, rank = comm.size, comm.rank
    b = np.empty(5)
    rs_in, rs_out = np.empty(3 * size), np.empty(3)
    ag_in, ag_out = np.empty(2), np.empty(2 * size)
    ip = np.empty(9)
    reqs = [comm.Bcast_init(b, root=size - 1), comm.Reduce_scatter_block_init(rs_in, rs_out),
            comm.Allgather_init(ag_in, ag_out), comm.Allreduce_init(hpccoll.IN_PLACE, ip)]
    for _ in range(3):
        b[...] = rng.standard_normal(5)
        rs_in[...] = rng.standard_normal(3 * size)
        ag_in[...] = rng.standard_normal(2)
        ip[...] = rng.standard_normal(9)
        want_b = WORLD.bcast(b.copy(), root=size - 1)
        want_rs = sum(WORLD.allgather(rs_in.copy()))[3 * rank:3 * rank + 3]
        want_ag = np.concatenate(WORLD.allgather(ag_in.copy()))
        want_ip = sum(WORLD.allgather(ip.copy()))
        Request.Startall(reqs)
        Request.Waitall(reqs)
        assert np.array_equal(b, want_b)
        assert np.allclose(rs_out, want_rs) and np.allclose(ag_out, want_ag) and np.allclose(ip, want_ip)
        assert all(r.Test() for r in reqs)


def test_mpi_rules_for_active_and_freed_requests(comm):
    x, out = np.ones(4), np.zeros(4)
    req = comm.Allreduce_init(x, out)
    req.Wait()  # nothing started: a no-op
    assert req.Test()
    req.Start()
    with pytest.raises(HpccollError, match="Start on an active request: call Wait"):
        req.Start()
    with pytest.raises(HpccollError, match="Free on an active request"):
        req.Free()
    req.Wait()
    assert np.array_equal(out, np.full(4, comm.size))
    req.Free()
    with pytest.raises(HpccollError, match="Start after Free"):
        req.Start()
    assert "freed" in repr(req)


def test_bad_arguments_raise_at_init(comm):
    x = np.ones(4)
    with pytest.raises(ValueError, match="recvbuf has 3 elements"):
        comm.Allreduce_init(x, np.zeros(3))
    with pytest.raises(ValueError, match="root"):
        comm.Bcast_init(x, root=comm.size)
    with pytest.raises(ValueError, match="runs device buffers on the cuda backend"):
        comm.Allreduce_init(x, np.zeros(4), algorithm="oneshot_sentinel")
    with pytest.raises(TypeError, match="stream must be"):
        comm.Allreduce_init(x, np.zeros(4), stream="s0")
    with pytest.raises(ValueError, match="Reduce_scatter_block"):
        comm.Reduce_scatter_block_init(np.ones(3 * comm.size + 1), np.zeros(3))


def test_requests_started_in_a_group_run_at_its_end(comm):
    rng = np.random.default_rng([comm.rank, 43])
    xs = [rng.standard_normal(n) for n in (2, 5)]
    outs = [np.zeros_like(x) for x in xs]
    reqs = [comm.Allreduce_init(x, o) for x, o in zip(xs, outs)]
    with comm.group():
        Request.Startall(reqs)
        assert not outs[0].any(), "a request started in a group ran before the group's end"
        with pytest.raises(HpccollError, match="Wait inside comm.group"):
            reqs[0].Wait()
    Request.Waitall(reqs)
    for x, o in zip(xs, outs):
        assert np.allclose(o, sum(WORLD.allgather(x)))


def test_a_freed_communicator_refuses_requests():
    c = hpccoll.Communicator(backend="host")
    x, out = np.ones(2), np.zeros(2)
    req = c.Allreduce_init(x, out)
    c.Free()
    with pytest.raises(HpccollError, match="freed"):
        req.Start()
    with pytest.raises(HpccollError, match="freed"):
        c.Allreduce_init(x, out)
