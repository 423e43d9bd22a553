"""A peer that comes after another rank's CollectiveTimeout (2, 3 and 4 ranks): rank 0 waits
SHORT seconds, the last rank calls LATE seconds after the others, on the host backend's MPI path
(messages above the shared-memory limit) for every collective, and on the hierarchical backend
(4 ranks, simulated nodes of 2).

What must hold: rank 0 raises CollectiveTimeout and then owns its buffers again (it overwrites
them, and nothing the library does afterwards changes them); every rank whose call returns holds
the result of the inputs the ranks passed, the timed-out rank's included (a late peer pairs with
the call rank 0 abandoned, which kept those inputs).  The ranks are coordinated through a
communicator of their own (SIDE), so the job goes on after the communicator under test broke."""
from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import CollectiveTimeout
from hpccoll.backends import host, host_rounds
from hpccoll.backends.host import SHM_SLOT_BYTES
from hpccoll.ops import MAX, SUM, reduce_in_rank_order

pytestmark = pytest.mark.mpi(min_size=2)

WORLD = MPI.COMM_WORLD
SIDE = WORLD.Dup()
SHORT = 0.3        # rank 0's timeout (s)
LATE = 1.0         # how long the last rank sleeps before its call (s)
N = 8192           # float64 elements of a block: 64 KiB, above the shared-memory limit
assert N * 8 > SHM_SLOT_BYTES
RNG = np.random.default_rng()  # fresh data in every run


def _communicator(**kw) -> hpccoll.Communicator:
    return hpccoll.Communicator(backend="host", check=False, timeout=SHORT if WORLD.rank == 0 else 20.0, **kw)


def _fresh(n: int) -> np.ndarray:
    return RNG.standard_normal(n)


def _late_call(call, send: np.ndarray, recv: np.ndarray, expected, exact: bool = False, done=None,
               delay: bool = True) -> list[bool]:
    """Run `call()` (this rank's call, bound to `send` and `recv`) with the last rank LATE s behind
    (delay=False: the test delays it itself); every rank's `timed out` flag, after checking what
    must hold on this rank.  expected: what recv holds on a rank whose call returns (None: nothing
    to check); exact: bit for bit; done(a): the part of recv (or of expected) that the rounds
    every rank completed wrote, right on every rank but rank 0 whether or not its call returned."""
    SIDE.Barrier()
    if delay and WORLD.rank == WORLD.size - 1:
        time.sleep(LATE)
    try:
        call()
        timed_out = False
    except CollectiveTimeout:
        timed_out = True
        if done is not None and WORLD.rank != 0:
            got, want, what = done(recv), done(expected), f"rank {WORLD.rank}: a round completed before the timeout"
            if exact:
                assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), f"{what} has a wrong result"
            else:
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"{what} has a wrong result")
        for a in (send, recv):  # the caller's memory again: write other values
            a[...] = _fresh(a.size).reshape(a.shape)
        left = recv.copy()
    SIDE.Barrier()  # every rank's call has returned or raised
    for _ in range(5):  # time, in MPI, for the call rank 0 abandoned to complete
        time.sleep(0.02)
        SIDE.Barrier()
    if timed_out:
        assert np.array_equal(recv.view(np.uint8), left.view(np.uint8)), \
            f"rank {WORLD.rank}: the receive buffer changed after CollectiveTimeout"
    elif expected is not None:
        if exact:
            assert np.array_equal(recv.view(np.uint8), expected.view(np.uint8)), f"rank {WORLD.rank}: wrong result"
        else:
            np.testing.assert_allclose(recv, expected, rtol=1e-12, atol=1e-12,
                                       err_msg=f"rank {WORLD.rank}: wrong result")
    return SIDE.allgather(timed_out)


def _everyone(a: np.ndarray) -> list[np.ndarray]:
    return SIDE.allgather(a.copy())


@pytest.mark.parametrize("variant", ["sum", "sum_in_place", "deterministic", "max"])
def test_allreduce(variant):
    c = _communicator()
    x, out = _fresh(N), np.empty(N)
    xs = _everyone(x)
    op, det = (MAX, False) if variant == "max" else (SUM, variant == "deterministic")
    exact = variant in ("deterministic", "max")
    expected = reduce_in_rank_order(op, np.stack(xs))
    if variant == "sum_in_place":
        out[...] = x
        timed = _late_call(lambda: c.Allreduce(hpccoll.IN_PLACE, out), out, out, expected)
    else:
        timed = _late_call(lambda: c.Allreduce(x, out, op=op, deterministic=det), x, out, expected, exact)
    assert timed[0] and not any(timed[1:])
    c.Free()


