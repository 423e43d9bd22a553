"""Host backend collectives against a numpy reference built from every rank's gathered input.

Every iteration draws fresh data seeded by (test, rank, iteration), so a collective that
returns stale or another rank's data fails.  Run with an odd rank count too (`-n 3`): the
rank-order reference and block layouts differ from the even case."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from conftest import COUNTS, assert_still_works, dtypes
from mpi4py import MPI

import hpccoll
from hpccoll.ops import BFLOAT16, MAX, MIN, PROD, SUM, reduce_in_rank_order

pytestmark = pytest.mark.mpi(min_size=2)

OPS = [pytest.param(op, id=op.name) for op in (SUM, PROD, MAX, MIN)]
ITERATIONS = 4
WORLD = MPI.COMM_WORLD


# -- data and references -----------------------------------------------------------

def _rng(request, it: int, salt: int = 0) -> np.random.Generator:
    """Different for every test, rank and iteration; the same on a rerun."""
    test = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng([test, WORLD.Get_rank(), it, salt])


def _is_float(dtype) -> bool:
    return dtype == BFLOAT16 or np.dtype(dtype).kind == "f"


def random_input(rng, dtype, n: int, op=SUM) -> np.ndarray:
    """Random values that keep every op's exact result representable (no overflow)."""
    size = WORLD.Get_size()
    if _is_float(dtype):
        if op is PROD:  # magnitudes in [0.5, 2): a product of `size` of them stays finite
            x = rng.uniform(0.5, 2.0, n) * rng.choice([-1.0, 1.0], n)
        else:
            x = rng.standard_normal(n) * 4
        return x.astype(dtype)
    info = np.iinfo(dtype)
    if op is PROD:
        hi = int(round(info.max ** (1.0 / size))) // 2
    elif op is SUM:
        hi = info.max // size
    else:
        hi = info.max
    return rng.integers(-hi, hi, n, dtype=dtype, endpoint=True)


def gather(x: np.ndarray) -> np.ndarray:
    """Every rank's x, stacked in rank order (through plain mpi4py, not hpccoll)."""
    parts = WORLD.allgather(np.ascontiguousarray(x).tobytes())
    return np.stack([np.frombuffer(p, dtype=x.dtype).reshape(x.shape) for p in parts])


def bits(x: np.ndarray) -> np.ndarray:
    """x viewed as unsigned integers of its width: equality of these is bitwise equality."""
    return np.ascontiguousarray(x).view(f"u{x.dtype.itemsize}")


def assert_bitwise(got: np.ndarray, want: np.ndarray, what: str = "result"):
    assert got.dtype == want.dtype and got.shape == want.shape
    if not np.array_equal(bits(got), bits(want)):
        bad = np.flatnonzero(bits(got).ravel() != bits(want).ravel())
        i = bad[0]
        pytest.fail(f"{what}: {bad.size} of {got.size} elements differ in bits on rank "
                    f"{WORLD.Get_rank()}; first at [{i}]: got {got.ravel()[i]!r}, want {want.ravel()[i]!r}")


def assert_same_on_every_rank(x: np.ndarray):
    """Every rank holds bit-identical x."""
    every = gather(x)
    for r in range(1, len(every)):
        assert np.array_equal(bits(every[r]), bits(every[0])), f"rank {r} differs from rank 0 in bits"


def _eps(dtype) -> float:
    if dtype == BFLOAT16:
        import ml_dtypes

        return float(ml_dtypes.finfo(dtype).eps)
    return float(np.finfo(dtype).eps)


def assert_reduced(got: np.ndarray, inputs: np.ndarray, op, deterministic: bool):
    """deterministic: the rank-order reference bit for bit.  Otherwise exact for integers and
    MAX/MIN, and within the rounding-error bound of any summation order for float SUM/PROD."""
    want = reduce_in_rank_order(op, inputs)
    if deterministic or not _is_float(got.dtype) or op in (MAX, MIN):
        assert_bitwise(got, want)
        return
    wide = inputs.astype(np.float64)
    scale = np.abs(wide).sum(axis=0) if op is SUM else np.abs(wide).prod(axis=0)
    tol = 2 * len(inputs) * _eps(got.dtype) * scale
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert np.all(err <= tol), f"max error {err.max()} exceeds the rounding bound"


def _in_place_ids(v):
    return "in_place" if v else "out_of_place"


