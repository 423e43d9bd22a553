"""GPU tests of groups (Communicator.group; hpccoll/backends/cuda/ run_group, the one-shot's
Segments in cuda/collectives.cu), on the GPU machine:

    mpiexec -n 2 python -m pytest --with-mpi tests/gpu/test_group_gpu.py

Fresh random data for every group, compared BITWISE with the fixed-rank-order host reference,
and each test checks how the calls were launched (which ran fused, which alone)."""
from __future__ import annotations


import numpy as np
import pytest
from _gpu_checks import check_bitwise as _check
from _gpu_checks import cc  # noqa: F401 - the module's Communicator fixture
from _gpu_checks import check_nccl_missing_peer_times_out
from _gpu_checks import nccl_shared_gpus, replay_captured_allreduce_then_free, skip_where_nccl_refuses
from _gpu_checks import random_data as _random
from _gpu_checks import world as _world

import hpccoll
from hpccoll.ops import OPS, np_dtype, reduce_in_rank_order

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=2)]


@pytest.fixture
def launches(cc, monkeypatch):
    """[(calls, algorithm)] of every group launch made while the test runs."""
    seen = []
    from hpccoll.backends.cuda import groups

    real = groups._launch

    def spy(b, calls, algo):
        seen.append((len(calls), algo))
        real(b, calls, algo)

    monkeypatch.setattr(groups, "_launch", spy)
    return seen


CASES = [("float32", "auto"), ("float32", "oneshot_ll"), ("float32", "oneshot_sentinel"),
         ("bfloat16", "auto"), ("float64", "oneshot_sentinel"), ("int32", "auto")]


@pytest.mark.parametrize("dtype,algo", CASES)
def test_group_is_bitwise_each_call_alone(cc, launches, dtype, algo):
    """Calls of odd sizes (one element, partial packs, more packs than a block), in place and
    not, sharing an input: one launch, and every result bitwise the rank-order reduction."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 41, CASES.index((dtype, algo))])
    counts = [1, 7, 8, 1023, 4099, 3, 9000, 2]
    for op in ("SUM", "MAX"):
        for rep in range(3):
            xs = [_random(rng, dtype, n, op) for n in counts]
            refs = [reduce_in_rank_order(OPS[op], _world().allgather(x)) for x in xs]
            dxs = [cp.asarray(x) for x in xs]
            outs = [cp.asarray(np.zeros_like(x)) for x in xs]
            shared = cp.empty_like(dxs[3])  # a second call on call 3's input: inputs may be shared
            with cc.group():
                for k, (dx, out) in enumerate(zip(dxs, outs)):
                    if k % 3 == 2:
                        out[...] = dx
                        cc.Allreduce(hpccoll.IN_PLACE, out, op=OPS[op], algorithm=algo)
                    else:
                        cc.Allreduce(dx, out, op=OPS[op], algorithm=algo)
                cc.Allreduce(dxs[3], shared, op=OPS[op], algorithm=algo)
            cc.synchronize()
            for k, (out, ref) in enumerate(zip(outs, refs)):
                _check(cp.asnumpy(out), ref, f"{dtype} {algo} {op} call {k} (n={counts[k]}) rep {rep}")
            _check(cp.asnumpy(shared), refs[3], f"{dtype} {algo} {op} shared input")
    # one launch per group where the algorithm for the group's total is a one-shot that carries
    # it (auto: the tuning table's, which depends on the rank count)
    total = sum(-(-n * np_dtype(dtype).itemsize // 16) * 16 for n in counts + [counts[3]])
    dev = cc._backend
    picked = dev.resolve("Allreduce", dtype, "SUM", total, cc.deterministic, algo)
    if picked in ("oneshot_ll", "oneshot_sentinel") and total <= dev.layout.allreduce[picked][0]:
        assert launches == [(len(counts) + 1, picked)] * 6, launches


def test_group_keeps_order_where_calls_depend_on_each_other(cc, launches):
    """A call whose input is an earlier call's output (and one that overwrites an earlier call's
    input) ends a fused run: the next run starts after it, in stream order."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 43])
    n = 1000
    for rep in range(5):
        x = _random(rng, "float32", n, "SUM")
        xs = _world().allgather(x)
        r1 = reduce_in_rank_order(OPS["SUM"], xs)
        r2 = reduce_in_rank_order(OPS["SUM"], [r1] * cc.size)
        y = _random(rng, "float32", n, "SUM")
        ry = reduce_in_rank_order(OPS["SUM"], _world().allgather(y))
        dx, dy = cp.asarray(x), cp.asarray(y)
        a, b, c, d = (cp.empty(n, cp.float32) for _ in range(4))
        with cc.group():
            cc.Allreduce(dx, a)          # run 1
            cc.Allreduce(dy, b)          # run 1
            cc.Allreduce(a, c)           # reads a: run 2
            cc.Allreduce(dy, d)          # run 2
            cc.Allreduce(dx, dy)         # overwrites run 2's input: alone
        cc.synchronize()
        _check(cp.asnumpy(a), r1, f"a rep {rep}")
        _check(cp.asnumpy(b), ry, f"b rep {rep}")
        _check(cp.asnumpy(c), r2, f"c rep {rep}")
        _check(cp.asnumpy(d), ry, f"d rep {rep}")
        _check(cp.asnumpy(dy), r1, f"dy rep {rep}")
    assert [k for k, _ in launches] == [2, 2] * 5, launches


