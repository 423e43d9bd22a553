"""Helpers shared by the GPU test files (pytest puts this folder on sys.path).

Importing this module (every GPU test file does, at collection) also imports, before any GPU
work, the modules that the tests or CuPy import lazily later: on some GPU machines a process
that had done GPU work read source files back with NUL bytes; modules imported before the first
GPU call were never hit."""
import contextlib

import numpy as np
import pytest

for _name in ("numpy.testing", "scipy.sparse", "scipy.linalg", "cupyx", "cupyx.scipy.linalg",
              "cupyx.scipy.sparse", "torch"):
    with contextlib.suppress(Exception):  # absent modules: the tests that need them skip
        __import__(_name)


def assert_close(got, ref, rtol, atol, err_msg=""):
    """np.testing.assert_allclose without numpy.testing (whose import failed on a GPU machine)."""
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    ok = np.isclose(got, ref, rtol=rtol, atol=atol, equal_nan=True)
    if not ok.all():
        bad = np.flatnonzero(~ok)
        raise AssertionError(f"{err_msg}: {bad.size} of {ok.size} elements differ beyond rtol={rtol}, "
                             f"atol={atol}; first {bad[:5]}: got {got.ravel()[bad[:5]]}, want {ref.ravel()[bad[:5]]}")


def random_data(rng, dtype: str, n: int, op: str):
    """Fresh data; PROD gets values near 1 (and small ints) so products stay finite."""
    from hpccoll.ops import np_dtype

    if dtype.startswith("int"):
        hi = 3 if op == "PROD" else 1 << 20
        return rng.integers(-hi, hi, n).astype(dtype)
    x = rng.standard_normal(n)
    if op == "PROD":
        x = 1.0 + 0.01 * x
    return x.astype(np_dtype(dtype))


