"""No silent wrong answers, no hangs, on the host backend (2 and 3 ranks):

- one answer on every rank for every op, NaNs included, by default and deterministic;
- the repeated call's fast path follows fresh data, every op, dtype, policy, in place or not;
- a freed communicator raises HpccollError for everything; overlapping, mis-ordered,
  non-native and unaligned buffers are refused with errors that name the call and the fix;
- Alltoall and Alltoallv against the exchange computed from every rank's data."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import HpccollError
from hpccoll.ops import BFLOAT16, OPS, np_dtype, reduce_in_rank_order

from conftest import assert_still_works

pytestmark = pytest.mark.mpi(min_size=2)
WORLD = MPI.COMM_WORLD
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
PAYLOADS = {2: [0x7E01, 0xFE00, 0x7C01, 0xFFFA], 4: [0x7FC00001, 0xFFC00000, 0x7F800001, 0xFFFAFFFA],
            8: [0x7FF8000000000001, 0xFFF8000000000000, 0x7FF0000000000001, 0xFFFAFFFAFFFAFFFA]}
FLOATS = ["float64", "float32", "float16"] + (["bfloat16"] if BFLOAT16 is not None else [])
DTYPES = FLOATS + ["int32", "int64"]


def _bits(a):
    return np.ascontiguousarray(a).view(UINT.get(a.itemsize, np.uint8))


def _same_everywhere(a, what):
    digests = WORLD.allgather(hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())
    assert len(set(digests)) == 1, f"{what}: ranks hold different bits"


def _data(rng, dtype, n, op, nans=True):
    dt = np_dtype(dtype)
    if dtype.startswith("int"):
        return rng.integers(-3 if op == "PROD" else -1000, 3 if op == "PROD" else 1000, n).astype(dt)
    x = (1 + 0.01 * rng.standard_normal(n) if op == "PROD" else rng.standard_normal(n)).astype(dt)
    x[rng.integers(0, n, max(1, n // 16))] = -0.0
    x[rng.integers(0, n, max(1, n // 16))] = 0.0
    if nans:
        hit = rng.integers(0, n, max(1, n // 10))
        x.view(UINT[dt.itemsize])[hit] = rng.choice(np.array(PAYLOADS[dt.itemsize], UINT[dt.itemsize]), hit.size)
    return x


@pytest.mark.parametrize("det", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_one_answer_on_every_rank_nans_included(comm, dtype, op, det):
    """NaNs of any payload in the inputs: every rank gets the same bits (canonical NaNs), and
    where bits are promised (deterministic, MAX/MIN, integers) they are the reference's."""
    for it, n in enumerate((1, 7, 1000)):
        rng = np.random.default_rng([WORLD.rank, it, hash((dtype, op, det)) & 0xFFFF])
        x = _data(rng, dtype, n, op)
        out = np.empty_like(x)
        comm.Allreduce(x, out, op=OPS[op], deterministic=det)
        ref = reduce_in_rank_order(OPS[op], WORLD.allgather(x))
        _same_everywhere(out, f"{dtype} {op} det={det} n={n}")
        if det or op in ("MAX", "MIN") or dtype.startswith("int"):
            assert np.array_equal(_bits(out), _bits(ref)), f"{dtype} {op} det={det} n={n}: not the reference's bits"
        else:
            nan = np.isnan(ref.astype(np.float64))
            assert np.array_equal(_bits(out)[nan], _bits(ref)[nan]), "NaNs not canonical"
            np.testing.assert_allclose(out[~nan].astype(np.float64), ref[~nan].astype(np.float64), rtol=1e-2, atol=1e-2)


def test_min_max_of_nan_and_numbers_is_nan_everywhere(comm):
    """The case that gave 3.0 on two ranks and NaN on the third: MIN of {NaN, 2, 3}."""
    for op in (hpccoll.MIN, hpccoll.MAX):
        for det in (False, True):
            x = np.array([[np.nan, 2.0, 3.0][WORLD.rank % 3]])
            out = np.empty(1)
            comm.Allreduce(x, out, op=op, deterministic=det)
            assert np.isnan(out[0]) == any(np.isnan(v[0]) for v in WORLD.allgather(x))
            _same_everywhere(out, f"{op} det={det}")