def test_group_of_many_calls_and_ops(cc, launches):
    """70 calls (one-shot sentinel: 4 MiB per launch, so only the count and the op split them):
    runs of at most 32 calls, split where the op changes; plain calls after the groups keep
    the epochs right.  (With auto, the run also ends where the tuning table stops choosing a
    one-shot for its total: 128 KiB at 4 ranks, which split this test's runs there.)"""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 47])
    ops = ["SUM"] * 40 + ["MAX"] * 20 + ["MIN"] * 10
    for rep in range(3):
        sizes = np.random.default_rng([47, rep]).integers(1, 3000, len(ops))  # the same on every rank
        xs = [_random(rng, "float32", int(n), op) for n, op in zip(sizes, ops)]
        refs = [reduce_in_rank_order(OPS[op], _world().allgather(x)) for x, op in zip(xs, ops)]
        outs = [cp.empty(x.size, cp.float32) for x in xs]
        with cc.group():
            for x, out, op in zip(xs, outs, ops):
                cc.Allreduce(cp.asarray(x), out, op=OPS[op], algorithm="oneshot_sentinel")
        z = _random(rng, "float32", 333, "SUM")
        zo = cp.empty(333, cp.float32)
        cc.Allreduce(cp.asarray(z), zo)
        cc.synchronize()
        for k, (out, ref) in enumerate(zip(outs, refs)):
            _check(cp.asnumpy(out), ref, f"call {k} ({ops[k]}) rep {rep}")
        _check(cp.asnumpy(zo), reduce_in_rank_order(OPS["SUM"], _world().allgather(z)), f"after rep {rep}")
    assert [k for k, _ in launches] == [32, 8, 20, 10] * 3, launches


def test_group_in_a_graph(cc, launches):
    """A group of 20 calls captured into a CUDA graph is one kernel node; 50 replays, each after
    a kernel that rewrote the inputs on the same stream, every result checked on the GPU."""
    import cupy as cp

    n, k, replays = 1027, 20, 50
    s = cp.cuda.Stream(non_blocking=True)
    seed = cp.zeros(1, cp.float32)
    idx = cp.arange(n, dtype=cp.float32)
    xs = [cp.empty(n, cp.float32) for _ in range(k)]
    outs = [cp.empty(n, cp.float32) for _ in range(k)]

    def refill():  # every rank's input j: sin(idx * (0.5 + 0.01 j) + seed + rank)
        for j, x in enumerate(xs):
            cp.sin(idx * (0.5 + 0.01 * j) + seed + float(cc.rank), out=x)

    def group():
        with cc.group():
            for x, out in zip(xs, outs):
                cc.Allreduce(x, out, stream=s)

    with s:
        refill()
        group()  # once before capture: loads the group kernel
        s.synchronize()
        s.begin_capture()
        group()
        g = s.end_capture()
    bad = cp.zeros(1, cp.int64)
    with s:
        for r in range(replays):
            seed[...] = r * 0.37
            refill()
            g.launch(s)
            for j, out in enumerate(outs):
                ref = None
                for q in range(cc.size):  # rank-order float32 sum, as the kernel does
                    v = cp.sin(idx * (0.5 + 0.01 * j) + seed + float(q))
                    ref = v if ref is None else ref + v
                bad += (out.view(cp.uint32) != ref.view(cp.uint32)).sum()
        s.synchronize()
    cc.synchronize(s)
    assert int(bad.get()[0]) == 0
    assert launches == [(k, launches[0][1])] * 2, launches


