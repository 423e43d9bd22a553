"""Check mode: ranks that call a collective with different arguments all get MismatchError.

Without check mode such a mismatch hangs or computes garbage; with it every rank raises
the same error, and the communicator stays usable.  Everything that must agree is compared
(deterministic and algorithm too), and a validation error on one rank is an error on every rank."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import HpccollError, MismatchError

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


# -- one rank fails before the exchange: the ranks stay paired ----------------------------------
class Boom(Exception):
    """What a user type's method raises (no exception class hpccoll knows)."""


class RaisingOp:
    """An op whose comparison raises (as_op compares it with mpi4py's ops)."""

    def __eq__(self, other):
        raise Boom("RaisingOp.__eq__")

    __hash__ = object.__hash__


class RaisingArray(np.ndarray):
    """A numpy subclass whose view() raises (validation takes a plain view of a subclass)."""

    def view(self, *args, **kwargs):
        raise Boom("RaisingArray.view")


@pytest.fixture(scope="module")
def quick():
    """Check mode with a short timeout: a call that lost its pairing fails fast instead of hanging."""
    c = hpccoll.Communicator(backend="host", check=True, timeout=5.0)
    yield c
    c.Free()


def assert_computes(c):
    """A correct Allreduce of fresh random integers gives the exact sum on every rank."""
    rng = np.random.default_rng()
    x = rng.integers(-1000, 1000, 37)
    out = np.empty_like(x)
    c.Allreduce(x, out)
    assert np.array_equal(out, np.sum(WORLD.allgather(x), axis=0))


def _allreduce(c, **kw):
    c.Allreduce(np.ones(6), np.empty(6), **kw)


def _group_barrier(c, bad):
    if bad:
        with c.group():
            c.Barrier()
    else:
        c.Barrier()


def _start_twice(c, bad):
    req = c.Allreduce_init(np.ones(4), np.empty(4))
    try:
        req.Start()
        if not bad:
            req.Wait()
        req.Start()  # the failing rank: Start on an active request
    finally:
        req.Wait()
        req.Free()


LOCAL_FAILURES = {
    # name: (call(c, bad), the error the failing rank raises, a regex of its message)
    "deterministic='yes'": (lambda c, bad: _allreduce(c, deterministic="yes" if bad else False),
                            TypeError, "Allreduce: deterministic='yes': pass True or False"),
    "stream=object()": (lambda c, bad: _allreduce(c, stream=object() if bad else None),
                        TypeError, "Allreduce: stream=<object"),
    "op whose __eq__ raises": (lambda c, bad: _allreduce(c, op=RaisingOp() if bad else hpccoll.SUM),
                               Boom, "RaisingOp.__eq__"),
    "array subclass whose view raises": (
        lambda c, bad: c.Allreduce(np.ones(6).view(RaisingArray) if bad else np.ones(6), np.empty(6)),
        Boom, "RaisingArray.view"),
    "root out of range": (lambda c, bad: c.Bcast(np.zeros(3), root=c.size if bad else 0),
                          ValueError, "Bcast: root=.* is not a rank"),
    "dtypes differ on one rank": (lambda c, bad: c.Allgather(np.ones(2, np.float32 if bad else np.float64),
                                                             np.empty(2 * c.size)),
                                  TypeError, "Allgather: sendbuf is float32 but recvbuf is float64"),
    "Alltoallv counts": (lambda c, bad: c.Alltoallv((np.ones(c.size), [1] * c.size),
                                                    (np.empty(c.size), [1] * (c.size + bad))),
                         ValueError, "Alltoallv: recvbuf's counts has"),
    "Allreduce_init deterministic": (lambda c, bad: c.Allreduce_init(np.ones(2), np.empty(2),
                                                                     deterministic=2 if bad else True).Free(),
                                     TypeError, "Allreduce: deterministic=2"),
    "Start on an active request": (_start_twice, HpccollError, "Start on an active request"),
    "Barrier inside a group": (_group_barrier, HpccollError, "Barrier: not allowed inside a group"),
    "Split color": (lambda c, bad: c.Split("red" if bad else 0).Free(), TypeError, "Split: color='red'"),
}


