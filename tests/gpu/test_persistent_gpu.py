"""GPU tests of the eager engine (hpccoll/backends/cuda/engine.py, cuda/persistent.cu), on the GPU machine:

    mpiexec -n 2 python -m pytest --with-mpi tests/gpu/test_persistent_gpu.py

Fresh random data every call, compared BITWISE with the fixed-rank-order host reference (the
engine runs the one-shot LL), and each test checks the engine really served the calls.
Every CuPy kernel a test runs while an engine is up has run once before it started: loading a
kernel may synchronize the context, which would wait for the engine (hpccoll/backends/cuda/engine.py)."""
from __future__ import annotations


import numpy as np
import pytest

from _gpu_checks import check_bitwise as _check
from _gpu_checks import cc  # noqa: F401 - the module's Communicator fixture  # (importing it also pre-imports cupyx: see there)
from _gpu_checks import random_data as _random
from _gpu_checks import world as _world

import hpccoll
from hpccoll.ops import OPS, reduce_in_rank_order

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=2)]

# 1 element up to the engine's 256 KiB; odd counts, a partial last pack, more packs than threads
COUNTS = {"float32": [1, 3, 8, 1023, 2048, 2049, 16384 + 5, 65536],
          "bfloat16": [1, 7, 9, 4097, 131072],
          "float64": [1, 5, 1023, 32768],
          "int32": [1, 2, 4095, 65536]}


def _engine(cc, dtype):
    return cc._backend.engines.engines()[dtype]