@pytest.mark.parametrize("det", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in_place"])
def test_repeated_calls_follow_fresh_data(comm, det, in_place):
    """The same arrays called again skip validation (the fast path, then a prepared call):
    every call still sees the data written since, for every op and dtype."""
    for dtype in DTYPES:
        for op in OPS:
            n = 33
            x = np.empty(n, np_dtype(dtype))
            out = np.empty_like(x)
            for it in range(5):
                rng = np.random.default_rng([WORLD.rank, it, hash((dtype, op)) & 0xFFF])
                x[...] = _data(rng, dtype, n, op, nans=it % 2 == 1)
                ref = reduce_in_rank_order(OPS[op], WORLD.allgather(x))
                if in_place:
                    out[...] = x
                    comm.Allreduce(hpccoll.IN_PLACE, out, op=OPS[op], deterministic=det)
                else:
                    comm.Allreduce(x, out, op=OPS[op], deterministic=det)
                what = f"{dtype} {op} det={det} in_place={in_place} call {it}"
                _same_everywhere(out, what)
                if det or op in ("MAX", "MIN") or dtype.startswith("int"):
                    assert np.array_equal(_bits(out), _bits(ref)), what
                else:
                    np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64), rtol=1e-2,
                                               atol=1e-2, equal_nan=True, err_msg=what)


@pytest.mark.parametrize("det", [False, True], ids=["default", "deterministic"])
def test_overflow_never_raises_under_the_callers_seterr(comm, det):
    """np.seterr(all='raise') in the caller does not make a reduction raise (on the first call
    or on the prepared repeats): overflow gives inf on every rank, as MPI's reduction does."""
    x = np.full(5, np.finfo(np.float32).max, dtype=np.float32)
    out = np.empty_like(x)
    with np.errstate(all="raise"):
        for op in (hpccoll.SUM, hpccoll.PROD):
            for _ in range(3):  # the first call, the fast path, the prepared call
                comm.Allreduce(x, out, op=op, deterministic=det)
                assert np.isposinf(out).all()
                _same_everywhere(out, f"{op} det={det}")


def test_repeat_with_a_reassigned_dtype_is_validated_again(comm):
    x = np.ones(8, np.float64)
    out = np.empty(8, np.float64)
    comm.Allreduce(x, out)
    comm.Allreduce(x, out)
    out.dtype = np.int64  # the same memory, another element type
    with pytest.raises(TypeError, match="Allreduce: sendbuf is float64 but recvbuf is int64"):
        comm.Allreduce(x, out)


# -- a freed communicator, bad buffers -------------------------------------------------------------
def test_a_freed_communicator_raises_hpccoll_error_for_everything():
    c = hpccoll.Communicator(backend="host")
    c.Free()
    c.Free()  # a second Free is a no-op
    assert "freed" in repr(c)
    for what, fn in [("Barrier", c.Barrier), ("Dup", c.Dup), ("Split", lambda: c.Split(0)),
                     ("rank", lambda: c.rank), ("size", lambda: c.size), ("Get_rank", c.Get_rank),
                     ("Allreduce", lambda: c.Allreduce(np.ones(2), np.empty(2))),
                     ("Bcast", lambda: c.Bcast(np.ones(2))), ("synchronize", c.synchronize),
                     ("group", lambda: c.group().__enter__()),
                     ("Allreduce_init", lambda: c.Allreduce_init(np.ones(2), np.empty(2)))]:
        with pytest.raises(HpccollError, match=f"{what}: this communicator was freed"):
            fn()


def test_overlapping_buffers_are_refused(comm):
    x = np.arange(20.0)
    with pytest.raises(ValueError, match="Allreduce: sendbuf and recvbuf overlap in memory: pass hpccoll.IN_PLACE"):
        comm.Allreduce(x[:10], x[5:15])
    with pytest.raises(ValueError, match="overlap"):
        comm.Allreduce(x, x)
    with pytest.raises(ValueError, match="Allgather: sendbuf and recvbuf overlap"):
        comm.Allgather(x[:2], x[:2 * WORLD.size])
    comm.Allreduce(x[:10], x[10:])  # adjacent is fine
    assert_still_works(comm)