def test_group_with_an_engine_running(cc, launches):
    """A group's launch while the eager engine runs: synchronize() must wait for it."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 53])
    xs = [_random(rng, "float32", n, "SUM") for n in (5, 700, 4096)]
    refs = [reduce_in_rank_order(OPS["SUM"], _world().allgather(x)) for x in xs]
    dxs = [cp.asarray(x) for x in xs]
    outs = [cp.asarray(np.zeros_like(x)) for x in xs]
    with cc.persistent("float32"):
        with cc.group():
            for dx, out in zip(dxs, outs):
                cc.Allreduce(dx, out)
        cc.synchronize()
        for k, (out, ref) in enumerate(zip(outs, refs)):
            _check(cp.asnumpy(out), ref, f"call {k}")
    assert [k for k, _ in launches] == [3], launches


def test_group_on_the_nccl_backend(cc):
    """backend='nccl': the block is an NCCL group (the bench's grouped baseline)."""
    import cupy as cp

    skip_where_nccl_refuses(cc)
    c = hpccoll.Communicator(backend="nccl")
    try:
        rng = np.random.default_rng([c.rank, 59])
        xs = [_random(rng, "float32", n, "SUM") for n in (1, 1000, 4099)]
        refs = [np.sum(_world().allgather(x), axis=0) for x in xs]
        outs = [cp.empty(x.size, cp.float32) for x in xs]
        with c.group():
            for x, out in zip(xs, outs):
                c.Allreduce(cp.asarray(x), out)
        c.synchronize()
        for out, ref in zip(outs, refs):
            assert np.allclose(cp.asnumpy(out), ref, rtol=1e-5, atol=1e-5)
        c.Barrier()  # (an NCCL allreduce of one float on the current stream)
    finally:
        c.Free()


def test_nccl_rank_that_never_joins_times_out(cc):
    """backend='nccl': rank 0 queues an Allreduce no peer joins; the watchdog aborts NCCL after
    the timeout, so the stream's wait ends and synchronize raises CollectiveTimeout, and the
    communicator stays broken.  The peers wait past the timeout before freeing."""
    skip_where_nccl_refuses(cc)
    c = hpccoll.Communicator(backend="nccl", timeout=2.0)
    try:
        check_nccl_missing_peer_times_out(c, 1000, waiting=c.rank == 0)
    finally:
        c.Free()


def test_nccl_free_returns_while_a_graph_that_captured_its_calls_lives(cc):
    """NCCL's destroy waits until every CUDA graph that captured the communicator's calls is
    destroyed: Free() with such a graph still alive returns all the same, and NCCL's release
    finishes once the graph goes."""
    import gc

    skip_where_nccl_refuses(cc)
    c = hpccoll.Communicator(backend="nccl")
    h = np.random.default_rng().standard_normal(4099)
    ref = np.sum(_world().allgather(h), axis=0)
    got, kept = replay_captured_allreduce_then_free(c, h)
    assert np.allclose(got, ref, rtol=1e-12, atol=1e-12)
    del kept  # the graph goes
    gc.collect()
    c._backend.releaser.join(20)
    assert not c._backend.releaser.is_alive(), "NCCL did not release the communicator after the graph went"


def test_an_nccl_call_behind_long_gpu_work_is_not_timed_out(cc):
    """The watchdog's clock for a call starts when the work before it on its stream is done: an
    NCCL call queued behind about three timeouts of other GPU work completes, right.  Each rank
    alone (a one-rank NCCL communicator, which runs with ranks sharing a GPU too)."""
    import time

    import cupy as cp
    from _gpu_checks import spin_on

    sub = _world().Split(cc.rank, 0)
    c = hpccoll.Communicator(sub, backend="nccl", timeout=1.0)
    try:
        s = cp.cuda.Stream(non_blocking=True)
        h = np.random.default_rng().standard_normal(1000)
        with s:
            x, y = cp.asarray(h), cp.zeros(h.size)
        s.synchronize()
        t0 = time.monotonic()
        spin_on(s, 6_000_000_000)  # about 3 s on an H200
        c.Allreduce(x, y, stream=s)
        c.synchronize(stream=s)
        assert time.monotonic() - t0 > 2.0, "the spin was shorter than two timeouts: lengthen it"
        assert np.array_equal(cp.asnumpy(y), h)
    finally:
        c.Free()
        sub.Free()


def test_nccl_on_a_shared_gpu_says_which_ranks_share_it(cc):
    """Ranks sharing a GPU (MPS): backend='nccl' raises HpccollError on every rank, naming the
    ranks and the GPU and the fix, instead of NCCL's bare 'invalid usage'."""
    if not nccl_shared_gpus(cc):
        pytest.skip("needs ranks sharing a GPU as NCCL sees them (more ranks than GPUs, under MPS, "
                    "without HPCCOLL_TEST_NCCL_LOOPBACK)")
    with pytest.raises(hpccoll.HpccollError, match=r"one GPU per rank.*share GPU .*backend='cuda'"):
        hpccoll.Communicator(backend="nccl")
    # nothing was left half-open: the communicator still computes
    import cupy as cp

    x = cp.full(7, cc.rank + 1.0)
    out = cp.empty_like(x)
    cc.Allreduce(x, out)
    assert float(out[0]) == cc.size * (cc.size + 1) / 2


def test_group_with_buffers_aligned_on_some_ranks_only(cc, launches):
    """Odd ranks pass buffers 4 bytes off 16-byte alignment, even ranks aligned ones: every rank
    makes the same single launch (unaligned buffers through aligned copies), each result bitwise
    the rank-order reduction.  (A rank launching its unaligned calls one by one would meet no
    peer: they wait in the group's launch.)"""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 71])
    off = cc.rank % 2
    counts = [5, 64, 1001, 3]
    for rep in range(3):
        xs = [rng.standard_normal(n).astype(np.float32) for n in counts]
        refs = [reduce_in_rank_order(OPS["SUM"], _world().allgather(x)) for x in xs]
        dxs, outs = [], []
        for k, x in enumerate(xs):
            dx = cp.zeros(x.size + off, np.float32)[off:]
            dx[...] = cp.asarray(x)
            dxs.append(dx)
            outs.append(cp.zeros(x.size + 1, np.float32)[(k + off) % 2:][:x.size])
        with cc.group():
            for k, (dx, out) in enumerate(zip(dxs, outs)):
                if k == 3:
                    cc.Allreduce(hpccoll.IN_PLACE, dx, algorithm="oneshot_ll")
                else:
                    cc.Allreduce(dx, out, algorithm="oneshot_ll")
        cc.synchronize()
        for k, ref in enumerate(refs):
            got = dxs[k] if k == 3 else outs[k]
            _check(cp.asnumpy(got), ref, f"call {k} (n={counts[k]}) rep {rep}, rank {cc.rank} offset {off}")
    assert launches == [(len(counts), "oneshot_ll")] * 3, launches


