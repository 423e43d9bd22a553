"""One route per call (hpccoll._routes): the full path, a fast-path repeat, a persistent request
and a check-mode call each decide their route once, through `_routes.route`, and the backend
runs (and plans) by the Route made there, never deciding again."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import _routes

pytestmark = pytest.mark.mpi(min_size=2)

WORLD = MPI.COMM_WORLD


@pytest.fixture
def spied(monkeypatch):
    """(communicator factory, routes made, routes the host backend ran or planned by)."""
    made, ran, planned, comms = [], [], [], []
    real_route = _routes.route

    def route(*args, **kw):
        r = real_route(*args, **kw)
        made.append(r)
        return r

    monkeypatch.setattr(_routes, "route", route)

    def open_comm(**kw):
        c = hpccoll.Communicator(backend="host", **kw)
        host = c._host
        real_run, real_plan = host.run, host.plan

        def run(call, r, stream=None):
            ran.append(r)
            return real_run(call, r, stream)

        def plan(call, r):
            planned.append(r)
            return real_plan(call, r)

        monkeypatch.setattr(host, "run", run)
        monkeypatch.setattr(host, "plan", plan)
        comms.append(c)
        return c

    yield open_comm, made, ran, planned
    for c in comms:
        c.Free()


def test_a_repeated_call_keeps_the_route_of_its_first_call(spied):
    open_comm, made, ran, planned = spied
    c = open_comm()
    x, y = np.arange(8.0), np.empty(8)
    for _ in range(4):  # the full path, the first repeat (which plans), then the prepared launch
        c.Allreduce(x, y)
        assert np.array_equal(y, x * c.size)
    assert len(made) == 1 and made[0].backend is c._host
    assert ran == [made[0], made[0]] and planned == [made[0]]
    b = np.arange(4.0) if c.rank == 0 else np.zeros(4)
    for _ in range(3):  # no prepared launch for Bcast on the host backend: `run` by the kept route
        c.Bcast(b, root=0)
    assert len(made) == 2 and ran[2:] == [made[1]] * 3
    assert np.array_equal(b, np.arange(4.0))


def test_a_persistent_request_runs_by_the_route_of_its_init(spied):
    open_comm, made, ran, planned = spied
    c = open_comm()
    x, y = np.ones(20000), np.empty(20000)  # above the fast path's size: every Start calls `run`
    req = c.Allreduce_init(x, y)
    assert len(made) == 1
    for _ in range(3):
        req.Start()
        req.Wait()
        assert np.all(y == c.size)
    assert len(made) == 1 and ran == [made[0]] * 3
    req.Free()
    small = c.Allreduce_init(np.ones(4), np.empty(4))  # one prepared launch, planned by its route
    assert len(made) == 2 and planned == [made[1]]
    for _ in range(3):
        small.Start()
        small.Wait()
    assert len(made) == 2 and ran == [made[0]] * 3  # (the prepared launch: no `run`)
    small.Free()


def test_check_mode_routes_every_call_once_and_compares_that_route(spied):
    open_comm, made, ran, planned = spied
    c = open_comm(check=True)
    x, y = np.arange(6.0), np.empty(6)
    for k in range(1, 4):
        c.Allreduce(x, y)
        assert len(made) == k and ran[-1] is made[-1]
    req = c.Allreduce_init(x, y)
    n = len(made)
    req.Start()
    req.Wait()
    assert len(made) == n + 1 and ran[-1] is made[-1]  # check mode: every Start checks, routed once
    req.Free()
    assert not planned
    assert np.array_equal(y, x * c.size)