def test_c_and_f_order_are_not_paired(comm):
    a = np.ones((3, 4))
    with pytest.raises(ValueError, match="Allreduce: sendbuf is C-ordered \\(3, 4\\) but recvbuf is F-ordered"):
        comm.Allreduce(a, np.empty((3, 4), order="F"))
    comm.Allreduce(np.asfortranarray(a), np.empty((3, 4), order="F"))
    comm.Allreduce(a.reshape(-1), np.empty((3, 4), order="F").reshape(-1, order="A"))


def test_byte_order_and_alignment(comm):
    with pytest.raises(TypeError, match="Allreduce: sendbuf has non-native byte order \\(>f8\\)"):
        comm.Allreduce(np.ones(4, ">f8"), np.empty(4))
    raw = np.zeros(8 * 5 + 1, np.uint8)
    unaligned = raw[1:].view(np.float64)
    assert not unaligned.flags.aligned
    with pytest.raises(ValueError, match="Allreduce: recvbuf is not aligned to its 8-byte elements"):
        comm.Allreduce(np.ones(5), unaligned)


# -- Alltoall / Alltoallv -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_alltoall(comm, dtype):
    size, rank = WORLD.size, WORLD.rank
    for it, n in enumerate((0, 1, 7, 1000)):
        rng = np.random.default_rng([rank, it, 31])
        x = _data(rng, dtype, n * size, "SUM", nans=False) if n else np.empty(0, np_dtype(dtype))
        xs = WORLD.allgather(x)
        want = np.concatenate([xs[s][rank * n:(rank + 1) * n] for s in range(size)])
        out = np.empty_like(x)
        comm.Alltoall(x, out)
        assert np.array_equal(_bits(out), _bits(want))
        buf = x.copy()
        comm.Alltoall(hpccoll.IN_PLACE, buf)
        assert np.array_equal(_bits(buf), _bits(want))


def test_alltoallv_with_displacements_and_empty_blocks(comm):
    size, rank = WORLD.size, WORLD.rank
    counts = [[(i * 7 + j * 3) % 5 for j in range(size)] for i in range(size)]  # rank i -> j, some zero
    for it in range(3):
        rng = np.random.default_rng([rank, it, 37])
        scounts = counts[rank]
        sdispls = list(np.cumsum([0] + [c + 2 for c in scounts[:-1]]))  # gaps between blocks
        x = rng.standard_normal(sum(scounts) + 2 * size)
        rcounts = [counts[i][rank] for i in range(size)]
        rdispls = list(np.cumsum([0] + [c + 1 for c in rcounts[:-1]]))
        out = np.full(sum(rcounts) + size, -7.0)
        comm.Alltoallv((x, scounts, sdispls), (out, rcounts, rdispls))
        specs = WORLD.allgather((x, sdispls))
        for i in range(size):
            xi, di = specs[i]
            got = out[rdispls[i]:rdispls[i] + rcounts[i]]
            assert np.array_equal(got, xi[di[rank]:di[rank] + counts[i][rank]])
        gaps = np.ones(out.size, bool)
        for i in range(size):
            gaps[rdispls[i]:rdispls[i] + rcounts[i]] = False
        assert np.all(out[gaps] == -7.0), "Alltoallv wrote outside the received blocks"


def test_alltoall_bad_inputs(comm):
    size = WORLD.size
    with pytest.raises(ValueError, match=f"Alltoall: recvbuf has {size + 1} elements, not a multiple of size={size}"):
        comm.Alltoall(np.ones(size + 1), np.empty(size + 1))
    with pytest.raises(ValueError, match="Alltoallv: sendbuf's counts has 1 entries: give one per rank"):
        comm.Alltoallv((np.ones(4), [4]), (np.empty(4), [1] * size))
    with pytest.raises(ValueError, match="Alltoallv: recvbuf's block for rank 0 .* past the array's 1"):
        comm.Alltoallv((np.ones(size), [1] * size), (np.empty(1), [2] + [0] * (size - 1)))
    with pytest.raises(TypeError, match="Alltoallv: sendbuf must be \\(array, counts\\)"):
        comm.Alltoallv(np.ones(4), (np.empty(4), [1] * size))
    with pytest.raises(ValueError, match="negative"):
        comm.Alltoallv((np.ones(size), [-1] + [1] * (size - 1)), (np.empty(size), [1] * size))
    assert_still_works(comm)