# -- Allreduce -------------------------------------------------------------------------

@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "nondet"])
@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", dtypes())
def test_allreduce(comm, request, dtype, op, n, deterministic):
    for it in range(ITERATIONS):
        x = random_input(_rng(request, it), dtype, n, op)
        x_before = x.copy()
        out = np.full(n, 7, dtype=dtype)  # stale data the collective must overwrite
        comm.Allreduce(x, out, op=op, deterministic=deterministic)
        assert_bitwise(x, x_before, "sendbuf (must not change)")
        assert_reduced(out, gather(x), op, deterministic)


@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "nondet"])
@pytest.mark.parametrize("n", (1, 1023))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", dtypes())
def test_allreduce_in_place(comm, request, dtype, op, n, deterministic):
    for it in range(ITERATIONS):
        x = random_input(_rng(request, it), dtype, n, op)
        inputs = gather(x)
        comm.Allreduce(hpccoll.IN_PLACE, x, op=op, deterministic=deterministic)
        assert_reduced(x, inputs, op, deterministic)


@pytest.mark.parametrize("in_place", [hpccoll.IN_PLACE, MPI.IN_PLACE], ids=["hpccoll", "mpi4py"])
def test_allreduce_mpi4py_in_place_marker(comm, request, in_place):
    x = random_input(_rng(request, 0), np.float64, 7)
    inputs = gather(x)
    comm.Allreduce(in_place, x, op=SUM, deterministic=True)
    assert_reduced(x, inputs, SUM, True)


@pytest.mark.parametrize("name", ["SUM", "PROD", "MAX", "MIN"])
@pytest.mark.parametrize("dtype", [np.float64, np.int32], ids=["float64", "int32"])
def test_allreduce_accepts_mpi4py_ops(comm, request, dtype, name):
    op = getattr(hpccoll, name)
    for it in range(ITERATIONS):
        x = random_input(_rng(request, it), dtype, 1023, op)
        out = np.empty_like(x)
        comm.Allreduce(x, out, op=getattr(MPI, name), deterministic=True)
        assert_reduced(out, gather(x), op, True)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", dtypes())
def test_lowercase_allreduce_returns_new_array(comm, request, dtype, op):
    for it in range(ITERATIONS):
        x = random_input(_rng(request, it), dtype, 7 * 3, op).reshape(7, 3)
        y = comm.allreduce(x, op=op, deterministic=True)
        assert y is not x and y.shape == x.shape and y.dtype == x.dtype
        assert_reduced(y, gather(x), op, True)


def test_lowercase_allreduce_bad_input_names_x(comm):
    """Not an array: the error names allreduce's argument, before any communication."""
    with pytest.raises(TypeError, match="allreduce: x must be a numpy array or a device array .* not list"):
        comm.allreduce([1.0, 2.0])
    with pytest.raises(ValueError, match="allreduce: x is not contiguous: pass np.ascontiguousarray\\(x\\)"):
        comm.allreduce(np.ones(8)[::2])
    y = comm.allreduce(np.asfortranarray(np.ones((3, 4), np.float64)))  # the comm still works; order kept
    assert y.flags.f_contiguous and (y == comm.Get_size()).all()


@pytest.mark.parametrize("order", ["C", "F"])
def test_allreduce_multidimensional(comm, request, order):
    """2-D arrays in either memory order reduce element by element, shape kept."""
    for it in range(ITERATIONS):
        x = np.asarray(random_input(_rng(request, it), np.float32, 5 * 9).reshape(5, 9), order=order)
        out = np.empty_like(x, order=order)
        comm.Allreduce(x, out, op=SUM, deterministic=True)
        assert_reduced(out, gather(x), SUM, True)


# -- determinism ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", dtypes())
def test_deterministic_identical_bits_everywhere_and_every_time(comm, request, dtype, op):
    for it in range(ITERATIONS):
        x = random_input(_rng(request, it), dtype, 4097, op)
        first = np.empty_like(x)
        second = np.empty_like(x)
        comm.Allreduce(x, first, op=op, deterministic=True)
        comm.Allreduce(x, second, op=op, deterministic=True)
        assert_bitwise(second, first, "repeated call")
        assert_same_on_every_rank(first)