def test_check_mode_refuses_a_group_launched_differently_on_some_ranks(cc, launches):
    """Rank 0's second call reads its first call's output (so it must run after it), the other
    ranks' calls are independent: without check mode rank 0 would launch them one by one and
    its peers together.  Check mode raises MismatchError on every rank before any launch; the
    communicator stays usable."""
    import cupy as cp

    c = hpccoll.Communicator(backend="cuda", check=True)
    try:
        rng = np.random.default_rng([c.rank, 73])
        x = rng.standard_normal(100).astype(np.float32)
        ref = reduce_in_rank_order(OPS["SUM"], _world().allgather(x))
        dx, y, z = cp.asarray(x), cp.zeros(100, np.float32), cp.zeros(100, np.float32)
        with pytest.raises(hpccoll.MismatchError, match="group: ranks would issue different launches"):
            with c.group():
                c.Allreduce(dx, y, algorithm="oneshot_ll")
                c.Allreduce(y if c.rank == 0 else dx, z, algorithm="oneshot_ll")
        assert launches == []
        assert not cp.asnumpy(y).any() and not cp.asnumpy(z).any()  # nothing was issued
        with c.group():  # alike on every rank: one launch
            c.Allreduce(dx, y, algorithm="oneshot_ll")
            c.Allreduce(dx, z, algorithm="oneshot_ll")
        c.synchronize()
        assert launches == [(2, "oneshot_ll")]
        _check(cp.asnumpy(y), ref, "after the mismatch, call 0")
        _check(cp.asnumpy(z), ref, "after the mismatch, call 1")
    finally:
        c.Free()