@pytest.mark.parametrize("var,value", [("HPCCOLL_TIMEOUT", "soon"), ("HPCCOLL_SMALL_BLOCK", "100"),
                                       ("HPCCOLL_CHECK", "maybe")])
def test_a_setting_invalid_on_one_rank_raises_on_every_rank(monkeypatch, var, value):
    """Only the last rank has the bad value: it raises its own error, naming the variable; the
    others raise one naming that rank, instead of waiting for it in the constructor's Dup."""
    last = WORLD.Get_size() - 1
    if WORLD.Get_rank() == last:
        monkeypatch.setenv(var, value)
        with pytest.raises(ValueError, match=var):
            hpccoll.Communicator(backend="host")
    else:
        with pytest.raises(ValueError, match=f"invalid HPCCOLL_\\* settings on other ranks \\(rank {last}: .*{var}"):
            hpccoll.Communicator(backend="host")
    monkeypatch.delenv(var, raising=False)
    c = hpccoll.Communicator(backend="host")   # the next one, with valid settings, works
    assert_still_works(c)
    c.Free()


def test_check_mode_must_agree(monkeypatch):
    """Check mode adds an agreement before every call: ranks with and without it would pair
    different MPI calls, so it is refused on every rank."""
    monkeypatch.setenv("HPCCOLL_CHECK", "1" if WORLD.Get_rank() == 0 else "0")
    with pytest.raises(ValueError, match="HPCCOLL_CHECK differs between ranks"):
        hpccoll.Communicator(backend="host")
    with pytest.raises(ValueError, match=r"^check= differs between ranks") as e:   # the argument, named as such
        hpccoll.Communicator(backend="host", check=WORLD.Get_rank() == 0)
    assert "HPCCOLL_CHECK" not in str(e.value)


# -- arguments that must be rejected, or taken as they are -------------------------------------------
def test_a_repeat_with_a_read_only_or_restrided_buffer_is_validated_again(comm):
    """The repeated call's fast path compares the writeable flag and the strides too: a buffer
    made read-only since its last call is refused (it was written), on every rank, and the
    communicator stays in step (a Bcast refused on some ranks only had left the root ahead)."""
    x, z = np.ones(4), np.zeros(4)
    comm.Allreduce(x, z)
    comm.Allreduce(x, z)
    z[:] = 0
    z.flags.writeable = False
    with pytest.raises(ValueError, match="Allreduce: recvbuf is read-only"):
        comm.Allreduce(x, z)
    assert not z.any(), "a read-only recvbuf was written"
    y = np.zeros(4)
    comm.Bcast(y)
    comm.Bcast(y)
    y.flags.writeable = False
    with pytest.raises(ValueError, match="Bcast: buf is read-only"):
        comm.Bcast(y)
    assert_still_works(comm)
    raw = np.zeros(8)
    view = raw[:4]
    comm.Allreduce(x, view)
    comm.Allreduce(x, view)
    view = np.lib.stride_tricks.as_strided(raw, shape=(4,), strides=(16,))  # a new object: full path
    with pytest.raises(ValueError, match="Allreduce: recvbuf is not contiguous"):
        comm.Allreduce(x, view)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