def test_deterministic_flag_on_the_communicator(request):
    with hpccoll.Communicator(backend="host", deterministic=True, check=False) as c:
        x = random_input(_rng(request, 0), np.float32, 4097)
        out = np.empty_like(x)
        c.Allreduce(x, out)
        assert_reduced(out, gather(x), SUM, True)
        assert_same_on_every_rank(out)


SPECIALS = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, 1.0, -1.0])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [d for d in dtypes() if d.id.startswith(("float", "bf"))])
def test_deterministic_special_values(comm, request, dtype, op):
    """NaN, -0.0 and +-Inf follow the reference; NaN positions compared by isnan."""
    for it in range(ITERATIONS):
        rng = _rng(request, it)
        x = rng.choice(SPECIALS, 1023).astype(dtype)
        x[:: 5] = rng.standard_normal(x[:: 5].size).astype(dtype)
        out = np.empty_like(x)
        comm.Allreduce(x, out, op=op, deterministic=True)
        want = reduce_in_rank_order(op, gather(x))
        nan = np.isnan(want.astype(np.float64))
        assert np.array_equal(np.isnan(out.astype(np.float64)), nan), "NaN positions differ"
        assert_bitwise(out[~nan], want[~nan])
        got_all = gather(out)
        for r in range(1, len(got_all)):
            assert np.array_equal(np.isnan(got_all[r].astype(np.float64)), nan)
            assert np.array_equal(bits(got_all[r][~nan]), bits(got_all[0][~nan]))


# -- Reduce_scatter_block ------------------------------------------------------------------

@pytest.mark.parametrize("in_place", [False, True], ids=_in_place_ids)
@pytest.mark.parametrize("n", COUNTS[:3])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", dtypes())
def test_reduce_scatter_block(comm, request, dtype, op, n, in_place):
    size, rank = comm.size, comm.rank
    for it in range(ITERATIONS):
        x = random_input(_rng(request, it), dtype, n * size, op)
        inputs = gather(x)
        want = reduce_in_rank_order(op, inputs)[rank * n:(rank + 1) * n]
        if in_place:
            comm.Reduce_scatter_block(hpccoll.IN_PLACE, x, op=op, deterministic=True)
            got = x[:n]
        else:
            got = np.full(n, 3, dtype=dtype)
            comm.Reduce_scatter_block(x, got, op=op)
        assert_bitwise(got, want)


# -- Allgather --------------------------------------------------------------------------------

@pytest.mark.parametrize("in_place", [False, True], ids=_in_place_ids)
@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("dtype", dtypes())
def test_allgather(comm, request, dtype, n, in_place):
    size, rank = comm.size, comm.rank
    for it in range(ITERATIONS):
        x = random_input(_rng(request, it), dtype, n)
        want = gather(x).reshape(-1)
        if in_place:
            out = np.full(n * size, 5, dtype=dtype)
            out[rank * n:(rank + 1) * n] = x
            comm.Allgather(hpccoll.IN_PLACE, out)
        else:
            out = np.full(n * size, 5, dtype=dtype)
            comm.Allgather(x, out)
        assert_bitwise(out, want)


# -- Bcast -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("dtype", dtypes())
def test_bcast_from_every_root(comm, request, dtype, n):
    for it in range(ITERATIONS):
        for root in range(comm.size):
            x = random_input(_rng(request, it, salt=root), dtype, n)
            want = gather(x)[root]
            buf = x.copy() if comm.rank == root else np.full(n, 9, dtype=dtype)
            comm.Bcast(buf, root=root)
            assert_bitwise(buf, want, f"Bcast from root {root}")


def test_bcast_2d_keeps_shape(comm, request):
    x = random_input(_rng(request, 0), np.int64, 12).reshape(3, 4)
    want = gather(x)[comm.size - 1]
    buf = x.copy()
    comm.Bcast(buf, root=comm.size - 1)
    assert_bitwise(buf, want)


def test_barrier(comm):
    comm.Barrier()


# -- messages over MPI's int count ---------------------------------------------------------