@pytest.mark.parametrize("variant", ["sum", "sum_in_place", "deterministic", "max"])
def test_allreduce_through_the_prepared_plan(variant):
    """Repeats of one call run the prepared plan (host_rounds.AllreducePlan): its scratch is the memory
    MPI sees."""
    c = _communicator()
    op, det = (MAX, False) if variant == "max" else (SUM, variant == "deterministic")
    in_place = variant == "sum_in_place"
    x, out = _fresh(N), np.empty(N)
    send = hpccoll.IN_PLACE if in_place else x
    for _ in range(3):  # the first call, the fast path, then the plan
        x[...] = _fresh(N)
        out[...] = x
        xs = _everyone(x)
        c.Allreduce(send, out, op=op, deterministic=det)
        np.testing.assert_allclose(out, reduce_in_rank_order(op, np.stack(xs)), rtol=1e-12, atol=1e-12)
    assert type(c._fast["Allreduce"].plan).__name__ == "AllreducePlan"
    x[...] = _fresh(N)
    out[...] = x
    expected = reduce_in_rank_order(op, np.stack(_everyone(x)))
    timed = _late_call(lambda: c.Allreduce(send, out, op=op, deterministic=det), out if in_place else x, out,
                       expected, exact=variant != "sum" and not in_place)
    assert timed[0] and not any(timed[1:])
    c.Free()


@pytest.mark.parametrize("root", ["timed_out", "late"])
def test_bcast(root):
    """1 MiB: the late rank gets rank 0's data as it was at the call (root 0), or rank 0's buffer
    keeps what it wrote after the timeout (the late rank the root).  (Root 0 of 4 ranks or more
    may finish without the late rank: MPI's tree sends it through another rank.)"""
    c = _communicator()
    r = 0 if root == "timed_out" else WORLD.size - 1
    buf = _fresh(1 << 17)
    expected = _everyone(buf)[r]
    timed = _late_call(lambda: c.Bcast(buf, root=r), buf, buf, expected, exact=True)
    assert timed[0] or (r == 0 and WORLD.size > 3)
    c.Free()


def test_allgather():
    c = _communicator()
    x, out = _fresh(N), np.empty(N * WORLD.size)
    timed = _late_call(lambda: c.Allgather(x, out), x, out, np.concatenate(_everyone(x)), exact=True)
    assert timed[0] and not any(timed[1:])
    c.Free()


def test_reduce_scatter_block():
    c = _communicator()
    x, out = _fresh(N * WORLD.size), np.empty(N)
    r = WORLD.rank
    expected = reduce_in_rank_order(SUM, np.stack(_everyone(x)))[r * N:(r + 1) * N]
    timed = _late_call(lambda: c.Reduce_scatter_block(x, out, op=SUM), x, out, expected, exact=True)
    assert timed[0] and not any(timed[1:])
    c.Free()


def test_alltoall():
    c = _communicator()
    x, out = _fresh(N * WORLD.size), np.empty(N * WORLD.size)
    r = WORLD.rank
    expected = np.concatenate([xj[r * N:(r + 1) * N] for xj in _everyone(x)])
    timed = _late_call(lambda: c.Alltoall(x, out), x, out, expected, exact=True)
    assert timed[0] and not any(timed[1:])
    c.Free()


def test_alltoallv():
    """Rank i sends N + i elements to every rank."""
    c = _communicator()
    size, r = WORLD.size, WORLD.rank
    x = _fresh((N + r) * size)
    recv_counts = [N + j for j in range(size)]
    out = np.empty(sum(recv_counts))
    xs = _everyone(x)
    expected = np.concatenate([xs[j][r * (N + j):(r + 1) * (N + j)] for j in range(size)])
    timed = _late_call(lambda: c.Alltoallv((x, [N + r] * size), (out, recv_counts)), x, out, expected, exact=True)
    assert timed[0] and not any(timed[1:])
    c.Free()


def test_barrier():
    c = _communicator()
    timed = _late_call(c.Barrier, np.empty(0), np.empty(0), None)
    assert timed[0] and not any(timed[1:])
    c.Free()


# -- the hierarchical backend: 4 ranks as 2 simulated nodes of 2 ---------------------------------