def test_numpy_subclasses_are_their_plain_memory(comm):
    """np.matrix keeps two dimensions through reshape(-1) (its slices are rows): taken as a plain
    view of its memory, its results are the plain array's; a masked array is refused."""
    size, rank = WORLD.size, WORLD.rank
    rng = np.random.default_rng([rank, 71])
    h = rng.standard_normal(2)
    y = np.matrix(np.full(2 * size, -1.0))
    y[0, 2 * rank:2 * rank + 2] = h
    comm.Allgather(hpccoll.IN_PLACE, y)
    assert np.array_equal(np.asarray(y).ravel(), np.concatenate(WORLD.allgather(h)))
    x = np.matrix(np.arange(size, dtype=np.float64) + 10 * rank)
    out = np.matrix(np.full(size, -1.0))
    comm.Alltoallv((x, [1] * size), (out, [1] * size))
    assert np.array_equal(np.asarray(out).ravel(), np.arange(size) * 10.0 + rank)
    s = np.matrix(rng.standard_normal(size))
    r = np.matrix(np.zeros(size))
    comm.Allreduce(s, r, op=MPI.SUM, deterministic=True)
    assert np.array_equal(np.asarray(r).ravel(), reduce_in_rank_order(OPS["SUM"], [np.asarray(v).ravel() for v in WORLD.allgather(s)]))
    with pytest.raises(TypeError, match="Allreduce: sendbuf is a masked array"):
        comm.Allreduce(np.ma.masked_array(np.ones(3), mask=[0, 1, 0]), np.empty(3))
    assert_still_works(comm)


def test_alltoallv_own_block_mismatch_is_refused_before_a_group_issues(comm):
    """The block a rank sends itself must be the size it expects from itself: checked when the
    call is validated, so inside a group the block issues nothing (the Allreduce before it too)."""
    size, rank = WORLD.size, WORLD.rank
    a, b = np.ones(3), np.full(3, -1.0)
    rc = [1] * size
    rc[rank] = 0
    with pytest.raises(ValueError, match=f"Alltoallv: rank {rank} sends itself 1 elements .* expects 0 from itself"):
        with comm.group():
            comm.Allreduce(a, b)
            comm.Alltoallv((np.ones(size), [1] * size), (np.empty(size), rc))
    assert np.all(b == -1.0), "a group that raised issued its calls"
    assert_still_works(comm)


def test_on_off_arguments_refuse_strings():
    """bool('false') is True: deterministic= and check= take True or False (or 0 / 1)."""
    with pytest.raises(TypeError, match="Communicator: check='no': pass True or False"):
        hpccoll.Communicator(backend="host", check="no")
    with pytest.raises(TypeError, match="Communicator: deterministic='false': pass True or False"):
        hpccoll.Communicator(backend="host", deterministic="false")
    c = hpccoll.Communicator(backend="host", deterministic=np.bool_(True), check=0)
    assert c.deterministic is True and c.check is False
    with pytest.raises(TypeError, match="Allreduce: deterministic='false': pass True or False"):
        c.Allreduce(np.ones(2), np.empty(2), deterministic="false")
    with pytest.raises(TypeError, match="Allreduce: deterministic=2: pass True or False"):
        c.Allreduce_init(np.ones(2), np.empty(2), deterministic=2)
    assert_still_works(c)
    c.Free()


def test_split_refuses_a_color_or_key_that_is_not_an_integer(comm):
    """Checked before MPI's Split, in which the other ranks would wait past any timeout."""
    with pytest.raises(TypeError, match="Split: color='x' must be an integer"):
        comm.Split(color="x")
    with pytest.raises(TypeError, match="Split: key=0.7 must be an integer"):
        comm.Split(color=1, key=0.7)
    sub = comm.Split(color=np.int64(WORLD.rank % 2), key=-WORLD.rank)
    assert sub.Get_size() == len(range(WORLD.rank % 2, WORLD.size, 2)) and sub.Get_rank() == sub.Get_size() - 1 - WORLD.rank // 2
    sub.Free()


def test_advice_for_a_written_buffer_keeps_it(comm):
    """A buffer the call writes cannot be replaced by a converted copy: the advice says so, and
    a C/F pair is fixed on sendbuf."""
    with pytest.raises(ValueError, match="Allreduce: recvbuf is not contiguous: pass a contiguous array as recvbuf "
                                         "\\(the call writes recvbuf"):
        comm.Allreduce(np.ones(4), np.zeros(8)[::2])
    with pytest.raises(ValueError, match="Bcast: buf is not contiguous: pass a contiguous array as buf"):
        comm.Bcast(np.zeros(8)[::2])
    with pytest.raises(ValueError, match="pass both in one order \\(e.g. np.asfortranarray\\(sendbuf\\)\\)"):
        comm.Allreduce(np.ones((3, 4)), np.empty((3, 4), order="F"))
