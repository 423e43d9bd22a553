"""Check mode: ranks that call a collective with different arguments all get MismatchError.

Without check mode such a mismatch hangs or computes garbage; with it every rank raises
the same error, and the communicator stays usable."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import MismatchError

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture(scope="module")
def checked():
    c = hpccoll.Communicator(backend="host", check=True)
    yield c
    c.Free()


def assert_still_works(c):
    """After a mismatch the communicator still computes the right answer (nothing left in flight)."""
    x = np.full(5, c.rank + 1, dtype=np.int64)
    out = np.empty_like(x)
    c.Allreduce(x, out)
    assert np.all(out == c.size * (c.size + 1) // 2)


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
