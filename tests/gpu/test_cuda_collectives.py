"""GPU tests of the CUDA backend (run on the GPU machine, 2 ranks and 4 ranks on 2 GPUs):

    mpiexec -n 2 python -m pytest --with-mpi tests/gpu

Fresh random data every iteration; deterministic algorithms compared BITWISE with the
fixed-order host reference, NaNs included (every NaN of a result is the canonical NaN, whatever
the payloads that went in); LL128 within fp tolerance and identical on every rank."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
from _gpu_checks import assert_bitwise as _assert_bitwise
from _gpu_checks import assert_close as _assert_close
from _gpu_checks import cc  # noqa: F401 - the module's Communicator fixture
from _gpu_checks import check_calls_follow_their_stream, check_nccl_missing_peer_times_out
from _gpu_checks import nccl_shared_gpus
from _gpu_checks import random_data as _random
from _gpu_checks import world as _world

import hpccoll
from hpccoll.ops import BFLOAT16, OPS, np_dtype, reduce_in_rank_order

# Imported at collection, before any GPU work in this process: on some GPU machines, source files
# read by a process after it had run GPU work came back with NUL bytes (_gpu_checks.py).
try:
    import torch as _torch
except Exception:  # noqa: BLE001 - no torch (or a broken one): its test skips
    _torch = None

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=2)]

FLOATS = ["float64", "float32", "float16", "bfloat16"]
INTS = ["int32", "int64"]
DTYPES = FLOATS + INTS
SIZES = [1, 7, 8, 1023, 4096, 65537, (1 << 18) + 3]
ALGOS = ["oneshot_sentinel", "oneshot_ll", "twoshot_sentinel", "twoshot_ll", "twoshot_ll128"]


def _same_on_all_ranks(arr, what):
    digest = hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()
    digests = _world().allgather(digest)
    assert len(set(digests)) == 1, f"{what}: results differ across ranks"


def _valid(algo, dtype, op):
    if "ll128" in algo:
        return dtype in FLOATS and op == "SUM"
    if "sentinel" in algo:
        return dtype in FLOATS
    return True


CASES = [(a, d, o) for a in ALGOS for d in DTYPES for o in OPS if _valid(a, d, o)]


@pytest.mark.parametrize("algo,dtype,op", CASES)
def test_allreduce(cc, algo, dtype, op):
    import cupy as cp

    rng = np.random.default_rng([cc.rank, hash((algo, dtype, op)) & 0xFFFF, 1])
    det = "ll128" not in algo
    for it, n in enumerate(SIZES):
        x = _random(rng, dtype, n, op)
        xs = _world().allgather(x)
        ref = reduce_in_rank_order(OPS[op], xs)
        dx = cp.asarray(x)
        out = cp.empty_like(dx)
        cc.Allreduce(dx, out, op=OPS[op], algorithm=algo, deterministic=det)
        cc.synchronize()
        got = cp.asnumpy(out)
        assert np.array_equal(cp.asnumpy(dx), x), "sendbuf was modified"
        what = f"{algo} {dtype} {op} n={n} rank {cc.rank}"
        if det:
            _assert_bitwise(got, ref, what)
        else:
            tol = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-2, "bfloat16": 5e-2}[dtype]
            _assert_close(got.astype(np.float64), ref.astype(np.float64),
                                       rtol=tol, atol=tol * cc.size * 4, err_msg=what)
        _same_on_all_ranks(got, what)
        # in place, odd offset (unaligned: staged) on the largest sizes
        if n > 1000:
            buf = cp.asarray(np.concatenate([x[:1], x]))[1:]
            cc.Allreduce(hpccoll.IN_PLACE, buf, op=OPS[op], algorithm=algo, deterministic=det)
            got2 = cp.asnumpy(buf)
            if det:
                _assert_bitwise(got2, ref, what + " in place unaligned")


@pytest.mark.parametrize("algo", ["oneshot_sentinel", "twoshot_sentinel"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_special_values(cc, algo, dtype):
    """Sentinel bit patterns, -0.0, NaN and +-Inf in the input never hang and reduce like the host."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 7])
    dt = np_dtype(dtype)
    n = 4099
    x = rng.standard_normal(n).astype(dt)
    width = {8: np.uint64, 4: np.uint32, 2: np.uint16}[dt.itemsize]
    sentinel = {8: 0xFFFAFFFAFFFAFFFA, 4: 0xFFFAFFFA, 2: 0xFFFA}[dt.itemsize]
    xb = x.view(width)
    xb[rng.integers(0, n, 50)] = sentinel
    x[rng.integers(0, n, 20)] = -0.0
    x[rng.integers(0, n, 20)] = np.inf
    x[rng.integers(0, n, 20)] = -np.inf
    x[rng.integers(0, n, 5)] = np.nan
    xs = _world().allgather(x)
    for op in ("SUM", "MAX", "MIN"):
        with np.errstate(invalid="ignore", over="ignore"):
            ref = reduce_in_rank_order(OPS[op], xs)
        out = cp.empty(n, dtype=dt)
        cc.Allreduce(cp.asarray(x), out, op=OPS[op], algorithm=algo, deterministic=True)
        cc.synchronize()
        _assert_bitwise(cp.asnumpy(out), ref, f"{algo} {dtype} {op} special values")
        _same_on_all_ranks(cp.asnumpy(out), f"{algo} {dtype} {op} special values")


NAN_PAYLOADS = {2: [0x7E01, 0xFE00, 0x7C01, 0xFFFA], 4: [0x7FC00001, 0xFFC00000, 0x7F800001, 0xFFFAFFFA],
                8: [0x7FF8000000000001, 0xFFF8000000000000, 0x7FF0000000000001, 0xFFFAFFFAFFFAFFFA]}
