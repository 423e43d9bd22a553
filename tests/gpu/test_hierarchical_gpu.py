"""Hierarchical collectives with device buffers on simulated nodes (HPCCOLL_NODE_SIZE):
2 ranks = 2 nodes of 1 GPU; 4 ranks under MPS = 2 nodes of 2 ranks.  CUDA kernels inside a
node, MPI (deterministic) or NCCL (otherwise) between nodes.  Allreduce from the threshold
(HPCCOLL_HIER_RSAG_BYTES) on runs "rsag": CUDA Reduce_scatter in the
node, inter-node Allreduce of a shard, CUDA Allgather; it needs 2 ranks per node (4 under MPS)."""
from __future__ import annotations

import numpy as np
import pytest
from _gpu_checks import assert_close as _assert_close
from _gpu_checks import check_calls_follow_their_stream, check_nccl_missing_peer_times_out, reduce_by_nodes
from _gpu_checks import hc  # noqa: F401 - the module's hierarchical Communicator fixture
from mpi4py import MPI

import hpccoll
from hpccoll.ops import OPS

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=2)]
WORLD = MPI.COMM_WORLD


def _ref(op, xs, layout):
    return reduce_by_nodes(op, xs, layout.rank_of)


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
        assert np.array_equal(got.view(np.uint32), _ref(OPS[op], xs, hc._backend.layout).view(np.uint32))
        assert len(set(WORLD.allgather(got.tobytes()))) == 1
        fast = cp.empty(n, cp.float32)
        hc.Allreduce(cp.asarray(x), fast, op=OPS[op], deterministic=False)  # NCCL between nodes
        hc.synchronize()
        _assert_close(cp.asnumpy(fast), got, rtol=1e-5, atol=1e-5)


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
        ref = _ref(OPS["SUM"], WORLD.allgather(big), hc._backend.layout)[rank * n:(rank + 1) * n]
        rs = cp.empty(n, cp.float32)
        hc.Reduce_scatter_block(cp.asarray(big), rs, deterministic=True)
        hc.synchronize()
        assert np.array_equal(cp.asnumpy(rs).view(np.uint32), ref.view(np.uint32))
    hc.Barrier()


@pytest.mark.parametrize("dtype, op", [("float32", "SUM"), ("float32", "MAX"), ("int32", "SUM")])
def test_allreduce_device_rsag(hc, monkeypatch, dtype, op):
    """Sizes from the threshold up (shards padded when the count is odd): same bits as the
    hierarchical order on every rank, twice, in place; NCCL between nodes when not deterministic."""
    import cupy as cp

    if hc._backend.layout.per_node == 1:
        pytest.skip("rsag needs more than one rank per node: run at 4 ranks (MPS)")
    ran, real = [], hc._backend._allreduce_rsag

    def spy(call, *rest):  # the counts that ran the rsag variant
        ran.append(call.recv.count)
        return real(call, *rest)

    monkeypatch.setattr(hc._backend, "_allreduce_rsag", spy)
    n0 = max(1, -(-hc._backend.rsag_bytes // 4))
    counts = (n0, n0 + 1, 3 * n0 + 7)
    for it, n in enumerate(counts):
        rng = np.random.default_rng([WORLD.Get_rank(), it, len(op), 7])
        x = (rng.standard_normal(n) if dtype == "float32" else rng.integers(-1000, 1000, n)).astype(dtype)
        ref = _ref(OPS[op], WORLD.allgather(x), hc._backend.layout)
        out = cp.empty(n, dtype)
        hc.Allreduce(cp.asarray(x), out, op=OPS[op], deterministic=True)
        hc.synchronize()
        got = cp.asnumpy(out)
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), f"{dtype} {op} n={n}"
        assert len(set(WORLD.allgather(got.tobytes()))) == 1, f"{dtype} {op} n={n}: ranks differ"
        again = cp.asarray(x)
        hc.Allreduce(hpccoll.IN_PLACE, again, op=OPS[op], deterministic=True)
        hc.synchronize()
        assert np.array_equal(cp.asnumpy(again).view(np.uint32), got.view(np.uint32)), "second run / in place"
        fast = cp.empty(n, dtype)
        hc.Allreduce(cp.asarray(x), fast, op=OPS[op], deterministic=False)  # NCCL between nodes
        hc.synchronize()
        _assert_close(cp.asnumpy(fast), got, rtol=1e-5, atol=1e-5)
    assert ran == [n for n in counts for _ in range(3)]


def test_nccl_between_nodes_exactly_where_the_inter_node_groups_hold_distinct_gpus(hc):
    """The inter-node phase takes NCCL where it can run: NCCL is there and no two ranks of an
    inter-node group (same node-local rank) share a GPU, GPUs told apart as NCCL does, by host
    (NCCL_HOSTID where set) and PCI bus (on real nodes every group has the same ordinals on
    different GPUs; under HPCCOLL_TEST_NCCL_LOOPBACK=1 every rank is a host of its own)."""
    from hpccoll.backends.nccl import nccl_unavailable_reason
    from hpccoll.backends.topology import nccl_identity

    layout = hc._backend.layout
    gpus = WORLD.allgather(nccl_identity(hc._backend.device_id))
    groups = [[gpus[r] for r in group] for group in zip(*layout.rank_of)]
    distinct = all(len(set(g)) == len(g) for g in groups)
    assert ("nccl" in hc.backend) == (distinct and nccl_unavailable_reason() is None), (hc.backend, groups)


def test_calls_on_a_stream_follow_its_earlier_work(hc):
    """As the flat backend's test: the hierarchical calls' own copies (the in-place Allgather's
    slice, the Reduce_scatter's regrouped blocks) run on the call's stream, after its earlier
    work, and the node and stripe phases after them."""
    check_calls_follow_their_stream(hc, 92)


def test_nccl_between_nodes_times_out_when_the_other_node_never_comes(hc, monkeypatch):
    """A non-deterministic device Allreduce that only the first node's ranks issue: its node
    phase runs, NCCL between the nodes waits for a node that never comes, the watchdog aborts it
    after the timeout, and synchronize raises CollectiveTimeout instead of returning what the
    aborted phase left.  The other node's ranks wait past the timeout, then free."""
    monkeypatch.setenv("HPCCOLL_NODE_SIZE", str(WORLD.Get_size() // 2))
    c = hpccoll.Communicator(backend="cuda", timeout=2.0)
    try:
        if c._backend.stripe_nccl is None:
            pytest.skip("no NCCL between these nodes (ranks sharing a GPU: HPCCOLL_TEST_NCCL_LOOPBACK=1 runs it)")
        check_nccl_missing_peer_times_out(c, 4099, waiting=c._backend.layout.node == 0, deterministic=False)
    finally:
        c.Free()