def _hierarchical(monkeypatch, rsag_bytes: int = 1 << 30) -> hpccoll.Communicator:
    if WORLD.size != 4:
        pytest.skip("2 simulated nodes of 2 ranks: 4 ranks")
    monkeypatch.setenv("HPCCOLL_NODE_SIZE", "2")
    monkeypatch.setenv("HPCCOLL_HIER_RSAG_BYTES", str(rsag_bytes))
    c = _communicator()
    assert c.backend.startswith("hier")
    return c


def _then_unusable(c, send: np.ndarray, recv: np.ndarray, call) -> None:
    """On the rank that timed out, the next call raises before it touches a buffer."""
    if WORLD.rank == 0:
        left = recv.copy()
        with pytest.raises(CollectiveTimeout, match="timed out earlier"):
            call()
        assert np.array_equal(recv, left)


@pytest.mark.parametrize("variant", ["ar", "rsag"])
@pytest.mark.parametrize("det", [False, True], ids=["default", "deterministic"])
def test_hierarchical_allreduce(monkeypatch, variant, det):
    c = _hierarchical(monkeypatch, 0 if variant == "rsag" else 1 << 30)
    x, out = _fresh(N + 1), np.empty(N + 1)  # (odd: rsag pads its shards)
    xs = _everyone(x)
    expected = reduce_in_rank_order(SUM, [reduce_in_rank_order(SUM, [xs[r] for r in row]) for row in ((0, 1), (2, 3))])
    call = lambda: c.Allreduce(x, out, op=SUM, deterministic=det)  # noqa: E731
    timed = _late_call(call, x, out, expected, exact=det)
    assert timed[0]
    _then_unusable(c, x, out, call)
    c.Free()


def test_hierarchical_bcast(monkeypatch):
    """Root 3, the late rank: rank 0 times out in its node's phase."""
    c = _hierarchical(monkeypatch)
    buf = _fresh(1 << 17)
    expected = _everyone(buf)[3]
    timed = _late_call(lambda: c.Bcast(buf, root=3), buf, buf, expected, exact=True)
    assert timed[0]
    c.Free()


def test_hierarchical_allgather(monkeypatch):
    c = _hierarchical(monkeypatch)
    x, out = _fresh(N), np.empty(4 * N)
    timed = _late_call(lambda: c.Allgather(x, out), x, out, np.concatenate(_everyone(x)), exact=True)
    assert timed[0]
    c.Free()


def test_hierarchical_reduce_scatter_block(monkeypatch):
    c = _hierarchical(monkeypatch)
    x, out = _fresh(4 * N), np.empty(N)
    r = WORLD.rank
    xs = _everyone(x)
    full = reduce_in_rank_order(SUM, [reduce_in_rank_order(SUM, [xs[q] for q in row]) for row in ((0, 1), (2, 3))])
    timed = _late_call(lambda: c.Reduce_scatter_block(x, out, op=SUM), x, out, full[r * N:(r + 1) * N])
    assert timed[0]
    c.Free()


# -- calls of several rounds (host_rounds.STAGE_BYTES per side) -----------------------------------------
# Rank 0 times out in round 0 (the late rank comes after), or in round 1 (the late rank stalls
# between its rounds 0 and 1).  The late rank pairs with the round rank 0 abandoned, with the
# input it had, then waits for rank 0's next round, which never comes: every rank raises (none
# returns a partial result), and the rounds completed before hold the right values.

OTHERS = 2.5  # the timeout of the ranks but 0 here: longer than LATE, so that they pair with it


