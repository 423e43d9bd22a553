"""Check mode: ranks that call a collective with different arguments all get MismatchError.

Without check mode such a mismatch hangs or computes garbage; with it every rank raises
the same error, and the communicator stays usable.  Everything that must agree is compared
(deterministic and algorithm too), and a validation error on one rank is an error on every rank."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import MismatchError

from conftest import assert_still_works

pytestmark = pytest.mark.mpi(min_size=2)
WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def checked():
    c = hpccoll.Communicator(backend="host", check=True)
    yield c
    c.Free()


def assert_raised_on_every_rank(raised: bool):
    flags = MPI.COMM_WORLD.allgather(raised)
    assert all(flags), f"MismatchError raised on ranks {[r for r, f in enumerate(flags) if f]} only"


def test_count_mismatch_raises_on_every_rank(checked):
    n = 1000 if checked.rank == 0 else 1001
    x = np.ones(n, dtype=np.float32)
    with pytest.raises(MismatchError, match=r"Allreduce: ranks disagree on count: rank 0 has 1000, rank 1 has 1001"):
        checked.Allreduce(x, np.empty_like(x))
    assert_raised_on_every_rank(True)
    assert_still_works(checked)


def test_op_mismatch(checked):
    op = hpccoll.SUM if checked.rank == 0 else hpccoll.MAX
    x = np.ones(7)
    with pytest.raises(MismatchError, match="disagree on op: rank 0 has SUM, rank 1 has MAX"):
        checked.Allreduce(x, np.empty_like(x), op=op)
    assert_still_works(checked)


def test_dtype_mismatch(checked):
    x = np.ones(7, dtype=np.float64 if checked.rank == 0 else np.float32)
    with pytest.raises(MismatchError, match="disagree on dtype: rank 0 has float64, rank 1 has float32"):
        checked.Allreduce(x, np.empty_like(x))
    assert_still_works(checked)


def test_root_mismatch(checked):
    buf = np.zeros(7)
    with pytest.raises(MismatchError, match="disagree on root"):
        checked.Bcast(buf, root=0 if checked.rank == 0 else 1)
    assert_still_works(checked)


def test_collective_mismatch_no_hang(checked):
    """Rank 0 calls Allreduce while the others call Bcast: every rank raises, none hangs."""
    x = np.ones(16)
    with pytest.raises(MismatchError, match="disagree on collective: rank 0 has Allreduce, rank 1 has Bcast"):
        if checked.rank == 0:
            checked.Allreduce(x, np.empty_like(x))
        else:
            checked.Bcast(x, root=0)
    assert_still_works(checked)


def test_allgather_vs_reduce_scatter_block(checked):
    n = checked.size * 4
    if checked.rank == 0:
        call = lambda: checked.Allgather(np.ones(4), np.empty(n))  # noqa: E731
    else:
        call = lambda: checked.Reduce_scatter_block(np.ones(n), np.empty(4))  # noqa: E731
    with pytest.raises(MismatchError, match="disagree on collective"):
        call()
    assert_still_works(checked)


def test_in_place_and_not_agree(checked):
    """IN_PLACE on some ranks only is a legal match when the per-rank count agrees."""
    size, rank = checked.size, checked.rank
    out = np.full(4 * size, rank, dtype=np.int32)
    if rank == 0:
        checked.Allgather(hpccoll.IN_PLACE, out)
    else:
        checked.Allgather(np.full(4, rank, dtype=np.int32), out)
    assert np.array_equal(out, np.repeat(np.arange(size, dtype=np.int32), 4))


def test_matching_calls_give_the_same_results(checked, comm):
    rng = np.random.default_rng([7, checked.rank])
    x = rng.standard_normal(1023)
    a, b = np.empty_like(x), np.empty_like(x)
    checked.Allreduce(x, a, deterministic=True)
    comm.Allreduce(x, b, deterministic=True)
    assert np.array_equal(a.view(np.uint64), b.view(np.uint64))


def test_env_variable_turns_check_mode_on(monkeypatch):
    monkeypatch.setenv("HPCCOLL_CHECK", "1")
    with hpccoll.Communicator(backend="host") as c:
        assert c.check
        x = np.ones(1000 if c.rank == 0 else 1001)
        with pytest.raises(MismatchError, match="count"):
            c.Allreduce(x, np.empty_like(x))
        assert_still_works(c)


def test_explicit_argument_beats_env(monkeypatch):
    monkeypatch.setenv("HPCCOLL_CHECK", "1")
    with hpccoll.Communicator(backend="host", check=False) as c:
        assert not c.check
    monkeypatch.setenv("HPCCOLL_CHECK", "0")
    with hpccoll.Communicator(backend="host") as c:
        assert not c.check


def test_dup_keeps_check_mode(checked):
    with checked.Dup() as d:
        assert d.check
        op = hpccoll.MIN if d.rank == 0 else hpccoll.PROD
        with pytest.raises(MismatchError):
            d.Allreduce(np.ones(3), np.empty(3), op=op)


def test_mismatch_inside_a_group_raises_at_the_call_and_issues_nothing(checked):
    """In a group the arguments are compared when each call is queued, so the mismatch raises
    there, on every rank; the block then raises out and nothing queued is issued."""
    r = checked.rank
    done = np.zeros(3)
    with pytest.raises(MismatchError, match="Allreduce: ranks disagree on count"):
        with checked.group():
            checked.Allreduce(np.ones(3), done)  # agreed: queued
            n = 8 + (r == 1)
            checked.Allreduce(np.ones(n), np.empty(n))
    assert not done.any(), "a call queued before the mismatch was issued"
    assert_still_works(checked)


def test_check_mode_compares_deterministic(checked):
    x = np.ones(4)
    with pytest.raises(MismatchError, match="disagree on deterministic: rank 0 has True, rank 1 has False"):
        checked.Allreduce(x, np.empty(4), deterministic=WORLD.rank == 0)
    assert_still_works(checked)


def test_check_mode_compares_algorithm(checked):
    x = np.ones(4)
    with pytest.raises(MismatchError, match="disagree on algorithm: rank 0 has mpi, rank 1 has auto"):
        checked.Allreduce(x, np.empty(4), algorithm="mpi" if WORLD.rank == 0 else "auto")
    assert_still_works(checked)


def test_a_validation_error_on_one_rank_is_an_error_on_every_rank(checked):
    """Rank 1 passes a buffer of the wrong size: it raises its ValueError, every other rank a
    MismatchError naming it; nobody ran the call, so a rank that catches and carries on pairs
    its next call with the others' next call."""
    n = 5 if WORLD.rank != 1 else 4
    try:
        checked.Allreduce(np.ones(5), np.empty(n))
    except MismatchError as exc:
        assert WORLD.rank != 1 and "rank 1 failed before the exchange" in str(exc)
    except ValueError as exc:
        assert WORLD.rank == 1 and "recvbuf has 4 elements, sendbuf 5" in str(exc)
    else:
        pytest.fail("no rank may run the call")
    assert_still_works(checked)
    with pytest.raises(ValueError, match="algorithm='bogus' is unknown|rank 0 rejected"):
        checked.Allreduce(np.ones(2), np.empty(2), algorithm="bogus" if WORLD.rank == 0 else "auto")
    assert_still_works(checked)


def test_alltoallv_counts_are_checked_across_ranks(checked):
    size, rank = WORLD.size, WORLD.rank
    send = [1] * size
    recv = [1] * size
    if rank == 0:
        recv[1] = 2  # rank 1 sends one element to rank 0, which expects two
    with pytest.raises(MismatchError, match="rank 1 sends 1 elements to rank 0, which expects 2"):
        checked.Alltoallv((np.ones(size), send), (np.empty(sum(recv)), recv))
    assert_still_works(checked)
