"""Capture fusion (hpccoll/backends/cuda/fusion.py): Allreduce calls captured back to back on one stream run
as one graph node, bit for bit the results of the same calls launched one by one.

Run with mpiexec -n 2 (or 3, with MPS on 2 GPUs) and pytest --with-mpi -m gpu."""
from __future__ import annotations

import numpy as np
import pytest
from _gpu_checks import bits, cc, random_data  # noqa: F401 - cc: the module's Communicator fixture
from _gpu_checks import world as _world

import hpccoll
from hpccoll._abi import CHAIN_MAX
from hpccoll.backends.cuda.fusion import nodes_of
from hpccoll.ops import OPS, np_dtype, reduce_in_rank_order

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=2)]

# (input, output) of each call, over buffers a, d (refilled before every replay) and b, c, e:
# every source of a call's input that the kernel has (hc_common.cuh, HC_SRC_*) occurs.
SEQUENCE = [
    ("a", "b"),  # load
    ("b", "b"),  # in place: forwards the previous result
    ("b", "c"),  # forward
    ("b", "e"),  # keep: the previous call's input, which it did not write
    ("d", "c"),  # load; c overwritten
    ("c", "c"),  # forward, in place
    ("a", "a"),  # load, in place on an input
    ("a", "e"),  # forward
    ("e", "b"),  # forward
    ("d", "d"),  # load, in place
    ("d", "e"),  # forward
    ("b", "c"),  # load of what call 9 wrote (the same thread wrote it)
]
NAMES = "abcde"


def _graph_nodes(graph) -> int:
    return nodes_of(int(graph.graph))


def _capture(cc, s, body):
    """body() captured on stream s; -> (graph, calls the fuser appended to a node)."""
    fuser = cc._backend.fuser
    assert fuser is not None, "HPCCOLL_FUSE is off in this run"
    before = fuser.fused
    s.begin_capture()
    try:
        body()
    finally:
        graph = s.end_capture()
    return graph, fuser.fused - before


def _run_sequence(cc, bufs, algo, op, s):
    for src, dst in SEQUENCE:
        send = hpccoll.IN_PLACE if src == dst else bufs[src]  # (the same buffer twice is an overlap)
        cc.Allreduce(send, bufs[dst], op=OPS[op], algorithm=algo, deterministic=True, stream=s)


def _host_reference(inputs_by_rank, op, dtype):
    """SEQUENCE on the host, every call reduced in rank order (identical inputs on all ranks
    after the first call that reads a result)."""
    nr = len(inputs_by_rank)
    state = [dict(x) for x in inputs_by_rank]  # per rank: name -> array
    for src, dst in SEQUENCE:
        red = reduce_in_rank_order(OPS[op], [state[r][src] for r in range(nr)])
        for r in range(nr):
            state[r][dst] = red.copy()
    return state


CASES = [("oneshot_sentinel", "float32", "SUM"), ("oneshot_sentinel", "bfloat16", "MAX"),
         ("oneshot_ll", "float32", "SUM"), ("oneshot_ll", "int32", "SUM"), ("oneshot_ll", "float64", "PROD"),
         ("oneshot_sentinel", "float64", "MIN"),
         # auto: the LL in chains up to FUSE_LL_MAX, the sentinel above; eager calls: the sentinel
         ("auto", "float32", "SUM"), ("auto", "bfloat16", "SUM")]
# 7 elements: one thread; 4099: a partial last pack; 65537 fp32: 129 blocks of 128; 300001
# fp32: more packs than threads (the chain's loop path)
COUNTS = [7, 4099, 65537, 300001]


@pytest.mark.parametrize("algo,dtype,op", CASES)
@pytest.mark.parametrize("n", COUNTS)
def test_chain_of_dependent_calls_is_one_node_and_exact(cc, algo, dtype, op, n):
    """SEQUENCE captured: one node (all 12 calls appended to the first; none where `auto`
    resolves to a two-shot), replayed with fresh inputs every time, checked bitwise against the host's rank-order reduction and against the
    same calls launched one by one (not captured)."""
    import cupy as cp

    if n * np_dtype(dtype).itemsize > cc._backend.layout.allreduce["oneshot_sentinel" if algo == "auto" else algo][0]:
        pytest.skip(f"{n} elements are more than one {algo} launch carries (not fused)")
    rank = cc.rank
    rng = np.random.default_rng([rank, n, len(algo), len(dtype)])
    s = cp.cuda.Stream(non_blocking=True)
    npd = np_dtype(dtype)
    with s:  # (every array made on s, where the calls run: the default stream does not order them)
        bufs = {k: cp.zeros(n, dtype=npd) for k in NAMES}
        eager = {k: cp.zeros(n, dtype=npd) for k in NAMES}
        _run_sequence(cc, bufs, algo, op, s)  # warm: compiles, plans
    s.synchronize()
    graph, fused = _capture(cc, s, lambda: _run_sequence(cc, bufs, algo, op, s))
    nbytes = n * npd.itemsize
    dev = cc._backend
    if dev.chain_algorithm(algo, dev.resolve("Allreduce", dtype, op, nbytes, True, algo), nbytes) is None:
        # auto chose a two-shot here (4 or 8 ranks above the table's one-shot sizes): no chain
        assert fused == 0 and _graph_nodes(graph) == len(SEQUENCE)
    else:
        assert fused == len(SEQUENCE) - 1, f"{fused} calls fused, want {len(SEQUENCE) - 1}"
        assert _graph_nodes(graph) == 1
    world = _world()
    for rep in range(4):
        ins = {k: random_data(rng, dtype, n, op) for k in "ad"}
        every = world.allgather(ins)
        with s:
            for k in "ad":
                bufs[k][...] = cp.asarray(ins[k])
                eager[k][...] = cp.asarray(ins[k])
            for k in "bce":
                bufs[k][...] = 0
            graph.launch(s)
            _run_sequence(cc, eager, algo, op, s)
        s.synchronize()
        cc.synchronize(s)
        want = _host_reference([{**e, "b": 0, "c": 0, "e": 0} for e in every], op, dtype)[rank]
        for k in NAMES:
            got, ref = cp.asnumpy(bufs[k]), cp.asnumpy(eager[k])
            assert np.array_equal(bits(got), bits(ref)), f"replay {rep}: {k} differs from the unfused calls"
            assert np.array_equal(bits(got), bits(np.asarray(want[k], dtype=npd))), \
                f"replay {rep}: {k} differs from the host's rank-order reduction"