def bits(a):
    """The raw bits of an array, as unsigned integers of its element width."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_bitwise(got, ref, what):
    """Every bit, NaNs included (the host reference's NaNs are canonical, as the kernels' are)."""
    bad = np.flatnonzero(bits(got) != bits(ref))
    assert bad.size == 0, (f"{what}: {bad.size} elements differ (first {bad[:5]}: got bits "
                           f"{[hex(v) for v in bits(got)[bad[:3]]]}, want {[hex(v) for v in bits(ref)[bad[:3]]]})")


def reduce_by_nodes(op, xs, rank_of):
    """The hierarchical backend's order: each node's ranks in local order, then the nodes in
    order (rank_of[node][local] -> rank, its layout's)."""
    from hpccoll.ops import reduce_in_rank_order

    return reduce_in_rank_order(op, [reduce_in_rank_order(op, [xs[r] for r in row]) for row in rank_of])


def check_bitwise(got, ref, what):
    """got == ref bit for bit, and the same bits on every rank (a digest compared across them)."""
    import hashlib

    assert_bitwise(got, ref, what)
    digest = hashlib.sha256(np.ascontiguousarray(got).tobytes()).hexdigest()
    assert len(set(world().allgather(digest))) == 1, f"{what}: results differ across ranks"


def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def nccl_shared_gpus(c) -> str | None:
    """Which ranks of `c` share a GPU as NCCL tells GPUs apart (None: none do, NCCL accepts
    them); collective.  Ranks on one GPU count as apart under HPCCOLL_TEST_NCCL_LOOPBACK=1."""
    from hpccoll.backends.topology import ranks_sharing_gpus

    return ranks_sharing_gpus(world(), c._backend.device_id)


def skip_where_nccl_refuses(c) -> None:
    """Skip (on every rank: collective) where ranks of `c` share a GPU as NCCL sees them."""
    if nccl_shared_gpus(c):
        pytest.skip("NCCL refuses two ranks on one GPU (HPCCOLL_TEST_NCCL_LOOPBACK=1 runs it there)")


def replay_captured_allreduce_then_free(c, h):
    """On NCCL communicator `c`: capture c.Allreduce of host array h into a CUDA graph on a
    stream of its own, replay it once, then Free() c, which returns at once (under 10 s) though
    NCCL's release waits for the graph, on c's releaser thread.  Returns (the result on the host,
    (graph, stream, input, output)): the graph lives as long as the caller keeps that tuple."""
    import time

    import cupy as cp

    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x, y = cp.asarray(h), cp.zeros(h.size)
        s.begin_capture()
        c.Allreduce(x, y, stream=s)
        g = s.end_capture()
    g.launch(stream=s)
    s.synchronize()
    got = cp.asnumpy(y)
    t0 = time.monotonic()
    c.Free()
    assert time.monotonic() - t0 < 10, "Free waited for the graph"
    assert c._backend.releaser is not None and c._backend.releaser.is_alive()  # NCCL waits for g
    return got, (g, s, x, y)


def check_nccl_missing_peer_times_out(c, n: int, waiting: bool, **kw) -> None:
    """The NCCL watchdog's contract on `c` (made with timeout=2.0): an Allreduce of n floats
    every rank makes (NCCL is up); then only the `waiting` ranks make another, whose synchronize
    raises CollectiveTimeout within 20 s, after which the aborted kernel has returned and every
    later call raises it again.  The other ranks wait past the timeout (6 s); the caller frees."""
    import time

    import cupy as cp

    import hpccoll

    x = cp.ones(n, cp.float32)
    y = cp.empty_like(x)
    c.Allreduce(x, y, **kw)
    c.synchronize()
    if not waiting:
        time.sleep(6.0)
        return
    t0 = time.monotonic()
    c.Allreduce(x, y, **kw)
    with pytest.raises(hpccoll.CollectiveTimeout, match="Allreduce: an NCCL call did not finish"):
        c.synchronize()
    assert time.monotonic() - t0 < 20, "the watchdog took far longer than the timeout"
    cp.cuda.get_current_stream().synchronize()  # the aborted kernel has returned
    with pytest.raises(hpccoll.CollectiveTimeout):
        c.Allreduce(x, y, **kw)


@pytest.fixture(scope="module")
def cc():
    """A CUDA-backend Communicator over MPI.COMM_WORLD, one per test module (import it into the
    module: a tests/gpu/conftest.py would shadow tests/conftest.py, which tests/mpi imports)."""
    import hpccoll

    c = hpccoll.Communicator(backend="cuda")
    assert c.backend == "cuda", "the CUDA backend did not open"
    yield c
    c.Free()


@pytest.fixture(scope="module")
def hc():
    """A hierarchical Communicator over MPI.COMM_WORLD on two simulated nodes of equal size
    (HPCCOLL_NODE_SIZE): CUDA kernels inside a node, MPI or NCCL between nodes.  Skips at odd
    rank counts."""
    import os

    import hpccoll

    size = world().Get_size()
    if size % 2:
        pytest.skip(f"two simulated nodes of equal size need an even rank count, not {size}")
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


_SPIN_SOURCE = r'''
extern "C" __global__ void hc_test_spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}
'''
_spin_kernel = None


def spin_on(stream, cycles: int = 200_000_000):
    """Queue on `stream` a one-thread kernel that spins `cycles` clock cycles (about 0.1 s on an
    H200): what is queued after it on that stream runs late, so work that is not ordered after
    the stream finds the buffers as they were before."""
    import cupy as cp

    global _spin_kernel
    if _spin_kernel is None:
        _spin_kernel = cp.RawKernel(_SPIN_SOURCE, "hc_test_spin")
    with stream:
        _spin_kernel((1,), (1,), (np.int64(cycles),))


def check_calls_follow_their_stream(c, seed: int):
    """Every collective of `c` on a non-blocking stream s, its input written by s after a spin
    (spin_on), the buffers 16-byte aligned and then 4 bytes off (so the staging copies run too),
    out of place and in place: each call, and every copy it makes, must wait for s's earlier
    work.  Stale input is NaN, so a copy made too early shows.  Every result bitwise against the
    host's reduction in the backend's order (rank order; by node first where it is hierarchical).
    Every array the queued work on s reads is kept until s is synchronized: CuPy's pool hands a
    freed array's memory to the next allocation on the stream it was made on (here the default
    stream, which does not wait for s), whose NaN fill would then land before s read it."""
    import cupy as cp

    import hpccoll
    from hpccoll.ops import OPS

    w = world()
    rank, size = w.Get_rank(), w.Get_size()
    rank_of = getattr(getattr(c._backend, "layout", None), "rank_of", [range(size)])  # flat: one node

    def total(xs):  # the sum the backend computes: by node first where it is hierarchical
        return reduce_by_nodes(OPS["SUM"], xs, rank_of)

    s = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng([rank, seed])
    n = 1001
    keep = []  # everything s still reads, alive until s is synchronized
    for off in (0, 1):
        def buf(count):  # `count` floats, 16-byte aligned when off == 0, 4 bytes past it otherwise
            keep.append(cp.full(count + off, np.nan, np.float32)[off:])
            return keep[-1]

        def late(dst, host):  # dst[...] = host, written on s after the spin
            src = cp.asarray(host)
            keep.append(src)
            cp.cuda.Device().synchronize()
            spin_on(s)
            with s:
                dst[...] = src

        h = rng.standard_normal(n).astype(np.float32)
        big = rng.standard_normal(n * size).astype(np.float32)
        hs, bigs = w.allgather(h), w.allgather(big)
        cases = []
        x, y = buf(n), buf(n)
        late(x, h)
        c.Allreduce(x, y, stream=s, deterministic=True)
        cases.append(("Allreduce", y, total(hs)))
        x = buf(n)
        late(x, h)
        c.Allreduce(hpccoll.IN_PLACE, x, stream=s, deterministic=True)
        cases.append(("Allreduce in place", x, total(hs)))
        x = buf(n)
        late(x, h)
        c.Bcast(x, root=size - 1, stream=s)
        cases.append(("Bcast", x, hs[size - 1]))
        g = buf(n * size)
        late(g[rank * n:(rank + 1) * n], h)
        c.Allgather(hpccoll.IN_PLACE, g, stream=s)
        cases.append(("Allgather in place", g, np.concatenate(hs)))
        x = buf(n * size)
        late(x, big)
        c.Reduce_scatter_block(hpccoll.IN_PLACE, x, stream=s, deterministic=True)
        cases.append(("Reduce_scatter_block in place", x[:n], total([b[rank * n:(rank + 1) * n] for b in bigs])))
        if "Alltoall" in c._backend.caps.collectives:
            x = buf(n * size)
            late(x, big)
            c.Alltoall(hpccoll.IN_PLACE, x, stream=s)
            cases.append(("Alltoall in place", x, np.concatenate([b[rank * n:(rank + 1) * n] for b in bigs])))
        s.synchronize()
        c.synchronize(s)
        for what, got, ref in cases:  # (each rank's own reference: Reduce_scatter and Alltoall differ by rank)
            assert_bitwise(cp.asnumpy(got), np.asarray(ref, np.float32),
                           f"{what}, buffers {4 * off} bytes off, rank {rank}")