@pytest.mark.parametrize("per_rank_bytes", [4096, 1544, 2004])
def test_messages_over_the_int_count_limit(comm, request, monkeypatch, per_rank_bytes):
    """Messages of more bytes than an MPI count holds go as units of a contiguous type
    (Allgather, Alltoall) or in pieces (Bcast): the limit lowered to 1000 bytes here (a 2 GiB
    Bcast failed with MPI_ERR_ARG on the GPU machine).  Per-rank sizes with 2^12, 2^3 and 2^2
    byte units; fresh data, exact results."""
    from hpccoll.backends import host_rounds

    monkeypatch.setattr(host_rounds, "MAX_COUNT", 1000)
    size, rank = WORLD.Get_size(), WORLD.Get_rank()
    rng = _rng(request, 0)
    n = per_rank_bytes // 4
    mine = rng.integers(-1000, 1000, size=n).astype(np.int32)
    everyone = np.stack(WORLD.allgather(mine))
    got = np.empty(size * n, dtype=np.int32)
    comm.Allgather(mine, got)
    np.testing.assert_array_equal(got, everyone.ravel())
    for root in range(size):
        buf = everyone[root].copy() if rank == root else np.zeros(n, dtype=np.int32)
        big = np.tile(buf, 3)                      # 3x the limit and more: several pieces
        comm.Bcast(big, root=root)
        np.testing.assert_array_equal(big, np.tile(everyone[root], 3))
    send = rng.integers(-1000, 1000, size=size * n).astype(np.int32)
    sends = np.stack(WORLD.allgather(send))
    out = np.empty(n, dtype=np.int32)
    comm.Reduce_scatter_block(send, out, op=hpccoll.SUM)
    np.testing.assert_array_equal(out, sends.reshape(size, size, n)[:, rank].sum(axis=0))
    res = np.empty_like(send)
    comm.Allreduce(send, res, op=hpccoll.SUM)      # deterministic: gathers every contribution
    np.testing.assert_array_equal(res, sends.sum(axis=0))


def test_message_without_a_unit_under_the_limit_is_refused(comm, monkeypatch):
    """A block whose largest 2^k-byte unit still leaves more units than the limit (1001 int32:
    4-byte units) gets a clear error on every rank instead of MPI's MPI_ERR_ARG."""
    from hpccoll.backends import host_rounds

    monkeypatch.setattr(host_rounds, "MAX_COUNT", 1000)
    mine = np.zeros(1001, dtype=np.int32)
    with pytest.raises(ValueError, match="pad the buffer"):
        comm.Allgather(mine, np.empty(WORLD.Get_size() * 1001, dtype=np.int32))


# -- Alltoall / Alltoallv --------------------------------------------------------------------

def _shared_rng(request, it: int) -> np.random.Generator:
    """The same generator on every rank (for choices all ranks must agree on: counts)."""
    return np.random.default_rng([zlib.crc32(request.node.nodeid.encode()), it, 99])


@pytest.mark.parametrize("in_place", [False, True], ids=_in_place_ids)
@pytest.mark.parametrize("n", COUNTS[:3])
@pytest.mark.parametrize("dtype", dtypes())
def test_alltoall(comm, request, dtype, n, in_place):
    size, rank = comm.size, comm.rank
    for it in range(ITERATIONS):
        x = random_input(_rng(request, it), dtype, n * size)
        want = gather(x).reshape(size, size, n)[:, rank].reshape(-1)   # block `rank` of every rank's input
        if in_place:
            comm.Alltoall(hpccoll.IN_PLACE, x)
            got = x
        else:
            got = np.full(n * size, 5, dtype=dtype)
            comm.Alltoall(x, got)
        assert_bitwise(got, want)


def test_alltoall_fortran_2d_in_memory_order(comm, request):
    """2-D arrays go in their memory order: an F-ordered (n, size) array's column j is block j."""
    size, rank = comm.size, comm.rank
    x = np.asfortranarray(random_input(_rng(request, 0), np.float64, 5 * size).reshape(5, size))
    out = np.asfortranarray(np.zeros((5, size)))
    comm.Alltoall(x, out)
    everyone = gather(x)                      # (size, 5, size), each rank's array
    for i in range(size):
        assert_bitwise(out[:, i], everyone[i][:, rank])


def _random_counts(rng, size: int, zeros: bool):
    """counts[i][j]: elements rank i sends to rank j; odd sizes, some zero."""
    c = rng.integers(0, 9, size=(size, size)) * 2 + 1
    if zeros:
        c[rng.random((size, size)) < 0.3] = 0
    return c


def _displs(rng, counts, gaps: bool):
    """Displacements of blocks of `counts`, in a random order, with random gaps; and the length."""
    order = rng.permutation(len(counts)) if gaps else np.arange(len(counts))
    displs, at = np.zeros(len(counts), dtype=np.int64), 0
    for j in order:
        at += int(rng.integers(0, 3)) if gaps else 0
        displs[j] = at
        at += int(counts[j])
    return displs, at + (int(rng.integers(0, 3)) if gaps else 0)


