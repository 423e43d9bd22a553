"""Hierarchical collectives with device buffers on simulated nodes (HPCCOLL_NODE_SIZE):
2 ranks = 2 nodes of 1 GPU; 4 ranks under MPS = 2 nodes of 2 ranks.  CUDA kernels inside a
node, MPI (deterministic) or NCCL (otherwise) between nodes."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll.ops import OPS, reduce_in_rank_order

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=2)]
WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def hc():
    import os

    size = WORLD.Get_size()
    old = os.environ.get("HPCCOLL_NODE_SIZE")
    os.environ["HPCCOLL_NODE_SIZE"] = str(size // 2)
    try:
        c = hpccoll.Communicator(backend="cuda")
    finally:
        if old is None:
            os.environ.pop("HPCCOLL_NODE_SIZE")
        else:
            os.environ["HPCCOLL_NODE_SIZE"] = old
    assert c.backend.startswith("hier(2x"), c.backend
    yield c
    c.Free()


def _ref(op, xs, layout):
    return reduce_in_rank_order(op, [reduce_in_rank_order(op, [xs[r] for r in row]) for row in layout.rank_of])


@pytest.mark.parametrize("op", ["SUM", "MAX"])
def test_allreduce_device(hc, op):
    import cupy as cp

    for it, n in enumerate((1, 7, 4099, 65537)):
        x = np.random.default_rng([WORLD.Get_rank(), it, len(op)]).standard_normal(n).astype(np.float32)
        xs = WORLD.allgather(x)
        out = cp.empty(n, cp.float32)
        hc.Allreduce(cp.asarray(x), out, op=OPS[op], deterministic=True)
        hc.synchronize()
        got = cp.asnumpy(out)
        assert np.array_equal(got.view(np.uint32), _ref(OPS[op], xs, hc._hier.layout).view(np.uint32))
        assert len(set(WORLD.allgather(got.tobytes()))) == 1
        fast = cp.empty(n, cp.float32)
        hc.Allreduce(cp.asarray(x), fast, op=OPS[op], deterministic=False)  # NCCL between nodes
        hc.synchronize()
        np.testing.assert_allclose(cp.asnumpy(fast), got, rtol=1e-5, atol=1e-5)


def test_bcast_allgather_reduce_scatter_device(hc):
    import cupy as cp

    size, rank = WORLD.Get_size(), WORLD.Get_rank()
    for n in (1, 8, 1001):
        x = np.random.default_rng([rank, n]).standard_normal(n).astype(np.float32)
        xs = WORLD.allgather(x)
        for root in range(size):
            b = cp.asarray(x)
            hc.Bcast(b, root=root)
            assert np.array_equal(cp.asnumpy(b), xs[root])
        g = cp.empty(n * size, cp.float32)
        hc.Allgather(cp.asarray(x), g)
        assert np.array_equal(cp.asnumpy(g), np.concatenate(xs))
        big = np.random.default_rng([rank, n, 3]).standard_normal(n * size).astype(np.float32)
        ref = _ref(OPS["SUM"], WORLD.allgather(big), hc._hier.layout)[rank * n:(rank + 1) * n]
        rs = cp.empty(n, cp.float32)
        hc.Reduce_scatter_block(cp.asarray(big), rs, deterministic=True)
        hc.synchronize()
        assert np.array_equal(cp.asnumpy(rs).view(np.uint32), ref.view(np.uint32))
    hc.Barrier()