@pytest.mark.parametrize("how", list(LOCAL_FAILURES))
def test_a_local_failure_on_one_rank_keeps_the_ranks_paired(quick, how):
    """The last rank fails before the exchange, the others call correctly: it raises its own
    error, every other rank a MismatchError naming it, and the next call works everywhere."""
    call, error, message = LOCAL_FAILURES[how]
    bad = quick.rank == quick.size - 1
    if bad:
        with pytest.raises(error, match=message):
            call(quick, True)
    else:
        with pytest.raises(MismatchError, match=f"rank {quick.size - 1} failed before the exchange "
                                                f"\\({error.__name__}: .*{message}"):
            call(quick, False)
    assert_computes(quick)
    assert_computes(quick)


# -- calls without buffers are compared too: never a hang ----------------------------------------
MISMATCHES = {
    "Barrier vs Allreduce": (lambda c: c.Barrier(), lambda c: _allreduce(c), "Barrier", "Allreduce"),
    "Dup vs Allreduce": (lambda c: c.Dup().Free(), lambda c: _allreduce(c), "Dup", "Allreduce"),
    "Split vs Barrier": (lambda c: c.Split(0).Free(), lambda c: c.Barrier(), "Split", "Barrier"),
    "Free vs Allreduce": (lambda c: c.Free(), lambda c: _allreduce(c), "Free", "Allreduce"),
    "Dup vs Split": (lambda c: c.Dup().Free(), lambda c: c.Split(1).Free(), "Dup", "Split"),
    "Allreduce_init vs Allreduce": (lambda c: c.Allreduce_init(np.ones(6), np.empty(6)).Free(),
                                    lambda c: _allreduce(c), "Allreduce_init", "Allreduce"),
}


@pytest.mark.parametrize("how", list(MISMATCHES))
def test_calls_without_buffers_are_compared(quick, how):
    """Rank 0 makes one call, the others another: MismatchError on every rank, well before the
    timeout, and the communicator still works (Free, disagreed, freed nothing)."""
    first, other, a, b = MISMATCHES[how]
    rest = ", ".join(f"rank {r} has {b}" for r in range(1, quick.size))
    t0 = MPI.Wtime()
    with pytest.raises(MismatchError, match=f"ranks disagree on collective: rank 0 has {a}, {rest}"):
        (first if quick.rank == 0 else other)(quick)
    assert MPI.Wtime() - t0 < quick.timeout
    assert_computes(quick)


def test_group_on_some_ranks_only_is_a_mismatch(quick):
    """A call queued in a group on rank 0 and issued at once on the others would pair with
    whatever rank 0 issues later: compared, refused on every rank, nothing issued."""
    with pytest.raises(MismatchError, match="ranks disagree on group: rank 0 has queued in comm.group"):
        if quick.rank == 0:
            with quick.group():
                _allreduce(quick)
        else:
            _allreduce(quick)
    assert_computes(quick)


def test_split_with_different_colors_and_keys_is_agreed(quick):
    """Colors and keys differ between ranks legitimately: only the call is compared."""
    sub = quick.Split(quick.rank % 2, key=-quick.rank)
    try:
        assert sub.check and sub.size == len(range(quick.rank % 2, quick.size, 2))
        assert_computes_on(sub, [r for r in range(quick.size) if r % 2 == quick.rank % 2])
    finally:
        sub.Free()
    sub = quick.Split(MPI.UNDEFINED if quick.rank == 0 else 0)
    if quick.rank == 0:
        assert sub is None
    else:
        assert_computes_on(sub, range(1, quick.size))
        sub.Free()
    assert_computes(quick)


def assert_computes_on(c, world_ranks):
    x = np.full(3, WORLD.rank + 1)
    out = np.empty_like(x)
    c.Allreduce(x, out)
    assert np.all(out == sum(r + 1 for r in world_ranks))


def test_agreed_free_frees_on_every_rank():
    c = hpccoll.Communicator(backend="host", check=True, timeout=5.0)
    c.Free()
    with pytest.raises(HpccollError, match="Allreduce: this communicator was freed"):
        _allreduce(c)
    c.Free()  # a second Free is a no-op: nothing to compare