@pytest.mark.parametrize("zeros", [False, True], ids=["nonzero", "zeros"])
@pytest.mark.parametrize("gaps", [False, True], ids=["packed", "gaps"])
@pytest.mark.parametrize("dtype", [np.dtype("float64"), np.dtype("int32"), np.dtype("float16")], ids=str)
def test_alltoallv(comm, request, dtype, gaps, zeros):
    """Fresh counts (odd, some zero) and data every iteration, displacements out of order and
    with gaps: every received block is the sender's block for this rank, and the elements
    between received blocks keep their values."""
    size, rank = comm.size, comm.rank
    for it in range(ITERATIONS):
        shared = _shared_rng(request, it)
        counts = _random_counts(shared, size, zeros)
        mine = _rng(request, it)
        sdispls, slen = _displs(mine, counts[rank], gaps)
        rdispls, rlen = _displs(mine, counts[:, rank], gaps)
        x = random_input(mine, dtype, slen)
        got = np.full(rlen, 3, dtype=dtype)
        before = got.copy()
        if gaps:
            comm.Alltoallv((x, counts[rank], sdispls), (got, counts[:, rank].tolist(), rdispls.tolist()))
        else:
            comm.Alltoallv((x, counts[rank]), (got, counts[:, rank]))
        xs = WORLD.allgather((x, sdispls))
        want = before.copy()
        for i, (xi, di) in enumerate(xs):
            c = counts[i, rank]
            want[rdispls[i]:rdispls[i] + c] = xi[di[rank]:di[rank] + c]
        assert_bitwise(got, want)


@pytest.mark.parametrize("gaps", [False, True], ids=["packed", "gaps"])
def test_alltoallv_on_one_rank(request, gaps):
    """One rank: the block to itself is a local copy (no MPI call), displacements honoured and
    the elements outside the block kept; fresh data every iteration."""
    with hpccoll.Communicator(MPI.COMM_SELF, backend="host") as one:
        for it in range(ITERATIONS):
            rng = _rng(request, it)
            c = int(rng.integers(0, 40))
            sd, rd = int(rng.integers(0, 5)) if gaps else 0, int(rng.integers(0, 5)) if gaps else 0
            x = random_input(rng, np.dtype("float64"), sd + c + 2)
            got = np.full(rd + c + 3, 7.0)
            want = got.copy()
            want[rd:rd + c] = x[sd:sd + c]
            one.Alltoallv((x, [c], [sd]), (got, [c], [rd]))
            assert_bitwise(got, want)


def test_alltoallv_own_block_counts_must_agree(comm):
    """What a rank sends itself and what it expects from itself are both local: a mismatch is
    refused on that rank (every rank here) before any communication, naming both counts."""
    size, rank = comm.size, comm.rank
    send = [1] * size
    recv = [1] * size
    recv[rank] = 2
    with pytest.raises(ValueError, match=rf"sends itself 1 elements \(sendbuf counts\[{rank}\]\) but expects 2"):
        comm.Alltoallv((np.zeros(size), send), (np.zeros(size + 1), recv))
    assert_still_works(comm)


def test_alltoallv_nothing_to_send(comm, request):
    """All counts zero, and zero-length arrays: a valid call that moves nothing."""
    size = comm.size
    got = np.full(4, 2.0)
    comm.Alltoallv((np.zeros(0), [0] * size), (got, [0] * size))
    assert_bitwise(got, np.full(4, 2.0))


@pytest.mark.parametrize("per_block", [250, 300])
def test_alltoallv_over_the_int_count_limit(comm, request, monkeypatch, per_block):
    """Counts go in elements of the dtype's size (a contiguous type), so a block of more bytes
    than MPI's int still goes (the limit lowered to 1000): 250 and 300 float64 (2000 and 2400
    bytes); a block of more ELEMENTS than the limit is refused before any communication."""
    from hpccoll.backends import host_rounds

    monkeypatch.setattr(host_rounds, "MAX_COUNT", 1000)
    size, rank = comm.size, comm.rank
    x = random_input(_rng(request, 0), np.float64, per_block * size)
    got = np.empty(per_block * size)
    comm.Alltoallv((x, [per_block] * size), (got, [per_block] * size))
    assert_bitwise(got, gather(x).reshape(size, size, per_block)[:, rank].reshape(-1))
    with pytest.raises(ValueError, match=r"Alltoallv: a count or displacement of \d+ elements exceeds an MPI count"):
        comm.Alltoallv((np.zeros(2001 * size), [2001] * size), (np.zeros(2001 * size), [2001] * size))