def _block_elements() -> int:
    """float64 elements of a block: 3.5 slices of a per-rank-block call (several rounds)."""
    return int(3.5 * max(host_rounds.STAGE_BYTES // WORLD.size, host_rounds.MIN_BLOCK_SLICE_BYTES)) // 8


def _stall_after_round_0(c) -> None:
    """On the late rank, the call's first completed round is followed by LATE s of sleep."""
    if WORLD.rank != WORLD.size - 1:
        return
    b = c._host
    complete, calls = b._complete, []

    def stalling(*args, **kw):
        complete(*args, **kw)
        if not calls:
            calls.append(1)
            time.sleep(LATE)
    b._complete = stalling


def _rounds_case(collective: str, stall: bool):
    """The communicator, the call, its send and receive buffers, the expected result, whether
    bit for bit, and the part of the result the rounds before rank 0's timeout wrote."""
    c = hpccoll.Communicator(backend="host", check=False, timeout=SHORT if WORLD.rank == 0 else OTHERS)
    size, r = WORLD.size, WORLD.rank
    k = _block_elements()
    if collective.startswith("allreduce"):
        n = int(3.5 * host_rounds.STAGE_BYTES) // 8
        x, out = _fresh(n), np.empty(n)
        op, det = (MAX, False) if collective == "allreduce_max" else (SUM, collective == "allreduce_det")
        expected = reduce_in_rank_order(op, np.stack(_everyone(x)))
        s = host_rounds._block_slice(size, 8, n) if det else host_rounds.STAGE_BYTES // 8  # a round's slice
        call = lambda: c.Allreduce(x, out, op=op, deterministic=det)  # noqa: E731
        done = lambda a: a[:s * (1 + stall)]  # noqa: E731
        exact = det or op is MAX
    elif collective == "allgather":
        x, out = _fresh(k), np.empty(k * size)
        expected = np.concatenate(_everyone(x))
        s = host_rounds._block_slice(size, 8, k)
        call = lambda: c.Allgather(x, out)  # noqa: E731
        done = lambda a: a.reshape(size, k)[:, :s * (1 + stall)]  # noqa: E731
        exact = True
    elif collective == "alltoall":
        x, out = _fresh(k * size), np.empty(k * size)
        expected = np.concatenate([xj[r * k:(r + 1) * k] for xj in _everyone(x)])
        s = host_rounds._block_slice(size, 8, k)
        call = lambda: c.Alltoall(x, out)  # noqa: E731
        done = lambda a: a.reshape(size, k)[:, :s * (1 + stall)]  # noqa: E731
        exact = True
    elif collective == "reduce_scatter_block":
        x, out = _fresh(k * size), np.empty(k)
        expected = reduce_in_rank_order(SUM, np.stack(_everyone(x)))[r * k:(r + 1) * k]
        s = host_rounds._block_slice(size, 8, k)
        call = lambda: c.Reduce_scatter_block(x, out, op=SUM)  # noqa: E731
        done = lambda a: a[:s * (1 + stall)]  # noqa: E731
        exact = True
    else:  # alltoallv: rank i sends k + i elements to every rank
        x = _fresh((k + r) * size)
        recv_counts = [k + j for j in range(size)]
        out = np.empty(sum(recv_counts))
        xs = _everyone(x)
        expected = np.concatenate([xs[j][r * (k + j):(r + 1) * (k + j)] for j in range(size)])
        s = host_rounds._block_slice(size, 8, k + size)
        starts = np.cumsum([0] + recv_counts)
        call = lambda: c.Alltoallv((x, [k + r] * size), (out, recv_counts))  # noqa: E731
        # (a rank's block to itself is copied after the exchange: not among the done parts)
        done = lambda a: np.concatenate([a[starts[j]:starts[j] + s * (1 + stall)]  # noqa: E731
                                         for j in range(size) if j != r])
        exact = True
    return c, call, x, out, expected, exact, done


ROUNDS_CASES = ["allreduce_sum", "allreduce_det", "allreduce_max", "allgather", "alltoall",
                "reduce_scatter_block", "alltoallv"]


@pytest.mark.parametrize("stall", [False, True], ids=["late", "stalls_between_rounds"])
@pytest.mark.parametrize("collective", ROUNDS_CASES)
def test_several_rounds(collective, stall):
    c, call, x, out, expected, exact, done = _rounds_case(collective, stall)
    if stall:
        _stall_after_round_0(c)
    timed = _late_call(call, x, out, expected, exact, done=done, delay=not stall)
    assert all(timed), f"a rank returned from a call rank 0 left before its end: {timed}"
    c.Free()


@pytest.mark.parametrize("stall", [False, True], ids=["late", "stalls_between_rounds"])
def test_several_rounds_bcast(stall):
    """Root 0 times out; a rank that returns (MPI's tree may serve it without the late rank) has
    root 0's data."""
    c = hpccoll.Communicator(backend="host", check=False, timeout=SHORT if WORLD.rank == 0 else OTHERS)
    buf = _fresh(int(3.5 * host_rounds.STAGE_BYTES) // 8)
    expected = _everyone(buf)[0]
    if stall:
        _stall_after_round_0(c)
    timed = _late_call(lambda: c.Bcast(buf, root=0), buf, buf, expected, exact=True, delay=not stall)
    assert timed[0] or WORLD.size > 3
    c.Free()
