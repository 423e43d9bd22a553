"""The route decision without MPI (hpccoll._routes, hpccoll.policy.pick): which backend runs a
call, with which algorithm, and one validation per decision."""
from __future__ import annotations

import types

import pytest

from hpccoll import _routes, policy
from hpccoll.backends.base import Route


class _Backend:
    def __init__(self, name, takes):
        self.name, self._takes = name, takes

    def takes(self, call):
        return self._takes

    def route(self, call, algorithm, deterministic):
        return Route(self, algorithm, algorithm, deterministic)


def test_the_device_backend_takes_its_calls_and_the_host_backend_the_others():
    host, dev = _Backend("host", True), _Backend("cuda", True)
    call = types.SimpleNamespace(name="Allreduce")
    r = _routes.route(host, dev, "oneshot_ll", call, None, False)
    assert r.backend is dev and r.requested == "oneshot_ll"      # the communicator's default
    assert _routes.route(host, dev, "oneshot_ll", call, "twoshot_ll", True).requested == "twoshot_ll"
    dev._takes = False  # a host-buffer call of a device communicator: "auto" on the host backend
    r = _routes.route(host, dev, "oneshot_ll", call, None, True)
    assert r.backend is host and r.requested == "auto" and r.deterministic
    assert _routes.route(host, host, "mpi", call, None, False).requested == "mpi"  # a host communicator


@pytest.mark.parametrize("algorithm", ["auto", "oneshot_ll", "twoshot_sentinel", "ll"])
def test_pick_validates_once_per_decision(monkeypatch, algorithm):
    seen = []
    real = policy.validate
    monkeypatch.setattr(policy, "validate", lambda *a: (seen.append(a), real(*a))[1])
    got = policy.pick(policy.shipped_table(), "Allreduce", "float32", "SUM", 4096, 2, False, True, algorithm)
    assert len(seen) == 1 and seen[0][0] == got
    assert got == algorithm or algorithm in ("auto", "ll")  # ll: not an Allreduce, so the table's


def test_pick_names_unknown_and_unfit_algorithms():
    table = policy.shipped_table()
    with pytest.raises(ValueError, match="'bogus' is unknown"):
        policy.pick(table, "Allreduce", "float32", "SUM", 64, 2, False, True, "bogus")
    with pytest.raises(ValueError, match="needs a floating-point dtype"):
        policy.pick(table, "Allreduce", "int32", "SUM", 64, 2, False, True, "oneshot_sentinel")
    with pytest.raises(ValueError, match="needs NCCL opened"):
        policy.pick(table, "Allreduce", "float32", "SUM", 64, 2, False, True, "nccl")