def _bad(comm, exc, match, *args):
    with pytest.raises(exc, match=match):
        comm.Alltoallv(*args)


def test_alltoall_bad_inputs_name_the_argument(comm):
    size = comm.size
    with pytest.raises(ValueError, match=rf"Alltoall: recvbuf has {size * 3 + 1} elements, not a multiple of size={size}"):
        comm.Alltoall(np.zeros(size * 3 + 1), np.zeros(size * 3 + 1))
    with pytest.raises(ValueError, match=rf"Alltoall: recvbuf has {size * 2} elements, sendbuf {size * 3}"):
        comm.Alltoall(np.zeros(size * 3), np.zeros(size * 2))
    with pytest.raises(TypeError, match="Alltoall: sendbuf is float32 but recvbuf is float64"):
        comm.Alltoall(np.zeros(size, np.float32), np.zeros(size))


def test_alltoallv_bad_inputs_name_the_argument(comm):
    size = comm.size
    ones, x = [1] * size, np.zeros(size)
    _bad(comm, ValueError, rf"sendbuf's counts has {size + 1} entries: give one per rank \({size}\)",
         (x, ones + [1]), (x, ones))
    _bad(comm, ValueError, r"recvbuf's displs has 1 entries", (x, ones), (x, ones, [0]))
    _bad(comm, ValueError, r"sendbuf's counts\[0\] = -1 is negative", (x, [-1] + ones[1:]), (x, ones))
    _bad(comm, ValueError, r"recvbuf's displs\[1\] = -2 is negative", (x, ones), (x, ones, [0, -2] + [0] * (size - 2)))
    _bad(comm, TypeError, r"sendbuf's counts\[0\] = 1.0 is not an integer", (x, [1.0] + ones[1:]), (x, ones))
    _bad(comm, TypeError, r"sendbuf's counts\[0\] = True is not an integer", (x, [True] + ones[1:]), (x, ones))
    _bad(comm, ValueError, rf"recvbuf's block for rank {size - 1} \(displacement {size}, count 1\) ends at "
         rf"element {size + 1}, past the array's {size}", (x, ones), (x, ones, list(range(1, size + 1))))
    _bad(comm, ValueError, r"recvbuf's blocks from ranks 0 and 1 overlap", (x, ones), (np.zeros(2 * size), ones, [0] * size))
    _bad(comm, TypeError, r"sendbuf's array is float64 but recvbuf's array is int32",
         (x, ones), (np.zeros(size, np.int32), ones))
    _bad(comm, TypeError, r"sendbuf must be \(array, counts\) or \(array, counts, displs\)", x, (x, ones))
    _bad(comm, TypeError, r"recvbuf's counts must be a sequence", (x, ones), (x, 3))
    _bad(comm, ValueError, "IN_PLACE is not supported", hpccoll.IN_PLACE, (x, ones))
    ro = np.zeros(size)
    ro.flags.writeable = False
    _bad(comm, ValueError, "recvbuf's array is read-only", (x, ones), (ro, ones))


def test_alltoallv_check_mode_catches_counts_that_do_not_pair():
    """With check=True, a count rank i sends that rank j does not expect raises MismatchError on
    every rank (without it MPI would truncate or hang)."""
    size, rank = WORLD.Get_size(), WORLD.Get_rank()
    with hpccoll.Communicator(backend="host", check=True) as c:
        send = [1] * size
        recv = [1] * size
        if rank == 0:
            recv[size - 1] = 2                          # expects 2 from the last rank, which sends 1
        with pytest.raises(hpccoll.MismatchError, match=f"rank {size - 1} sends 1 elements to rank 0, which expects 2"):
            c.Alltoallv((np.zeros(size), send), (np.zeros(size + 1), recv))
        c.Alltoallv((np.arange(size, dtype=float), send), (np.zeros(size), [1] * size))


# -- a randomized soak -------------------------------------------------------------------

SOAK_KINDS = ("Allreduce",) * 3 + ("allreduce", "Bcast", "Allgather", "Reduce_scatter_block", "Alltoall",
                                   "Alltoallv")