@pytest.mark.parametrize("pair", [("float32", "bfloat16"), ("float64", "int32")])
def test_engine_allreduce_is_bitwise_rank_order(cc, pair):
    """Two engines at once (two dtypes), every op, every count, out of place and in place."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, hash(pair) & 0xFFFF, 7])
    with cc.persistent(pair[0], blocks=8, max_bytes=256 * 1024), cc.persistent(pair[1], blocks=8, max_bytes=256 * 1024):
        served = {d: _engine(cc, d).calls for d in pair}
        expected = {d: 0 for d in pair}
        for dtype in pair:
            for op in OPS:
                for n in COUNTS[dtype]:
                    x = _random(rng, dtype, n, op)
                    ref = reduce_in_rank_order(OPS[op], _world().allgather(x))
                    dx = cp.asarray(x)
                    out = cp.asarray(np.full_like(x, 7))  # a copy, not a fill kernel
                    cc.Allreduce(dx, out, op=OPS[op])
                    # blocking: no synchronize before reading (the copy runs on the same stream anyway)
                    _check(cp.asnumpy(out), ref, f"{dtype} {op} n={n}")
                    assert np.array_equal(cp.asnumpy(dx), x), "sendbuf was modified"
                    cc.Allreduce(hpccoll.IN_PLACE, dx, op=OPS[op], deterministic=True)
                    _check(cp.asnumpy(dx), ref, f"{dtype} {op} n={n} in place")
                    expected[dtype] += 2
        for d in pair:
            assert _engine(cc, d).calls - served[d] == expected[d], f"{d}: not every call went to the engine"


def test_engine_orders_after_the_stream_and_repeats(cc):
    """The same buffers again and again (the fast path), each call right after a kernel on the
    stream that rewrote the input: the engine must wait for it and never see stale input."""
    import cupy as cp

    n = 4099
    base = cp.asarray(np.random.default_rng([cc.rank, 3]).standard_normal(n).astype(np.float32))
    x = cp.empty_like(base)
    out = cp.empty_like(base)
    refs_in = _world().allgather(cp.asnumpy(base))
    cp.multiply(base, np.float32(1), out=x)  # load both kernels before the engine starts
    x += np.float32(0)
    with cc.persistent("float32"):
        eng = _engine(cc, "float32")
        before = eng.calls
        for i in range(200):
            cp.multiply(base, np.float32(i % 7 + 1), out=x)  # a kernel the engine must wait for
            x += np.float32(i)
            cc.Allreduce(x, out)
            if i % 20 == 19:
                ref = reduce_in_rank_order(OPS["SUM"], [(r * np.float32(i % 7 + 1)) + np.float32(i)
                                                        for r in refs_in])
                _check(cp.asnumpy(out), ref, f"call {i}")
        assert eng.calls - before == 200


def test_engine_mixes_with_launched_collectives_and_restarts(cc):
    """Engine calls between launched kernels (sentinel Allreduce, Bcast, LL beyond max_bytes)
    and across a stop and a restart (the LL flags of the engine's region must keep counting)."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 11])

    def step(what, i):
        n = [5, 1000, 16384, 16385][i % 4]  # 16385 floats > 64 KiB: launched as usual
        x = rng.standard_normal(n).astype(np.float32)
        ref = reduce_in_rank_order(OPS["SUM"], _world().allgather(x))
        dx, out = cp.asarray(x), cp.empty(n, np.float32)
        cc.Allreduce(dx, out)
        cc.synchronize()
        _check(cp.asnumpy(out), ref, f"{what} call {i} n={n}")
        y = cp.asarray(rng.standard_normal(300).astype(np.float32))
        cc.Allreduce(hpccoll.IN_PLACE, y, algorithm="oneshot_sentinel")  # launched
        b = cp.arange(513, dtype=cp.float64) * (i + 1) if cc.rank == i % cc.size else cp.zeros(513)
        cc.Bcast(b, root=i % cc.size)
        cc.synchronize()
        assert float(b[512]) == 512.0 * (i + 1)

    for i in range(4):  # without an engine: every kernel of the steps loaded
        step("warm-up", i)
    for round_ in range(3):
        with cc.persistent("float32", max_bytes=64 * 1024):
            eng = _engine(cc, "float32")
            before = eng.calls
            for i in range(12):
                step(f"round {round_}", i)
            assert eng.calls - before == 9  # the 16385-float calls were launched


def test_engine_falls_back_under_graph_capture(cc):
    import cupy as cp

    s = cp.cuda.Stream(non_blocking=True)
    with s:  # (made on s, where the calls run: the default stream does not order them)
        x = cp.asarray(np.full(777, cc.rank + 1, np.float32))
        out = cp.empty_like(x)
        out.fill(0)  # the fill kernel, loaded before the engine starts
    s.synchronize()
    with cc.persistent("float32"):
        cc.Allreduce(x, out, stream=s)  # engine (and plan noted)
        fuser = cc._backend.fuser
        fused = fuser.fused if fuser is not None else None
        with s:
            s.begin_capture()
            for _ in range(3):
                cc.Allreduce(x, out, stream=s)  # launched into the graph
            g = s.end_capture()
        if fuser is not None:  # back to back: one chain node (hpccoll/backends/cuda/fusion.py), its kernel loaded at start
            assert fuser.fused - fused == 2
        with s:
            out.fill(0)
        g.launch(s)
        cc.synchronize(s)
        total = cc.size * (cc.size + 1) / 2
        assert np.all(cp.asnumpy(out) == total)


def test_engine_bad_arguments(cc):
    with pytest.raises(TypeError):
        cc.start_persistent("complex64")
    with pytest.raises(ValueError, match="blocks"):
        cc.start_persistent("float32", blocks=0)
    with pytest.raises(ValueError, match="max_bytes"):
        cc.start_persistent("float32", max_bytes=1 << 30)
    with cc.persistent("float32"):
        with pytest.raises(ValueError, match="already runs"):
            cc.start_persistent("float32")
    with pytest.raises(ValueError, match="no engine runs"):
        cc.stop_persistent("float32")


def test_engine_peer_that_never_calls_times_out():
    """Rank 0 posts an Allreduce the others never make: CollectiveTimeout from the call itself
    (it is blocking), within the timeout, and Free() afterwards does not hang."""
    import time

    import cupy as cp

    c = hpccoll.Communicator(backend="cuda", timeout=2.0)
    try:
        x = cp.asarray(np.ones(1000, dtype=np.float32))
        c.start_persistent("float32")
        if c.rank == 0:
            t0 = time.perf_counter()
            with pytest.raises(hpccoll.CollectiveTimeout) as info:
                c.Allreduce(x, cp.empty_like(x))
            assert time.perf_counter() - t0 < 15
            assert "Allreduce" in str(info.value)
            with pytest.raises(hpccoll.CollectiveTimeout):  # the communicator stays broken
                c.Allreduce(x, cp.empty_like(x))
    finally:
        c.Free()


def test_timeout_inside_a_persistent_block_leaves_it_as_the_timeout():
    """Rank 0's engine call times out inside `with c.persistent()`: the block exits with that
    CollectiveTimeout (the timeout stopped the engine: the exit must not stop it again and
    replace the timeout with an error of its own); the peers' blocks exit normally, and Free()
    returns on every rank."""
    import cupy as cp

    c = hpccoll.Communicator(backend="cuda", timeout=2.0)
    try:
        x = cp.asarray(np.ones(1000, dtype=np.float32))
        out = cp.empty_like(x)
        if c.rank == 0:
            with pytest.raises(hpccoll.CollectiveTimeout, match="Allreduce"):
                with c.persistent("float32"):
                    c.Allreduce(x, out)
        else:
            with c.persistent("float32"):
                pass
    finally:
        c.Free()


@pytest.mark.parametrize("full_ring", ["default", "every 4th call"])
def test_engine_blocks_skip_and_rejoin(cc, full_ring):
    """Calls of <= 16 KiB run on block 0 alone (2 packs per thread), larger ones on more blocks,
    over the threads of those blocks only: 300 calls of random sizes switch between them, so
    blocks skip calls and rejoin later (their epochs come from the call's sequence number), a
    pack's thread changes between calls, and the call's fields change while a block skips (its
    own copy of them is re-read when its doorbell says they changed); every result checked
    bitwise.  "every 4th call": the host's periodic ring of every block (once every 2**30 calls
    in the library) on every 4th call, so that blocks a call does not need take part in it."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 21])
    pick = np.random.default_rng(5)  # the same sizes on every rank
    bufs = {n: (cp.empty(n, np.float32), cp.empty(n, np.float32))
            for n in (3, 700, 2049, 4096, 4097, 9000, 12289, 65536)}
    sizes = list(bufs)
    with cc.persistent("float32", blocks=8, max_bytes=256 * 1024):
        eng = _engine(cc, "float32")
        if full_ring != "default":
            eng.full_ring = 3
        before = eng.calls
        for i in range(300):
            n = sizes[pick.integers(len(sizes))]
            x = rng.standard_normal(n).astype(np.float32)
            ref = reduce_in_rank_order(OPS["SUM"], _world().allgather(x))
            dx, out = bufs[n]
            dx.set(x)
            cc.Allreduce(dx, out)
            _check(cp.asnumpy(out), ref, f"call {i} n={n} ({eng.blocks_for(n)} block(s))")
        assert eng.calls - before == 300


_SPIN = r"""extern "C" __global__ void hc_test_spin(long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while ((long long)(t - t0) < ns);
}"""


def test_engine_caller_order(cc):
    """order='caller': the engine skips its stream query, the caller synchronizes before each
    call.  100 calls, each on input a kernel rewrote just before (then synchronized), checked
    bitwise.  Then, in the check mode, a call made while a 200 ms kernel still runs on its
    stream raises on every rank (so none posts), and the engine serves the next call."""
    import cupy as cp

    n = 3001
    rng = np.random.default_rng([cc.rank, 31])
    base = cp.asarray(rng.standard_normal(n).astype(np.float32))
    bases = _world().allgather(cp.asnumpy(base))
    x, out = cp.empty_like(base), cp.empty_like(base)
    spin = cp.RawKernel(_SPIN, "hc_test_spin")
    stream = cp.cuda.get_current_stream()
    cp.multiply(base, np.float32(1), out=x)  # every kernel loaded before the engine starts
    x += np.float32(0)
    spin((1,), (1,), (np.int64(0),))
    stream.synchronize()

    rng_shared = np.random.default_rng(17)  # the same factors on every rank

    def expect(i):
        k = np.float32(rng_shared.integers(1, 9))
        return k, reduce_in_rank_order(OPS["SUM"], [b * k + np.float32(i) for b in bases])

    with cc.persistent("float32", order="caller"):
        eng = _engine(cc, "float32")
        assert eng.order == "caller"
        before = eng.calls
        for i in range(100):
            k, ref = expect(i)
            cp.multiply(base, k, out=x)
            x += np.float32(i)
            stream.synchronize()  # the caller's part of the contract
            cc.Allreduce(x, out)
            _check(cp.asnumpy(out), ref, f"call {i}")
        assert eng.calls - before == 100

    cc.check = True
    try:
        with cc.persistent("float32", order="caller"):
            eng = _engine(cc, "float32")
            assert eng.verify
            spin((1,), (1,), (np.int64(200_000_000),))
            with pytest.raises(hpccoll.HpccollError, match="order='caller'.*synchronize the stream"):
                cc.Allreduce(x, out)
            stream.synchronize()
            k, ref = expect(100)
            cp.multiply(base, k, out=x)
            x += np.float32(100)
            stream.synchronize()
            before = eng.calls
            cc.Allreduce(x, out)
            assert eng.calls - before == 1
            _check(cp.asnumpy(out), ref, "after the refused call")
    finally:
        cc.check = False


def test_engine_with_buffers_aligned_on_some_ranks_only(cc):
    """Odd ranks pass buffers 4 bytes off 16-byte alignment, even ranks aligned ones: every
    rank's call should go to the engine (an unaligned buffer through an aligned copy), the
    results bitwise the rank-order reduction.  The calls run on a non-blocking stream and their
    results are read on the default stream with no synchronize between: an engine call is
    blocking, the unaligned rank's copy back included.  The buffers are filled before the engine
    starts: inside the block only the calls and device-to-host copies run (a CuPy kernel loaded
    there would wait for the engine, docs/api.md)."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 67])
    off = cc.rank % 2
    cases = []
    for n in (1, 7, 1000, 4099):
        x = rng.standard_normal(n).astype(np.float32)
        ref = reduce_in_rank_order(OPS["SUM"], _world().allgather(x))
        dx = cp.zeros(n + off, np.float32)[off:]
        dx.set(x)
        out = cp.zeros(n + 1, np.float32)[1 - off:1 - off + n]  # the other alignment than dx's
        cases.append((n, ref, dx, out))
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    with cc.persistent("float32"):
        eng = _engine(cc, "float32")
        before = eng.calls
        for n, ref, dx, out in cases:
            cc.Allreduce(dx, out, stream=s)
            _check(cp.asnumpy(out), ref, f"n={n} (rank {cc.rank}: input {'un' * off}aligned)")
            cc.Allreduce(hpccoll.IN_PLACE, dx, stream=s)
            _check(cp.asnumpy(dx), ref, f"in place n={n}")
        assert eng.calls - before == 8
