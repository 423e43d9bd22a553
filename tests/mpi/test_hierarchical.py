"""Hierarchical (multi-node) collectives on simulated nodes: HPCCOLL_NODE_SIZE=k makes
consecutive groups of k ranks separate nodes.  Runs at every rank count tests/run uses
(2, 3, 4, 6): every node size d < size that divides it, d = 1 included.

Deterministic results must equal, bit for bit, the documented hierarchical order (per node in
local-rank order, then over nodes in node order) on every rank and in every run."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll.ops import OPS, reduce_in_rank_order

pytestmark = pytest.mark.mpi(min_size=2)

WORLD = MPI.COMM_WORLD
NODE_SIZES = [d for d in range(1, WORLD.Get_size()) if WORLD.Get_size() % d == 0]


@pytest.fixture(params=NODE_SIZES, ids=lambda d: f"node_size{d}")
def hc(request, monkeypatch):
    monkeypatch.setenv("HPCCOLL_NODE_SIZE", str(request.param))
    c = hpccoll.Communicator(backend="host")
    yield c
    c.Free()


def _hier_ref(op, xs, layout):
    return reduce_in_rank_order(op, [reduce_in_rank_order(op, [xs[r] for r in row]) for row in layout.rank_of])


def _data(rng, dtype, n):
    if np.dtype(dtype).kind == "i":
        return rng.integers(-1000, 1000, n).astype(dtype)
    return rng.standard_normal(n).astype(dtype)


def test_layout(hc):
    L = hc._hier.layout
    k = int(__import__("os").environ["HPCCOLL_NODE_SIZE"])
    assert (L.nodes, L.per_node) == (WORLD.Get_size() // k, k)
    assert hc.backend.startswith(f"hier({L.nodes}x{k}")
    assert L.rank_of[L.node][L.local] == WORLD.Get_rank()


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
@pytest.mark.parametrize("op", ["SUM", "PROD", "MAX", "MIN"])
def test_allreduce_deterministic_bits(hc, dtype, op):
    for it, n in enumerate((1, 7, 1023, 4097)):
        rng = np.random.default_rng([WORLD.Get_rank(), it, len(dtype), len(op)])
        x = _data(rng, dtype, n)
        if op == "PROD" and x.dtype.kind == "f":
            x = (1 + 0.01 * x).astype(dtype)
        xs = WORLD.allgather(x)
        ref = _hier_ref(OPS[op], xs, hc._hier.layout)
        y = np.empty_like(x)
        hc.Allreduce(x, y, op=OPS[op], deterministic=True)
        assert np.array_equal(y.view(np.uint8), ref.view(np.uint8)), f"{dtype} {op} n={n}"
        y2 = x.copy()
        hc.Allreduce(hpccoll.IN_PLACE, y2, op=OPS[op], deterministic=True)
        assert np.array_equal(y2.view(np.uint8), y.view(np.uint8)), "second run / in place differs"
        assert len(set(WORLD.allgather(y.tobytes()))) == 1, "ranks differ"


def test_allreduce_nondeterministic_close(hc):
    x = np.random.default_rng([WORLD.Get_rank(), 5]).standard_normal(999)
    y = np.empty_like(x)
    hc.Allreduce(x, y)
    np.testing.assert_allclose(y, np.sum(WORLD.allgather(x), axis=0), rtol=1e-12, atol=1e-12)


def test_bcast_every_root(hc):
    for root in range(WORLD.Get_size()):
        x = np.random.default_rng([WORLD.Get_rank(), root]).standard_normal(513)
        want = WORLD.bcast(x, root=root)
        hc.Bcast(x, root=root)
        assert np.array_equal(x, want)


def test_allgather_rank_order(hc):
    for n in (1, 6, 1001):
        x = np.random.default_rng([WORLD.Get_rank(), n]).integers(0, 1 << 30, n).astype(np.int64)
        want = np.concatenate(WORLD.allgather(x))
        out = np.empty(n * WORLD.Get_size(), dtype=np.int64)
        hc.Allgather(x, out)
        assert np.array_equal(out, want)
        inplace = np.zeros_like(out)
        inplace[WORLD.Get_rank() * n:(WORLD.Get_rank() + 1) * n] = x
        hc.Allgather(hpccoll.IN_PLACE, inplace)
        assert np.array_equal(inplace, want)


@pytest.mark.parametrize("op", ["SUM", "MAX"])
def test_reduce_scatter_matches_allreduce_slice(hc, op):
    size, rank = WORLD.Get_size(), WORLD.Get_rank()
    for n in (1, 5, 300):
        x = np.random.default_rng([rank, n, len(op)]).standard_normal(n * size)
        ref = _hier_ref(OPS[op], WORLD.allgather(x), hc._hier.layout)[rank * n:(rank + 1) * n]
        out = np.empty(n)
        hc.Reduce_scatter_block(x, out, op=OPS[op], deterministic=True)
        assert np.array_equal(out.view(np.uint64), ref.view(np.uint64))
        buf = x.copy()
        hc.Reduce_scatter_block(hpccoll.IN_PLACE, buf, op=OPS[op], deterministic=True)
        assert np.array_equal(buf[:n].view(np.uint64), ref.view(np.uint64))


def test_barrier_dup_split(hc):
    hc.Barrier()
    d = hc.Dup()
    assert d.backend == hc.backend
    x = np.full(3, float(WORLD.Get_rank()))
    y = np.empty_like(x)
    d.Allreduce(x, y)
    assert np.all(y == sum(range(WORLD.Get_size())))
    d.Free()


def test_bad_node_size(monkeypatch):
    if WORLD.Get_size() < 2:
        pytest.skip("needs 2 ranks")
    monkeypatch.setenv("HPCCOLL_NODE_SIZE", str(WORLD.Get_size() + 1))
    with pytest.raises(ValueError, match="HPCCOLL_NODE_SIZE"):
        hpccoll.Communicator(backend="host")