def _soak_draw(rng, size: int, kinds=SOAK_KINDS) -> dict:
    """One call, the same on every rank."""
    dts = [np.dtype(n) for n in ("float64", "float32", "float16", "int32", "int64")]
    dts += [BFLOAT16] if BFLOAT16 is not None else []
    n = int(np.exp(rng.uniform(0.0, np.log(1 << 13)))) - 1  # 0 .. 8 Ki elements, log-uniform
    call = {"kind": str(rng.choice(kinds)), "dtype": dts[int(rng.integers(len(dts)))], "n": n,
            "op": (SUM, PROD, MAX, MIN)[int(rng.integers(4))], "det": bool(rng.integers(2)),
            "in_place": bool(rng.integers(3) == 0), "root": int(rng.integers(size)), "on": int(rng.choice(3, p=[0.6, 0.2, 0.2]))}
    if call["kind"] in ("Reduce_scatter_block", "Alltoall"):
        call["len"] = n * size
    elif call["kind"] == "Alltoallv":  # counts[i][j]: rank i to rank j
        call["counts"] = rng.integers(0, n + 1, (size, size)).tolist()
    return call


def _soak_input(seed, b: int, i: int, call: dict, r: int):
    """Rank r's input for call i of batch b (every rank can make every rank's)."""
    n = sum(call["counts"][r]) if "counts" in call else call.get("len", call["n"])
    return random_input(np.random.default_rng([seed, b, i, r]), call["dtype"], n, call["op"])


class _SoakRequest:
    """A persistent request made once; each use writes fresh input into its bound buffer."""

    def __init__(self, c, call: dict):
        n, size, rank, dt, ip = call["n"], c.size, c.rank, call["dtype"], call["in_place"]
        self.call, kind = call, call["kind"]
        if kind == "Bcast":
            self.inp = self.out = np.empty(n, dt)
            self.req = c.Bcast_init(self.inp, root=call["root"])
        elif kind == "Allgather":
            self.out = np.empty(n * size, dt)
            self.inp = self.out[rank * n:(rank + 1) * n] if ip else np.empty(n, dt)
            self.req = c.Allgather_init(hpccoll.IN_PLACE if ip else self.inp, self.out)
        elif kind == "Reduce_scatter_block":
            self.inp = np.empty(n * size, dt)
            self.out = self.inp[:n] if ip else np.empty(n, dt)
            self.req = c.Reduce_scatter_block_init(hpccoll.IN_PLACE if ip else self.inp, self.inp if ip else self.out,
                                                   op=call["op"], deterministic=call["det"])
        else:
            self.inp = np.empty(n, dt)
            self.out = self.inp if ip else np.empty(n, dt)
            self.req = c.Allreduce_init(hpccoll.IN_PLACE if ip else self.inp, self.out, op=call["op"],
                                        deterministic=call["det"])

    def start(self, x):
        self.inp[...] = x
        self.req.Start()
        return self.out


def _soak_issue(c, call: dict, x):
    """Issue one call; returns the array that holds its result once the call (or its group) is done."""
    kind, n, size, rank, ip = call["kind"], call["n"], c.size, c.rank, call["in_place"]
    x = x.copy()  # the buffer the call may write
    if kind == "allreduce":
        return c.allreduce(x, op=call["op"], deterministic=call["det"])
    if kind == "Allreduce":
        out = x if ip else np.empty_like(x)
        c.Allreduce(hpccoll.IN_PLACE if ip else x, out, op=call["op"], deterministic=call["det"])
        return out
    if kind == "Bcast":
        c.Bcast(x, root=call["root"])
        return x
    if kind == "Allgather":
        out = np.empty(n * size, x.dtype)
        if ip:
            out[rank * n:(rank + 1) * n] = x
        c.Allgather(hpccoll.IN_PLACE if ip else x, out)
        return out
    if kind == "Reduce_scatter_block":
        out = x[:n] if ip else np.empty(n, x.dtype)
        c.Reduce_scatter_block(hpccoll.IN_PLACE if ip else x, x if ip else out, op=call["op"],
                               deterministic=call["det"])
        return out
    if kind == "Alltoall":
        out = x if ip else np.empty_like(x)
        c.Alltoall(hpccoll.IN_PLACE if ip else x, out)
        return out
    counts = call["counts"]
    out = np.empty(sum(counts[i][rank] for i in range(size)), x.dtype)
    c.Alltoallv((x, counts[rank]), (out, [counts[i][rank] for i in range(size)]))
    return out