DET_FLOAT_ALGOS = ["oneshot_sentinel", "oneshot_ll", "twoshot_sentinel", "twoshot_ll"]


@pytest.mark.parametrize("algo", DET_FLOAT_ALGOS)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["SUM", "PROD", "MAX", "MIN"])
def test_nan_payloads_give_the_same_bits_on_every_rank(cc, algo, dtype, op):
    """NaNs with other payloads (quiet, signalling, negative, the sentinel pattern itself) in
    every rank's input: the result is the canonical NaN wherever any NaN met, so every rank holds
    the same bits, equal to the host's; -0 and +0 mixed in so MAX/MIN's +0 > -0 rule shows."""
    import cupy as cp

    dt = np_dtype(dtype)
    width = {8: np.uint64, 4: np.uint32, 2: np.uint16}[dt.itemsize]
    for it, n in enumerate((5, 1029, 70001)):
        rng = np.random.default_rng([cc.rank, it, hash((algo, dtype, op)) & 0xFFFF])
        x = _random(rng, dtype, n, op)
        x[rng.integers(0, n, max(1, n // 50))] = -0.0
        x[rng.integers(0, n, max(1, n // 50))] = 0.0
        hit = rng.integers(0, n, max(1, n // 40))
        x.view(width)[hit] = rng.choice(np.array(NAN_PAYLOADS[dt.itemsize], dtype=width), hit.size)
        xs = _world().allgather(x)
        ref = reduce_in_rank_order(OPS[op], xs)
        out = cp.empty(n, dtype=dt)
        cc.Allreduce(cp.asarray(x), out, op=OPS[op], algorithm=algo, deterministic=True)
        cc.synchronize()
        got = cp.asnumpy(out)
        what = f"{algo} {dtype} {op} n={n} NaN payloads"
        _assert_bitwise(got, ref, what)
        _same_on_all_ranks(got, what)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_allreduce_oneshot_packs_per_thread(cc, dtype):
    """One-shot keeps up to 4 packs per thread in registers (collectives.cu, the kept pack)
    and loops beyond that: 1-4 packs per thread on the full grid, then the 4 MiB per-launch cap
    crossed (two launches), odd counts, fresh data each time, bitwise against the host."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 13])
    dt = np_dtype(dtype)
    packs_cap = cc._backend.layout.allreduce["oneshot_sentinel"][0] // 16
    for packs in (packs_cap // 4 + 1, packs_cap // 2 - 1, 3 * packs_cap // 4 + 3, packs_cap, packs_cap + 5):
        n = packs * 16 // dt.itemsize - 1  # odd: the last pack is partial
        for op in ("SUM", "MAX"):
            x = _random(rng, dtype, n, op)
            ref = reduce_in_rank_order(OPS[op], _world().allgather(x))
            out = cp.empty(n, dtype=dt)
            cc.Allreduce(cp.asarray(x), out, op=OPS[op], algorithm="oneshot_sentinel", deterministic=True)
            cc.synchronize()
            got = cp.asnumpy(out)
            _assert_bitwise(got, ref, f"oneshot_sentinel {dtype} {op} n={n}")
            _same_on_all_ranks(got, f"oneshot_sentinel {dtype} {op} n={n}")


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "int32"])
def test_bcast_allgather_reduce_scatter(cc, dtype):
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 11])
    size = cc.size
    for n in (1, 7, 8, 1023, 4096, 65537, (1 << 17) + 5, 3 << 16):  # 3 << 16: Allgather in 2-6 chunks
        x = _random(rng, dtype, n, "SUM")
        xs = _world().allgather(x)
        for root in range(size):
            buf = cp.asarray(x)
            cc.Bcast(buf, root=root)
            _assert_bitwise(cp.asnumpy(buf), xs[root], f"Bcast {dtype} n={n} root={root}")
        out = cp.empty(n * size, dtype=x.dtype)
        cc.Allgather(cp.asarray(x), out)
        _assert_bitwise(cp.asnumpy(out), np.concatenate(xs), f"Allgather {dtype} n={n}")
        inplace = cp.zeros(n * size, dtype=x.dtype)
        inplace[cc.rank * n:(cc.rank + 1) * n] = cp.asarray(x)
        cc.Allgather(hpccoll.IN_PLACE, inplace)
        _assert_bitwise(cp.asnumpy(inplace), np.concatenate(xs), f"Allgather in place {dtype} n={n}")
        big = _random(rng, dtype, n * size, "SUM")
        bigs = _world().allgather(big)
        ref = reduce_in_rank_order(OPS["SUM"], bigs)[cc.rank * n:(cc.rank + 1) * n]
        rs = cp.empty(n, dtype=x.dtype)
        cc.Reduce_scatter_block(cp.asarray(big), rs, deterministic=True)
        _assert_bitwise(cp.asnumpy(rs), ref, f"Reduce_scatter_block {dtype} n={n}")
    cc.Barrier()


def test_blockwise_collectives_with_buffers_aligned_on_some_ranks_only(cc):
    """Allgather, Alltoall and Reduce_scatter_block where odd ranks' buffers are 4 bytes off
    16-byte alignment and even ranks' aligned: every rank runs the launches its peers run (the
    direct launch on aligned copies; before, an unaligned rank took the staged path, chunk by
    chunk, against its peers' one launch).  Blocks of whole packs, one chunk and several
    (1 << 17 floats: 512 KiB), and not whole packs; exact bits against the host reference."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 29])
    size, rank, off = cc.size, cc.rank, cc.rank % 2

    def unaligned(a):  # a device copy of `a`, 4 bytes off alignment on odd ranks
        d = cp.zeros(a.size + off, a.dtype)[off:]
        d[...] = cp.asarray(a)
        return d

    for n in (8, 1000, 1 << 17, 7):
        x = rng.standard_normal(n).astype(np.float32)
        xs = _world().allgather(x)
        out = unaligned(np.zeros(n * size, np.float32))
        cc.Allgather(unaligned(x), out)
        _assert_bitwise(cp.asnumpy(out), np.concatenate(xs), f"Allgather n={n} offset {off}")
        y = rng.standard_normal(n * size).astype(np.float32)
        ys = _world().allgather(y)
        out = unaligned(np.zeros(n * size, np.float32))
        cc.Alltoall(unaligned(y), out)
        want = np.concatenate([ys[src][rank * n:(rank + 1) * n] for src in range(size)])
        _assert_bitwise(cp.asnumpy(out), want, f"Alltoall n={n} offset {off}")
        rs = unaligned(np.zeros(n, np.float32))
        cc.Reduce_scatter_block(unaligned(y), rs, deterministic=True)
        ref = reduce_in_rank_order(OPS["SUM"], ys)[rank * n:(rank + 1) * n]
        _assert_bitwise(cp.asnumpy(rs), ref, f"Reduce_scatter_block n={n} offset {off}")
        inplace = unaligned(y)  # the result is its first n elements
        cc.Reduce_scatter_block(hpccoll.IN_PLACE, inplace, deterministic=True)
        _assert_bitwise(cp.asnumpy(inplace[:n]), ref, f"Reduce_scatter_block in place n={n} offset {off}")
    cc.Barrier()


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int64"])
def test_alltoall_and_alltoallv(cc, dtype):
    """Alltoall on the device kernel (block j to rank j, exact bits; padded and staged where a
    block is not whole 16-byte packs), in place too, and Alltoallv (through host staging on the
    cuda backend), against the exchange computed from every rank's data."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 23])
    size, rank = cc.size, cc.rank
    for n in (1, 7, 8, 1023, 4096, 65537, (1 << 17) + 5):  # per block; (1 << 17) + 5: several chunks
        x = _random(rng, dtype, n * size, "SUM")
        xs = _world().allgather(x)
        want = np.concatenate([xs[src][rank * n:(rank + 1) * n] for src in range(size)])
        out = cp.empty(n * size, dtype=x.dtype)
        cc.Alltoall(cp.asarray(x), out)
        _assert_bitwise(cp.asnumpy(out), want, f"Alltoall {dtype} n={n}")
        buf = cp.asarray(x)
        cc.Alltoall(hpccoll.IN_PLACE, buf)
        _assert_bitwise(cp.asnumpy(buf), want, f"Alltoall in place {dtype} n={n}")
    counts = [[(3 * i + 5 * j + 1) % 7 * 101 for j in range(size)] for i in range(size)]  # rank i -> j
    scounts = counts[rank]
    rcounts = [counts[i][rank] for i in range(size)]
    x = _random(rng, dtype, sum(scounts), "SUM")
    xs = _world().allgather(x)
    want = []
    for i in range(size):
        off = sum(counts[i][:rank])
        want.append(xs[i][off:off + counts[i][rank]])
    out = cp.zeros(sum(rcounts), dtype=x.dtype)
    cc.Alltoallv((cp.asarray(x), scounts), (out, rcounts))
    _assert_bitwise(cp.asnumpy(out), np.concatenate(want), f"Alltoallv {dtype}")
    cc.Barrier()


def test_64MiB(cc):
    import cupy as cp

    n = 16 * 1024 * 1024
    for algo in ("oneshot_sentinel", "twoshot_sentinel", "twoshot_ll128"):
        x = cp.random.default_rng(cc.rank + 100).standard_normal(n, dtype=cp.float32)
        xs = [cp.asnumpy(x)]
        xs = _world().allgather(xs[0])
        ref = reduce_in_rank_order(OPS["SUM"], xs)
        out = cp.empty_like(x)
        cc.Allreduce(x, out, algorithm=algo, deterministic=algo != "twoshot_ll128")
        got = cp.asnumpy(out)
        if algo == "twoshot_ll128":
            _assert_close(got, ref, rtol=1e-5, atol=1e-5)
        else:
            _assert_bitwise(got, ref, f"{algo} 64 MiB")


def _data(cp, i: int, r: int, n: int):
    """Input of rank r at iteration i: different for every (i, r), cheap to regenerate on any
    rank (one elementwise kernel; a CuPy Generator per iteration costs milliseconds)."""
    phase = (i * 0.7071 + r * 1.3719) % 6.283
    # Python-float scalars keep float32 and stay on CuPy's plain ufunc path (a NumPy scalar
    # operand goes through __array_ufunc__, which imports cupyx and SciPy)
    return cp.sin(cp.arange(n, dtype=cp.float32) * (0.731 + 0.001 * r) + phase)


def _fold(vals):
    """Rank-order sum, float32 at every step (the deterministic kernels' expression tree)."""
    acc = vals[0]
    for v in vals[1:]:
        acc = acc + v
    return acc


def _expected_sum(cp, i: int, nranks: int, n: int):
    """Every rank's input regenerated, summed in rank order on the GPU (float32 each step)."""
    return _fold([_data(cp, i, r, n) for r in range(nranks)])


def test_back_to_back_varying_sizes(cc):
    """100,000 back-to-back calls, sizes cycling, fresh data, every result checked on the GPU."""
    import cupy as cp

    sizes = [1, 7, 1023, 4096, 65537, 333, 8, 20000]
    mism = cp.zeros(1, dtype=cp.int64)
    calls = 100_000
    outs = {}
    for i in range(calls):
        n = sizes[i % len(sizes)]
        if i % 50 == 0 or n not in outs:  # fresh data for every size at least every 50 calls
            outs[n] = (_data(cp, i, cc.rank, n), _expected_sum(cp, i, cc.size, n), cp.empty(n, cp.float32))
        x, ref, out = outs[n]
        cc.Allreduce(x, out, deterministic=True)
        if i % 10_000 == 0 and cc.rank == 0:
            print(f"back-to-back: call {i}", flush=True)
        if i % 7 == 0:
            mism += (out.view(cp.uint32) != ref.view(cp.uint32)).sum()
    cc.synchronize()
    assert int(mism.get()[0]) == 0


@pytest.mark.parametrize("algo", ALGOS)
def test_in_kernel_loops(cc, algo):
    """The benchmark's in-kernel mode: `iters` collectives in one launch (the loop module).  One-
    shot LL sends collective i+1 as soon as collective i's pack has arrived (collectives.cu,
    allreduceOneShotKept).  Odd loop lengths (the parity ends flipped), odd sizes from one pack
    to several per thread, fresh data every time, bitwise against the host; a plain call after
    each loop checks that the epochs went on consistently."""
    import cupy as cp

    from hpccoll._validate import prepare

    rng = np.random.default_rng([cc.rank, 17, ALGOS.index(algo)])
    det = "ll128" not in algo
    dev = cc._backend
    s = cp.cuda.Stream(non_blocking=True)
    for iters in (2, 7, 100):
        for n in (1, 7, 1023, 4099, 65537, 300001):
            x = _random(rng, "float32", n, "SUM")
            ref = reduce_in_rank_order(OPS["SUM"], _world().allgather(x))
            with s:  # (on s: the default stream's copy and fill would race with the launch on s)
                dx, out = cp.asarray(x), cp.zeros(n, cp.float32)
            call = prepare("Allreduce", cc.size, dx, out, op=hpccoll.SUM)
            dev.run(call, dev.route(call, algo, det), s, iters=iters)
            cc.synchronize(s)
            what = f"{algo} iters={iters} n={n} rank {cc.rank}"
            got = cp.asnumpy(out)
            if det:
                _assert_bitwise(got, ref, what)
            else:
                _assert_close(got, ref, rtol=1e-5, atol=1e-5 * cc.size * 4, err_msg=what)
            _same_on_all_ranks(got, what)
            y = _random(rng, "float32", n, "SUM")
            out2 = cp.empty(n, cp.float32)
            cc.Allreduce(cp.asarray(y), out2, algorithm=algo, deterministic=det)
            cc.synchronize()
            ref2 = reduce_in_rank_order(OPS["SUM"], _world().allgather(y))
            if det:
                _assert_bitwise(cp.asnumpy(out2), ref2, what + ", the call after it")


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_bcast_many_chunks(cc, dtype):
    """A Bcast of several of its 2 MiB chunks (one launch walks them, an arrival round trip
    each) from every root, bit for bit: what the eigensolver's stedc sends (128 MiB at n = 8192)."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 12])
    n = (5 << 20) // np.dtype(dtype).itemsize * 2 + 3  # 10 MiB + 3 elements: 6 chunks, the last partial
    x = _random(rng, dtype, n, "SUM")
    xs = _world().allgather(x)
    for root in range(cc.size):
        buf = cp.asarray(x)
        cc.Bcast(buf, root=root)
        _assert_bitwise(cp.asnumpy(buf), xs[root], f"Bcast {dtype} n={n} root={root}")


def test_bcast_between_allreduces_rotating_roots(cc):
    """Allreduce, Bcast (root rotating), Allreduce, ... with a skewed rank: the sequence of the
    eigensolver's column step, which hung at 4 ranks on 2 GPUs (a Bcast receiver could overwrite
    the slot of a peer still reading the Allreduce before; collectives.cu bcastLL).  Every
    result is checked on the GPU: the sums bitwise, the broadcast values exactly."""
    import time

    import cupy as cp

    n, nb, calls = 1027, 131, 20_000
    rng = np.random.default_rng([cc.rank, 17])
    bad = cp.zeros(3, dtype=cp.int64)
    out = cp.empty(n, dtype=cp.float32)
    bb = cp.empty(nb, dtype=cp.float32)
    for i in range(calls):
        if i % 101 == 0:  # fresh data
            x = _data(cp, i, cc.rank, n)
            ref = _expected_sum(cp, i, cc.size, n)
            ref2 = ref  # the second Allreduce sums `size` equal copies of ref, in rank order
            for _ in range(cc.size - 1):
                ref2 = ref2 + ref
        if rng.random() < 0.02:  # this rank falls behind for a moment
            time.sleep(rng.random() * 2e-4)
        cc.Allreduce(x, out, deterministic=True)
        bad[0] += (out.view(cp.uint32) != ref.view(cp.uint32)).sum()
        root = i % cc.size
        bb.fill(float(i % 4096 + root) if cc.rank == root else -1.0)
        cc.Bcast(bb, root=root)
        bad[1] += (bb != float(i % 4096 + root)).sum()
        cc.Allreduce(hpccoll.IN_PLACE, out, deterministic=True)  # in place: the sum of every rank's equal sums
        bad[2] += (out.view(cp.uint32) != ref2.view(cp.uint32)).sum()
    cc.synchronize()
    got = bad.get()
    assert got.tolist() == [0, 0, 0], f"wrong elements (Allreduce, Bcast, second Allreduce): {got.tolist()}"


def test_graph_replay(cc):
    """A captured Allreduce replayed 10,000 times with fresh data in each replay."""
    import cupy as cp

    n = 4099
    for algo in ("oneshot_sentinel", "twoshot_sentinel", "oneshot_ll"):
        stream = cp.cuda.Stream(non_blocking=True)
        x = cp.empty(n, dtype=cp.float32)
        out = cp.empty_like(x)
        with stream:
            cc.Allreduce(x, out, algorithm=algo, deterministic=True, stream=stream)  # warm (compile, launcher)
            stream.synchronize()
            stream.begin_capture()
            cc.Allreduce(x, out, algorithm=algo, deterministic=True, stream=stream)
            graph = stream.end_capture()
        bad = cp.zeros(1, dtype=cp.int64)
        with stream:
            for i in range(10_000):
                x[...] = _data(cp, i, cc.rank, n)
                graph.launch(stream)
                ref = _expected_sum(cp, i, cc.size, n)
                bad += (out.view(cp.uint32) != ref.view(cp.uint32)).sum()
        stream.synchronize()
        cc.synchronize()
        assert int(bad.get()[0]) == 0, f"{algo}: graph replays gave wrong results"


def test_graph_of_dependent_collectives(cc):
    """A captured graph of collectives that feed each other (in place, or one's output the next
    one's input), with a user kernel among them and grids of 1 to 33 blocks, replayed 300 times
    with fresh data, every output checked bitwise."""
    import cupy as cp

    n, m, k, size, rank = 65537, 4096, 7, cc.size, cc.rank
    s = cp.cuda.Stream(non_blocking=True)
    x, xb = cp.empty(n, cp.float32), cp.empty(n, cp.float32)
    y, z = cp.empty(n, cp.float32), cp.empty(n, cp.float32)
    g, g2 = cp.empty(size * m, cp.float32), cp.empty(size * m, cp.float32)
    o7 = cp.empty(k, cp.float32)
    det = {"deterministic": True, "stream": s}

    def ops():
        cc.Allreduce(x, y, algorithm="oneshot_sentinel", **det)    # after the host's fill
        cc.Allreduce(hpccoll.IN_PLACE, y, algorithm="twoshot_sentinel", **det)    # in place: reads its predecessor's output
        cc.Allgather(x[:m], g, stream=s)
        cc.Allreduce(g, g2, algorithm="oneshot_ll", **det)          # reads the Allgather's output
        with s:
            cp.multiply(y, float(rank + 1), out=z)                  # a user kernel
        cc.Allreduce(hpccoll.IN_PLACE, z, algorithm="oneshot_sentinel", **det)
        cc.Bcast(xb, root=size - 1, stream=s)
        cc.Allreduce(xb[:k], o7, algorithm="oneshot_sentinel", **det)  # one block, reads the Bcast's
        cc.Allreduce(hpccoll.IN_PLACE, g2, algorithm="twoshot_ll", **det)        # in place

    with s:
        x[...] = _data(cp, 0, rank, n)
        xb[...] = _data(cp, 1, rank, n)
    ops()  # warm: compiles, launchers
    s.synchronize()
    s.begin_capture()
    ops()
    graph = s.end_capture()
    bad = cp.zeros(6, dtype=cp.int64)
    bits = lambda a: a.view(cp.uint32)  # noqa: E731
    for i in range(300):
        with s:
            xs = [_data(cp, 2 * i, r, n) for r in range(size)]
            xbs = [_data(cp, 2 * i + 1, r, n) for r in range(size)]
            x[...] = xs[rank]
            xb[...] = xbs[rank]
            graph.launch(s)
            y1 = _fold(xs)
            y2 = _fold([y1] * size)
            gg = cp.concatenate([v[:m] for v in xs])
            g1 = _fold([gg] * size)
            g3 = _fold([g1] * size)
            zz = _fold([y2 * float(r + 1) for r in range(size)])
            b7 = _fold([xbs[size - 1][:k]] * size)
            bad[0] += (bits(y) != bits(y2)).sum()
            bad[1] += (bits(g) != bits(gg)).sum()
            bad[2] += (bits(g2) != bits(g3)).sum()
            bad[3] += (bits(z) != bits(zz)).sum()
            bad[4] += (bits(xb) != bits(xbs[size - 1])).sum()
            bad[5] += (bits(o7) != bits(b7)).sum()
    s.synchronize()
    cc.synchronize()
    got = bad.get().tolist()
    assert got == [0] * 6, f"wrong elements (y, g, g2, z, xb, o7) over 300 replays: {got}"


def test_rank_that_never_joins_times_out():
    import cupy as cp

    c = hpccoll.Communicator(backend="cuda", timeout=2.0)
    try:
        x = cp.ones(1000, dtype=cp.float32)
        if c.rank == 0:
            out = cp.empty_like(x)
            c.Allreduce(x, out)
            with pytest.raises(hpccoll.CollectiveTimeout) as info:
                c.synchronize()
            assert info.value.peer is not None and info.value.peer != 0
            assert "Allreduce" in str(info.value)
            with pytest.raises(hpccoll.CollectiveTimeout):  # the communicator stays broken
                c.Allreduce(x, out)
    finally:
        c.Free()


def test_free_after_a_timeout_waits_for_peers_at_most_the_timeout():
    """Rank 0's Allreduce in a `with` block times out (the others never call it): the block
    raises CollectiveTimeout after about two timeouts (the poll's, then Free's bounded wait),
    rather than waiting in Free for peers that may never come; rank 0 leaves its workspace and
    MPI communicator to the end of the process.  The others, arriving much later, pass their
    Free (rank 0's barrier stays posted) and release theirs."""
    import time

    import cupy as cp

    timeout = 2.0
    c = hpccoll.Communicator(backend="cuda", timeout=timeout)  # (returns on every rank together)
    x = cp.ones(1000, dtype=cp.float32)
    if c.rank == 0:
        t0 = time.perf_counter()
        with pytest.raises(hpccoll.CollectiveTimeout, match="Allreduce"):
            with c:
                c.Allreduce(x, cp.empty_like(x))
                c.synchronize()
        elapsed = time.perf_counter() - t0
        assert 2 * timeout - 0.5 <= elapsed < 2 * timeout + 4, elapsed
        assert c._backend.abandoned
    else:
        time.sleep(4 * timeout + 4)  # well past rank 0's bounded Free
        c.Free()
        assert not c._backend.abandoned
    _world().Barrier()


def test_bad_inputs_on_device(cc):
    import cupy as cp

    x = cp.ones(10, dtype=cp.int32)
    with pytest.raises(ValueError, match="oneshot_sentinel needs a floating-point dtype"):
        cc.Allreduce(x, cp.empty_like(x), algorithm="oneshot_sentinel")
    y = cp.ones(10, dtype=cp.float32)
    with pytest.raises(ValueError, match="SUM only"):
        cc.Allreduce(y, cp.empty_like(y), op=hpccoll.MAX, algorithm="twoshot_ll128")
    with pytest.raises(ValueError, match="not deterministic"):
        cc.Allreduce(y, cp.empty_like(y), algorithm="twoshot_ll128", deterministic=True)
    with pytest.raises(ValueError, match="unknown"):
        cc.Allreduce(y, cp.empty_like(y), algorithm="ring")
    # a strided input is copied by the caller; a strided output cannot be (the copy would get the results)
    z = cp.ones((10, 2), dtype=cp.float32)
    with pytest.raises(ValueError, match=r"Allreduce: sendbuf is not contiguous: pass cupy\.ascontiguousarray\(sendbuf\)"):
        cc.Allreduce(z[:, 0], cp.empty_like(y))
    with pytest.raises(ValueError, match="Allreduce: recvbuf is not contiguous: pass a contiguous array as recvbuf "
                                         r"\(the call writes recvbuf"):
        cc.Allreduce(y, z[:, 0])
    with pytest.raises(ValueError, match="Bcast: buf is not contiguous: pass a contiguous array as buf"):
        cc.Bcast(z[::2], root=0)


def test_repeat_calls_follow_every_change(cc):
    """The eager fast path (a repeat with the same arrays skips validation) must notice every
    change: op, algorithm, policy, in place, a new array (even at a recycled address), fresh
    contents. Each result is compared bitwise with the fixed-order reference."""
    import cupy as cp

    rng = np.random.default_rng([cc.rank, 77])
    n = 3001
    x = cp.empty(n, dtype=cp.float32)
    out = cp.empty_like(x)
    steps = [("SUM", "auto", True), ("SUM", "auto", True), ("MAX", "auto", True), ("MAX", "auto", True),
             ("SUM", "oneshot_ll", True), ("SUM", "twoshot_sentinel", True), ("SUM", "twoshot_sentinel", True),
             ("MIN", "oneshot_sentinel", True), ("SUM", "auto", False)]
    for i in range(40):
        op, algo, det = steps[i % len(steps)]
        if i % 13 == 12:  # drop the arrays; the pool may hand back the same addresses
            del x, out
            x = cp.empty(n, dtype=cp.float32)
            out = cp.empty_like(x)
        h = rng.standard_normal(n).astype(np.float32)
        ref = reduce_in_rank_order(OPS[op], _world().allgather(h))
        x.set(h)
        if i % 5 == 4:  # in place
            out.set(h)
            cc.Allreduce(hpccoll.IN_PLACE, out, op=OPS[op], algorithm=algo, deterministic=det)
        else:
            cc.Allreduce(x, out, op=OPS[op], algorithm=algo, deterministic=det)
        got = cp.asnumpy(out)
        what = f"repeat {i}: {op} {algo} det={det}"
        if det or op != "SUM":
            _assert_bitwise(got, ref, what)
        else:
            _assert_close(got, ref, rtol=1e-5, atol=1e-5 * cc.size, err_msg=what)
        _same_on_all_ranks(got, what)
    # same buffers, a different dtype view, then a different size: full validation again
    xb = x.view(cp.int32)
    ob = out.view(cp.int32)
    hi = rng.integers(-1000, 1000, n).astype(np.int32)
    xb.set(hi)
    cc.Allreduce(xb, ob, deterministic=True)
    _assert_bitwise(cp.asnumpy(ob), reduce_in_rank_order(OPS["SUM"], _world().allgather(hi)), "int32 view")
    h = rng.standard_normal(17).astype(np.float32)
    cc.Allreduce(cp.asarray(h), out[:17], deterministic=True)
    _assert_bitwise(cp.asnumpy(out[:17]), reduce_in_rank_order(OPS["SUM"], _world().allgather(h)), "slice")


class _CudaArrayInterfaceOnly:
    """A foreign device array: exposes __cuda_array_interface__ and nothing else."""

    def __init__(self, arr):
        self._arr = arr
        self.__cuda_array_interface__ = arr.__cuda_array_interface__


def test_torch_dlpack_and_cuda_array_interface_inputs(cc):
    """torch tensors (DLPack), torch streams, and a bare __cuda_array_interface__ object."""
    import cupy as cp

    if _torch is None:
        pytest.skip("torch is not importable")
    torch = _torch
    dev = torch.device("cuda", cc.device)
    rng = np.random.default_rng([cc.rank, 78])
    for dtype, tdt in (("float32", torch.float32), ("float64", torch.float64), ("bfloat16", torch.bfloat16),
                       ("int64", torch.int64)):
        for n in (1, 1023, 65537):
            h = _random(rng, dtype, n, "SUM")
            ref = reduce_in_rank_order(OPS["SUM"], _world().allgather(h))
            if dtype == "bfloat16":
                t = torch.from_numpy(h.view(np.uint16).astype(np.int32)).to(torch.int32)
                t = (t << 16).view(torch.float32).to(torch.bfloat16).to(dev)  # exact: bf16 = high half
            else:
                t = torch.from_numpy(h).to(dev)
            o = torch.empty_like(t)
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                cc.Allreduce(t, o, deterministic=True, stream=side)
            side.synchronize()
            cc.synchronize(side)
            if dtype == "bfloat16":
                got = (o.view(torch.int16).to(torch.int32).cpu().numpy() & 0xFFFF).astype(np.uint16).view(BFLOAT16)
            else:
                got = o.cpu().numpy()
            _assert_bitwise(got, ref, f"torch {dtype} n={n}")
            # the same data through an object with only __cuda_array_interface__ (not bf16:
            # the interface has no bfloat16 typestr)
            if dtype != "bfloat16":
                xi = _CudaArrayInterfaceOnly(cp.asarray(h))
                oi = cp.empty(n, dtype=h.dtype)
                cc.Allreduce(xi, _CudaArrayInterfaceOnly(oi), deterministic=True)
                cc.synchronize()
                _assert_bitwise(cp.asnumpy(oi), ref, f"__cuda_array_interface__ {dtype} n={n}")
    # a tensor on the wrong device is refused with the fix named
    if torch.cuda.device_count() > 1:
        other = (cc.device + 1) % torch.cuda.device_count()
        bad = torch.ones(8, device=torch.device("cuda", other))
        with pytest.raises(ValueError, match="GPU"):
            cc.Allreduce(bad, torch.empty_like(bad))


def _nccl_fallback_table(tmp_path_factory, monkeypatch) -> None:
    """Skip unless the opt-in NCCL fallback can run; else HPCCOLL_TUNING names a table (written by
    rank 0, the same for all) whose non-deterministic Allreduce above 64 KiB goes to NCCL."""
    import json

    import cupy as cp

    from hpccoll.backends.nccl import nccl_unavailable_reason

    if nccl_unavailable_reason():
        pytest.skip(nccl_unavailable_reason())
    if os.environ.get("HPCCOLL_NCCL_FALLBACK") != "1":
        pytest.skip("the NCCL fallback is opt-in (HPCCOLL_NCCL_FALLBACK=1)")
    world = _world()
    path = world.bcast(str(tmp_path_factory.mktemp("tune") / "tuning.json") if world.rank == 0 else None)
    if world.rank == 0:
        rows = [[65536, "oneshot_sentinel"], [None, "nccl"]]
        name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)  # load_table matches it
        table = {"gpu": name, "allreduce": {str(world.size): rows},
                 "allreduce_deterministic": {str(world.size): [[None, "twoshot_sentinel"]]}}
        with open(path, "w") as fh:
            json.dump(table, fh)
    world.Barrier()
    monkeypatch.setenv("HPCCOLL_TUNING", path)


def test_auto_hands_large_allreduce_to_nccl_where_the_table_says(tmp_path_factory, monkeypatch):
    """A tuning table with an "nccl" row: the communicator opens NCCL at construction, `auto`
    runs the non-deterministic Allreduce above the threshold through it (eager and inside a
    captured graph), and keeps hpccoll's kernels below it and for deterministic calls."""
    import cupy as cp

    _nccl_fallback_table(tmp_path_factory, monkeypatch)
    world = _world()
    c = hpccoll.Communicator(backend="cuda", deterministic=False)
    try:
        dev = c._backend
        if nccl_shared_gpus(c):  # NCCL: one rank per GPU (as NCCL tells GPUs apart)
            assert dev._nccl is None  # the previous row's kernel serves NCCL's sizes
            assert dev.resolve("Allreduce", "float32", "SUM", 1 << 20, False, "auto") == "oneshot_sentinel"
            return
        assert dev._nccl is not None, "the table prefers NCCL: it must be open"
        assert dev.resolve("Allreduce", "float32", "SUM", 1 << 20, False, "auto") == "nccl"
        assert dev.resolve("Allreduce", "float32", "SUM", 1 << 12, False, "auto") == "oneshot_sentinel"
        assert dev.resolve("Allreduce", "float32", "SUM", 1 << 20, True, "auto") == "twoshot_sentinel"
        rng = np.random.default_rng([world.rank, 17])
        for n in (1 << 18, (1 << 18) + 5):
            h = rng.standard_normal(n).astype(np.float32)
            ref = reduce_in_rank_order(OPS["SUM"], world.allgather(h))
            x, y = cp.asarray(h), cp.empty(n, cp.float32)
            c.Allreduce(x, y)
            c.synchronize()
            np.testing.assert_allclose(y.get(), ref, rtol=1e-5, atol=1e-5)
            s = cp.cuda.Stream(non_blocking=True)
            with s:
                s.begin_capture()
                c.Allreduce(x, y, stream=s)
                g = s.end_capture()
            with s:  # (the fill on s: on the default stream it could land after the replay)
                y.fill(0)
            g.launch(stream=s)
            s.synchronize()
            np.testing.assert_allclose(y.get(), ref, rtol=1e-5, atol=1e-5)
    finally:
        c.Free()


def test_the_nccl_fallback_times_out_on_a_missing_peer(tmp_path_factory, monkeypatch):
    """The NCCL fallback's Allreduce that no peer joins: NCCL's watchdog aborts it after the
    timeout and the communicator's synchronize raises CollectiveTimeout (the result is not
    silently what the aborted kernel left); every later call raises it again."""
    _nccl_fallback_table(tmp_path_factory, monkeypatch)
    c = hpccoll.Communicator(backend="cuda", deterministic=False, timeout=2.0)
    try:
        if c._backend._nccl is None:
            pytest.skip("NCCL refuses these ranks (ranks sharing a GPU: HPCCOLL_TEST_NCCL_LOOPBACK=1 runs it)")
        check_nccl_missing_peer_times_out(c, 1 << 18, waiting=c.rank == 0)  # (1 MiB: NCCL's size)
    finally:
        c.Free()


def test_a_device_default_algorithm_leaves_host_calls_to_the_host_backend():
    """A communicator opened with a device algorithm as its default still takes numpy buffers
    (they run on the host backend, 'auto' there); a device algorithm passed to such a call
    explicitly is refused, naming the call."""
    c = hpccoll.Communicator(backend="cuda", algorithm="oneshot_sentinel", deterministic=True)
    try:
        rng = np.random.default_rng([c.rank, 61])
        x = rng.standard_normal(37)
        y = np.empty_like(x)
        for _ in range(3):  # the repeat takes the fast path: still the host backend
            c.Allreduce(x, y)
            _assert_bitwise(y, reduce_in_rank_order(OPS["SUM"], _world().allgather(x)), "host buffers")
        with pytest.raises(ValueError, match="Allreduce: algorithm='oneshot_ll' runs device buffers"):
            c.Allreduce(x, y, algorithm="oneshot_ll")
        req = c.Allreduce_init(x, y)
        req.Start()
        req.Wait()
        req.Free()
    finally:
        c.Free()


def test_prepare_loads_the_modules_before_the_first_collective(cc):
    """prepare() compiles (or loads) the dtype's modules, launched and (with the fuser) captured,
    so that the first collective of that dtype loads nothing; its results are unchanged."""
    import cupy as cp
    from hpccoll.backends.cuda import kernels

    backend = cc._backend
    cc.prepare(("int64",))
    want = {(backend.kernels.device_id, "collectives.cu", "int64", backend.kernels.defines)}
    if backend.fuser is not None:
        want.add((backend.kernels.device_id, "collectives.cu", "int64", backend.kernels.defines + (kernels.LOOP_FENCE,)))
    assert want <= set(kernels._MODULES)
    before = dict(kernels._MODULES)
    x = cp.random.randint(-1000, 1000, size=1001).astype(cp.int64) + cc.rank
    out = cp.empty_like(x)
    cc.Allreduce(x, out)
    every = cp.empty((cc.size, x.size), dtype=x.dtype)
    cc.Allgather(x, every)
    assert cp.array_equal(out, every.sum(axis=0))
    assert set(kernels._MODULES) == set(before)


def test_prepare_refuses_to_load_while_an_engine_runs(cc, monkeypatch):
    """Loading a module may synchronize the context, which waits for a running eager engine:
    prepare() of a dtype not yet loaded raises instead (naming the fix); of loaded ones it is a
    no-op and allowed."""
    backend = cc._backend
    cc.prepare(("float32",))
    with cc.persistent("float32"):
        cc.prepare(("float32",))  # loaded already: nothing to load
        monkeypatch.setattr(backend.kernels, "loaded", lambda dtype, loop=False: False)
        with pytest.raises(hpccoll.HpccollError, match="eager engine runs: call prepare before start_persistent"):
            cc.prepare(("float64",))


def test_calls_on_a_stream_follow_its_earlier_work(cc):
    """Each collective on a non-blocking stream, its input written there after a long kernel:
    the call and its staging copies (unaligned, in place) wait for it (_gpu_checks)."""
    check_calls_follow_their_stream(cc, 91)


def test_lowercase_allreduce_result_is_made_for_the_calls_stream(cc):
    """allreduce(x, stream=s) returns a result that s may write at once.  An array freed on the
    default stream while a kernel queued there (behind a spin) still reads it: its memory must
    not become the result (from the default stream's pool, it did, and s wrote it before that
    kernel read it).  CuPy and torch inputs; results bitwise, of x's kind, shape and device."""
    import cupy as cp
    from _gpu_checks import spin_on

    w = _world()
    rank, size = w.Get_rank(), w.Get_size()
    rng = np.random.default_rng([rank, 93])
    s = cp.cuda.Stream(non_blocking=True)
    null = cp.cuda.Stream.null
    n = (1 << 16) + 8
    kinds = ["cupy"] + (["torch"] if _torch is not None else [])
    for it in range(3):
        for kind in kinds:
            h = rng.standard_normal((n // 8, 8)).astype(np.float32)
            ref = reduce_in_rank_order(OPS["SUM"], w.allgather(h))
            with s:
                x = cp.asarray(h)
            s.synchronize()
            if kind == "torch":
                x = _torch.from_dlpack(x)
            with null:
                old = cp.full(n, 7.0, np.float32)  # the result's size: the pool would hand it over
                seen = cp.empty(n, np.float32)
                null.synchronize()
                spin_on(null)
                cp.multiply(old, 1, out=seen)  # reads `old` after the spin
                del old
                y = cc.allreduce(x, stream=s, deterministic=True)
            s.synchronize()
            null.synchronize()
            what = f"{kind} allreduce, iteration {it}, rank {rank}"
            assert int((seen != 7).sum()) == 0, f"{what}: the result was written over memory a queued kernel still read"
            if kind == "torch":
                assert isinstance(y, _torch.Tensor) and y.device == x.device, f"{what}: {type(y)} on {getattr(y, 'device', '?')}"
                y = cp.from_dlpack(y)
            else:
                assert isinstance(y, cp.ndarray) and y.device.id == cc.device, what
            assert y.shape == h.shape and y.dtype == h.dtype, what
            _assert_bitwise(cp.asnumpy(y), np.asarray(ref, np.float32), what)
        # on the current stream (stream=None), an F-ordered input: its order kept
        h = np.asfortranarray(rng.standard_normal((9, 7)).astype(np.float32))
        ref = reduce_in_rank_order(OPS["SUM"], w.allgather(h))
        x = cp.asfortranarray(cp.asarray(h))
        for kind in kinds:
            xk = _torch.from_dlpack(x) if kind == "torch" else x
            y = cc.allreduce(xk, deterministic=True)
            cc.synchronize()
            y = cp.from_dlpack(y) if kind == "torch" else y
            what = f"{kind} allreduce on the current stream, F order, iteration {it}, rank {rank}"
            assert y.shape == h.shape and y.flags.f_contiguous, what
            _assert_bitwise(cp.asnumpy(y), np.asarray(ref, np.float32), what)
