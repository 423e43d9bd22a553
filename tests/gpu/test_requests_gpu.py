"""GPU tests of persistent collectives (Communicator.*_init -> hpccoll.Request) on the cuda
backend, on the GPU machine:

    mpiexec -n 2 python -m pytest --with-mpi tests/gpu/test_requests_gpu.py

Every Start reads fresh random data written into the request's bound input, and every result is
compared BITWISE with the fixed-rank-order host reference (the algorithms tested reduce in rank
order).  The tests also check which path served each Start: the prepared launch, the eager
engine, or the full call path (unaligned buffers, after the engine started or stopped)."""
from __future__ import annotations


import numpy as np
import pytest
from _gpu_checks import check_bitwise as _check
from _gpu_checks import cc  # noqa: F401 - the module's Communicator fixture
from _gpu_checks import random_data as _random
from _gpu_checks import world as _world

import hpccoll
from hpccoll import Request
from hpccoll.ops import OPS, reduce_in_rank_order

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=2)]


CASES = [("float32", "oneshot_sentinel", "SUM"), ("float32", "oneshot_ll", "MAX"),
         ("float32", "twoshot_sentinel", "SUM"), ("bfloat16", "auto", "SUM"), ("int32", "auto", "PROD"),
         ("float64", "oneshot_ll", "MIN")]


@pytest.mark.parametrize("dtype,algo,op", CASES)
def test_request_is_bitwise_with_fresh_data_every_start(cc, dtype, algo, op):
    """Counts from one element to 1 MiB + 1 (one launch and several), out of place and in place,
    five Starts each with the bound input rewritten in between (by a host copy on the stream)."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 51, CASES.index((dtype, algo, op))])
    isz = _random(rng, dtype, 1, op).itemsize
    for n in (1, 1023, 4096 + 3, 65536, (1 << 20) // isz + 1):
        for in_place in (False, True):
            x = cp.asarray(_random(rng, dtype, n, op))
            out = x if in_place else cp.empty_like(x)
            req = cc.Allreduce_init(hpccoll.IN_PLACE if in_place else x, out, op=OPS[op], algorithm=algo,
                                    deterministic=True)
            for rep in range(5):
                h = _random(rng, dtype, n, op)
                x.set(h)
                ref = reduce_in_rank_order(OPS[op], _world().allgather(h))
                req.Start()
                req.Wait()
                _check(cp.asnumpy(out), ref, f"{dtype} {algo} {op} n={n} in_place={in_place} start {rep}")
            req.Free()


def test_the_prepared_launch_serves_aligned_single_launch_calls(cc, monkeypatch):
    """An aligned call that fits one launch Starts through its prepared launch (never the
    backend's full run); an unaligned one (a slice one element in) through the backend's run,
    by the route decided at init."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 52])
    slow = []
    backend = cc.backends.main
    real = backend.run
    monkeypatch.setattr(backend, "run", lambda *a, **k: (slow.append(a[0]), real(*a, **k)))
    for offset, want_slow in ((0, 0), (1, 3)):
        base = cp.empty(4097, cp.float32)
        x, out = base[offset:offset + 4000], cp.empty(4096, cp.float32)[offset:offset + 4000]
        req = cc.Allreduce_init(x, out, algorithm="oneshot_sentinel")
        assert (req._plan is not None) == (offset == 0)
        slow.clear()
        for rep in range(3):
            h = rng.standard_normal(4000).astype(np.float32)
            x.set(h)
            req.Start()
            while not req.Test():  # polls the stream; Wait's work once it is done
                pass
            _check(cp.asnumpy(out), reduce_in_rank_order(OPS["SUM"], _world().allgather(h)),
                   f"offset {offset} start {rep}")
        assert len(slow) == want_slow, f"offset {offset}: {len(slow)} Starts took the call path"
        req.Free()


def test_requests_follow_the_eager_engine_as_it_starts_and_stops(cc):
    """A request made before the engine starts is served by the engine once it runs (and the
    engine counts its calls), and by launches again after it stops; bitwise every time."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 53])
    n = 3000
    x, out = cp.empty(n, cp.float32), cp.empty(n, cp.float32)
    req = cc.Allreduce_init(x, out)
    cp.zeros(1).sum()  # CuPy's kernels used below, loaded before the engine runs

    def run(tag, reps=4):
        for rep in range(reps):
            h = rng.standard_normal(n).astype(np.float32)
            x.set(h)
            req.Start()
            req.Wait()
            _check(cp.asnumpy(out), reduce_in_rank_order(OPS["SUM"], _world().allgather(h)), f"{tag} {rep}")

    run("launched, before the engine")
    with cc.persistent("float32"):
        eng = cc._backend.engines.engines()["float32"]
        before = eng.calls
        run("through the engine", reps=6)
        assert eng.calls - before == 6, f"the engine served {eng.calls - before} of 6 Starts"
    run("launched, after the engine")
    req.Free()


def test_requests_started_in_a_group_share_one_launch(cc, monkeypatch):
    """Requests started inside `with comm.group():` are fused like calls (one launch), bitwise."""
    import cupy as cp

    seen = []
    from hpccoll.backends.cuda import groups

    real = groups._launch
    monkeypatch.setattr(groups, "_launch", lambda b, calls, algo: (seen.append(len(calls)), real(b, calls, algo)))
    rng = np.random.default_rng([cc.rank, 54])
    counts = [5, 1024, 7, 4096]
    xs = [cp.empty(n, cp.float32) for n in counts]
    outs = [cp.empty(n, cp.float32) for n in counts]
    reqs = [cc.Allreduce_init(x, o, algorithm="oneshot_sentinel") for x, o in zip(xs, outs)]
    for rep in range(3):
        hs = [rng.standard_normal(n).astype(np.float32) for n in counts]
        for x, h in zip(xs, hs):
            x.set(h)
        with cc.group():
            Request.Startall(reqs)
        Request.Waitall(reqs)
        for k, (o, h) in enumerate(zip(outs, hs)):
            _check(cp.asnumpy(o), reduce_in_rank_order(OPS["SUM"], _world().allgather(h)), f"call {k} rep {rep}")
    assert seen == [4, 4, 4], f"group launches: {seen}"
    for r in reqs:
        r.Free()