def _soak_check(got, call: dict, xs, rank: int, size: int, what: str):
    try:
        _soak_compare(got, call, xs, rank, size)
    except (AssertionError, pytest.fail.Exception) as exc:
        pytest.fail(f"{what}: {exc}")


def _soak_compare(got, call: dict, xs, rank: int, size: int):
    kind, n = call["kind"], call["n"]
    if kind in ("Allreduce", "allreduce"):
        return assert_reduced(got, np.stack(xs), call["op"], call["det"])
    if kind == "Reduce_scatter_block":
        return assert_reduced(got, np.stack([x[rank * n:(rank + 1) * n] for x in xs]), call["op"], call["det"])
    if kind == "Bcast":
        want = xs[call["root"]]
    elif kind == "Allgather":
        want = np.concatenate(xs)
    elif kind == "Alltoall":
        want = np.concatenate([x[rank * n:(rank + 1) * n] for x in xs])
    else:
        counts = call["counts"]
        want = np.concatenate([xs[i][sum(counts[i][:rank]):sum(counts[i][:rank + 1])] for i in range(size)])
    assert_bitwise(got, want)


def test_soak_mixed_calls(comm):
    """Random batches of calls, the same on every rank (one fresh seed from rank 0, named in any
    failure): every collective, dtype, op, policy, root and in-place form, 0 to 8 Ki elements
    (the shared-memory path and MPI's), on the communicator, on a Dup of it and on one in check
    mode, some batches in `comm.group()`, persistent requests started among the calls; every result checked after its
    batch against every rank's input, regenerated from the seed.  HPCCOLL_SOAK_CALLS (default
    1500) sets the number of calls."""
    import os

    size, rank = comm.size, comm.rank
    calls = int(os.environ.get("HPCCOLL_SOAK_CALLS", "1500"))
    seed = WORLD.bcast(int(np.random.SeedSequence().entropy % (1 << 63)) if rank == 0 else None)
    dup = comm.Dup()
    checked = hpccoll.Communicator(backend="host", check=True)
    comms = (comm, dup, checked)
    rng = np.random.default_rng([seed, 1 << 40])
    reqs = [_SoakRequest(comm, _soak_draw(rng, size, ("Allreduce", "Bcast", "Allgather", "Reduce_scatter_block")))
            for _ in range(4)]
    done, b = 0, 0
    try:
        while done < calls:
            rng = np.random.default_rng([seed, b])
            batch = [_soak_draw(rng, size) for _ in range(int(rng.integers(1, 17)))]
            grouped = bool(rng.integers(4) == 0)
            used = [q for q in reqs if rng.integers(3) == 0]
            for q in used:
                batch.insert(int(rng.integers(len(batch) + 1)), q)
            calls_of = [e.call if isinstance(e, _SoakRequest) else e for e in batch]
            if grouped:  # a group is one communicator's: its calls all go there
                calls_of = [dict(call, on=0) for call in calls_of]
            xs = [[_soak_input(seed, b, i, call, r) for r in range(size)] for i, call in enumerate(calls_of)]

            def issue(e, call, x):
                return e.start(x) if isinstance(e, _SoakRequest) else \
                    _soak_issue(comms[call["on"]], call, x)

            if grouped:
                with comm.group():
                    outs = [issue(e, call, x[rank]) for e, call, x in zip(batch, calls_of, xs)]
            else:
                outs = [issue(e, call, x[rank]) for e, call, x in zip(batch, calls_of, xs)]
            for q in used:
                q.req.Wait()
            for i, (call, x, got) in enumerate(zip(calls_of, xs, outs)):
                what = (f"seed {seed} batch {b} call {i} {call['kind']} {call['dtype']} {call['op'].name} "
                        f"n={call['n']} det={call['det']} in_place={call['in_place']} grouped={grouped} "
                        f"request={isinstance(batch[i], _SoakRequest)} on={('comm', 'dup', 'checked')[call['on']]} "
                        f"rank {rank}")
                _soak_check(got, call, x, rank, size, what)
            done += len(batch)
            b += 1
    finally:
        for q in reqs:
            q.req.Free()
        dup.Free()
        checked.Free()
