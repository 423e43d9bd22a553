"""The host backend's MPI path stages in rounds: a collective of host buffers far larger than
host_rounds.STAGE_BYTES allocates at most a few times STAGE_BYTES besides the caller's buffers (the
per-rank-block calls: P slices of max(STAGE_BYTES / P, MIN_BLOCK_SLICE_BYTES)), whatever its
size, and its result is the unsliced one.  Measured as tracemalloc's peak around the call."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll.backends import host_rounds
from hpccoll.ops import MAX, SUM, reduce_in_rank_order

pytestmark = pytest.mark.mpi(min_size=2)

WORLD = MPI.COMM_WORLD
BIG = 16 << 20  # bytes of a rank's input: 16 x STAGE_BYTES, above the shared-memory limit
SLACK = 64 << 10  # Python objects, MPI requests, small arrays


def _bound() -> int:
    """Extra bytes a call may allocate: three per-side budgets (input and result staging, the
    scratch of the NaN masks or of the reduction of one slice)."""
    return 3 * max(host_rounds.STAGE_BYTES, WORLD.size * host_rounds.MIN_BLOCK_SLICE_BYTES) + SLACK


def _peak(call) -> int:
    """Bytes allocated at the peak of call() beyond what was allocated before."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        call()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def comm():
    c = hpccoll.Communicator(backend="host", check=False)
    x = np.ones(8)  # lazy imports and first-call objects, outside the measurements
    c.Allreduce(x, np.empty(8))
    c.Allgather(x, np.empty(8 * c.size))
    c.Alltoall(np.ones(8 * c.size), np.empty(8 * c.size))
    yield c
    c.Free()


def _check(name: str, call) -> None:
    peak = _peak(call)
    assert peak <= _bound(), (f"{name}: {peak / 2**20:.2f} MiB allocated for a {BIG / 2**20:.0f} MiB call "
                              f"(bound {_bound() / 2**20:.2f} MiB)")


@pytest.mark.parametrize("variant", ["mpi", "rank_order", "minmax"])
def test_allreduce(comm, variant):
    n = BIG // 8
    x, out = np.random.default_rng(WORLD.rank).standard_normal(n), np.empty(n)
    op, det = (MAX, False) if variant == "minmax" else (SUM, variant == "rank_order")
    _check(f"Allreduce ({variant})", lambda: comm.Allreduce(x, out, op=op, deterministic=det))
    want = reduce_in_rank_order(op, np.stack(WORLD.allgather(x)))
    if det or op is MAX:
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8))
    else:
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    # the prepared plan of the repeats: its staging allocated once, as small
    _check(f"Allreduce ({variant}, repeated)", lambda: [comm.Allreduce(x, out, op=op, deterministic=det)
                                                        for _ in range(3)])


def test_allgather(comm):
    x = np.full(BIG // 8 // comm.size, float(comm.rank))
    out = np.empty(x.size * comm.size)
    _check("Allgather", lambda: comm.Allgather(x, out))
    assert np.array_equal(out, np.repeat(np.arange(comm.size, dtype=float), x.size))


def test_alltoall_and_reduce_scatter_block(comm):
    k = BIG // 8 // comm.size
    x, out = np.arange(k * comm.size, dtype=float) + comm.rank, np.empty(k * comm.size)
    _check("Alltoall", lambda: comm.Alltoall(x, out))
    assert np.array_equal(out, np.concatenate([x[comm.rank * k:(comm.rank + 1) * k] - comm.rank + j
                                               for j in range(comm.size)]))
    part = np.empty(k)
    _check("Reduce_scatter_block", lambda: comm.Reduce_scatter_block(x, part, op=SUM))
    want = reduce_in_rank_order(SUM, np.stack(WORLD.allgather(x)))[comm.rank * k:(comm.rank + 1) * k]
    assert np.array_equal(part, want)


def test_alltoallv(comm):
    """Rank i sends k + 1000 i elements to every rank (counts differ by pair)."""
    size, r = comm.size, comm.rank
    k = BIG // 8 // size - 1000 * size
    x = np.arange((k + 1000 * r) * size, dtype=float) + 1e9 * r
    recv_counts = [k + 1000 * j for j in range(size)]
    out = np.empty(sum(recv_counts))
    _check("Alltoallv", lambda: comm.Alltoallv((x, [k + 1000 * r] * size), (out, recv_counts)))
    xs = WORLD.allgather(x)
    want = np.concatenate([xs[j][r * (k + 1000 * j):(r + 1) * (k + 1000 * j)] for j in range(size)])
    assert np.array_equal(out, want)


def test_bcast(comm):
    buf = np.full(BIG // 8, float(comm.rank))
    _check("Bcast", lambda: comm.Bcast(buf, root=comm.size - 1))
    assert np.all(buf == comm.size - 1)


def test_alltoallv_of_skewed_counts(comm):
    """One pair of many rounds (rank 0 to rank 1), every other pair of a few elements: the rounds
    of a pair follow from its count alone."""
    size, r = comm.size, comm.rank
    count = [[(BIG // 8 if (i, j) == (0, 1) else 3 + i) for j in range(size)] for i in range(size)]
    x = np.arange(sum(count[r]), dtype=float) + 1e9 * r
    recv_counts = [count[i][r] for i in range(size)]
    out = np.empty(sum(recv_counts))
    _check("Alltoallv (skewed)", lambda: comm.Alltoallv((x, count[r]), (out, recv_counts)))
    xs = WORLD.allgather(x)
    want = np.concatenate([xs[i][sum(count[i][:r]):sum(count[i][:r + 1])] for i in range(size)])
    assert np.array_equal(out, want)