def test_what_breaks_a_chain(cc):
    """A user kernel, another count, a partly overlapping buffer, another algorithm or op, and
    the CHAIN_MAX-th call each start a new node; results stay exact."""
    import cupy as cp

    s = cp.cuda.Stream(non_blocking=True)
    n = 1000
    with s:  # (made on s, where the calls run)
        x = cp.arange(n, dtype=cp.float32) * (cc.rank + 1)
        y, z = cp.empty(n, cp.float32), cp.empty(n, cp.float32)
        w = cp.empty(2 * n, cp.float32)
    det = {"deterministic": True, "stream": s}
    sr = sum(range(1, cc.size + 1))

    def body():
        cc.Allreduce(x, y, algorithm="oneshot_sentinel", **det)          # node 1
        cc.Allreduce(x, z, algorithm="oneshot_sentinel", **det)          # joins node 1
        with s:
            cp.multiply(z, 0.5, out=z)                                   # a user kernel: node 2
        cc.Allreduce(hpccoll.IN_PLACE, z, algorithm="oneshot_sentinel", **det)          # node 3
        cc.Allreduce(x[:n // 2], y[:n // 2], algorithm="oneshot_sentinel", **det)  # another count: node 4
        cc.Allreduce(x[:n // 2], w[:n // 2], algorithm="oneshot_sentinel", **det)  # joins node 4
        cc.Allreduce(x[:n // 2], w[8:8 + n // 2], algorithm="oneshot_sentinel", **det)  # overlaps w: node 5
        cc.Allreduce(x[:n // 2], w[n:n + n // 2], algorithm="oneshot_ll", **det)  # another algorithm: node 6
        cc.Allreduce(x[:n // 2], w[n:n + n // 2], op=OPS["MAX"], algorithm="oneshot_ll", **det)  # another op: node 7
        for _ in range(CHAIN_MAX + 1):                                   # node 8 full, then node 9
            cc.Allreduce(hpccoll.IN_PLACE, y, algorithm="oneshot_ll", **det)

    with s:
        body()  # warm
    s.synchronize()
    graph, fused = _capture(cc, s, body)
    assert _graph_nodes(graph) == 9
    assert fused == 1 + 1 + (CHAIN_MAX - 1) + 0
    with s:
        for a in (y, z, w):
            a[...] = 0
        graph.launch(s)
    s.synchronize()
    base = np.arange(n, dtype=np.float32)
    tot = (base * np.float32(sr)).astype(np.float32)
    zz = (tot * np.float32(0.5) * np.float32(cc.size)).astype(np.float32)
    yy = tot.copy()
    yy[: n // 2] = tot[: n // 2]
    for _ in range(CHAIN_MAX + 1):
        yy = (yy * np.float32(cc.size)).astype(np.float32)
    np.testing.assert_array_equal(cp.asnumpy(z), zz)
    np.testing.assert_array_equal(cp.asnumpy(y), yy)
    ww = cp.asnumpy(w)
    np.testing.assert_array_equal(ww[8:8 + n // 2], tot[: n // 2])
    np.testing.assert_array_equal(ww[n:n + n // 2], base[: n // 2] * np.float32(cc.size))  # MAX: the last rank's x
    cc.synchronize()


def test_eager_calls_on_a_stream_are_not_fused(cc):
    """Not capturing: the same calls launch one by one (nothing appended), results exact."""
    import cupy as cp

    s = cp.cuda.Stream(non_blocking=True)
    with s:  # (made on s, where the calls run)
        x = cp.ones(333, cp.float32)
        y = cp.empty_like(x)
    before = cc._backend.fuser.fused
    for _ in range(5):
        cc.Allreduce(x, y, algorithm="oneshot_sentinel", deterministic=True, stream=s)
        cc.Allreduce(hpccoll.IN_PLACE, y, algorithm="oneshot_sentinel", deterministic=True, stream=s)
    s.synchronize()
    assert cc._backend.fuser.fused == before
    assert float(y[0]) == cc.size * cc.size
