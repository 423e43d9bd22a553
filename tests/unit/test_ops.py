"""hpccoll/ops.py: op lookup, supported dtypes, and the rank-order reference reduction."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll.ops import (BFLOAT16, MAX, MIN, PROD, SUM, SUPPORTED_DTYPES, as_op, dtype_name,
                         np_dtype, fp_quiet, fp_restore, reduce_in_rank_order)


@pytest.mark.parametrize("name", ["SUM", "PROD", "MAX", "MIN"])
def test_as_op_accepts_hpccoll_mpi4py_and_names(name):
    op = getattr(hpccoll, name)
    assert as_op(op) is op
    assert as_op(getattr(MPI, name)) is op
    assert as_op(name) is op and as_op(name.lower()) is op


@pytest.mark.parametrize("bad", ["AVG", None, 0, MPI.LAND, MPI.BOR, np.add])
def test_as_op_rejects_with_the_supported_list(bad):
    with pytest.raises(ValueError, match=r"is not supported: use hpccoll.SUM, MAX, MIN or PROD \(or mpi4py's"):
        as_op(bad)


def test_ops_pickle_to_the_same_object():
    for op in (SUM, PROD, MAX, MIN):
        assert pickle.loads(pickle.dumps(op)) is op
        assert repr(op) == f"hpccoll.{op.name}"


@pytest.mark.parametrize("name", list(SUPPORTED_DTYPES))
def test_supported_dtypes_round_trip(name):
    if name == "bfloat16" and BFLOAT16 is None:
        pytest.skip("bfloat16 needs ml_dtypes")
    dt = np_dtype(name)
    assert dtype_name(dt) == name
    assert dt.itemsize == SUPPORTED_DTYPES[name][0]


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128, np.uint8, np.uint32, np.int8, np.bool_, object])
def test_unsupported_dtypes_raise(dtype):
    with pytest.raises(TypeError, match=rf"dtype {np.dtype(dtype).name} is not supported"):
        dtype_name(dtype)


# -- the reference reduction --------------------------------------------------------------

def test_reduce_is_in_rank_order_not_pairwise():
    """((x0 + x1) + x2): 1e16 + 1 rounds away, then -1e16 leaves 0; another order gives 1."""
    xs = [np.array([1e16]), np.array([1.0]), np.array([-1e16])]
    assert reduce_in_rank_order(SUM, xs)[0] == 0.0
    assert reduce_in_rank_order(SUM, [xs[0], xs[2], xs[1]])[0] == 1.0


def test_reduce_does_not_modify_its_inputs():
    xs = np.arange(12, dtype=np.float32).reshape(3, 4)
    before = xs.copy()
    reduce_in_rank_order(SUM, xs)
    assert np.array_equal(xs, before)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_floats_round_every_step(dtype):
    """Each step is computed wider and rounded back to the 16-bit type (as numpy does)."""
    dt = np_dtype(dtype) if dtype == "float16" else pytest.importorskip("ml_dtypes").bfloat16
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((5, 257)).astype(dt)
    want = xs[0].astype(np.float32).astype(dt)
    for x in xs[1:]:
        want = (want.astype(np.float32) + x.astype(np.float32)).astype(dt)
    got = reduce_in_rank_order(SUM, xs)
    assert got.dtype == dt
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_sum_and_prod_wrap_like_c(dtype):
    info = np.iinfo(dtype)
    xs = np.array([[info.max, info.min, 3], [1, -1, info.max]], dtype=dtype)
    s = reduce_in_rank_order(SUM, xs)
    assert s.tolist() == [info.min, info.max, info.min + 2]
    p = reduce_in_rank_order(PROD, xs)
    assert p.dtype == dtype
    assert p.tolist() == [info.max, info.min, info.max - 2]  # 3 * max = max - 2 modulo 2**bits


def test_max_min_nan_rule():
    """A NaN anywhere makes MAX / MIN a NaN."""
    nan = np.nan
    xs = np.array([[nan, 1.0, 2.0, nan], [1.0, nan, 3.0, nan]])
    mx = reduce_in_rank_order(MAX, xs)
    assert np.isnan(mx[0]) and np.isnan(mx[1]) and mx[2] == 3.0 and np.isnan(mx[3])
    mn = reduce_in_rank_order(MIN, xs)
    assert np.isnan(mn[0]) and np.isnan(mn[1]) and mn[2] == 2.0


def test_max_min_signed_zero_is_order_independent():
    """+0 ranks above -0: MAX of {-0, +0} is +0 and MIN is -0, whichever rank holds which."""
    xs = np.array([[-0.0, 0.0], [0.0, -0.0]])
    assert np.signbit(reduce_in_rank_order(MAX, xs)).tolist() == [False, False]
    assert np.signbit(reduce_in_rank_order(MIN, xs)).tolist() == [True, True]


def test_infinities():
    inf = np.inf
    xs = np.array([[inf, inf, -inf, 2.0], [-inf, 1.0, -inf, inf]])
    s = reduce_in_rank_order(SUM, xs)
    assert np.isnan(s[0]) and s[1] == inf and s[2] == -inf and s[3] == inf
    assert reduce_in_rank_order(MAX, xs).tolist() == [inf, inf, -inf, inf]
    assert reduce_in_rank_order(MIN, xs).tolist() == [-inf, 1.0, -inf, 2.0]


def test_single_contribution_is_a_copy():
    x = np.arange(3.0)
    y = reduce_in_rank_order(PROD, [x])
    assert np.array_equal(x, y) and not np.shares_memory(x, y)


_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
#: NaN payloads an input may carry, per element width: quiet/signalling, both signs, the
#: sentinel pattern of the sentinel protocol
PAYLOADS = {2: [0x7E01, 0xFE00, 0x7C01, 0xFFFA], 4: [0x7FC00001, 0xFFC00000, 0x7F800001, 0xFFFAFFFA],
            8: [0x7FF8000000000001, 0xFFF8000000000000, 0x7FF0000000000001, 0xFFFAFFFAFFFAFFFA]}


def _float_dtypes():
    out = [np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16)]
    if BFLOAT16 is not None:
        out.append(BFLOAT16)
    return out


@pytest.mark.parametrize("dtype", _float_dtypes(), ids=str)
@pytest.mark.parametrize("op", [SUM, PROD, MAX, MIN], ids=repr)
def test_every_nan_result_is_canonical_whatever_the_payloads_and_the_order(dtype, op):
    """The same bits on every rank means NaNs too: payloads of the inputs never show, and for
    MAX / MIN no order of the ranks changes a bit (they are commutative in bits)."""
    from itertools import permutations

    from hpccoll._abi import CANONICAL_NAN

    rng = np.random.default_rng(7)
    u = _UINT[dtype.itemsize]
    n = 64
    rows = []
    for r in range(3):
        x = rng.standard_normal(n).astype(dtype)
        x[rng.integers(0, n, 4)] = 0.0
        x[rng.integers(0, n, 4)] = -0.0
        bits = x.view(u)
        hit = rng.integers(0, n, 8)
        bits[hit] = rng.choice(np.array(PAYLOADS[dtype.itemsize], dtype=u), hit.size)
        rows.append(x)
    canon = CANONICAL_NAN[dtype_name(dtype)]
    results = [reduce_in_rank_order(op, [rows[i] for i in perm]) for perm in permutations(range(3))]
    for res in results:
        nan = np.isnan(res.astype(np.float32))
        assert nan.any()
        assert (res.view(u)[nan] == canon).all(), "a NaN of the result is not the canonical one"
    if op in (MAX, MIN):
        assert all(np.array_equal(r.view(u), results[0].view(u)) for r in results)


def test_max_min_through_ordered_keys_match_the_reference():
    """The host's MAX / MIN of floats run as integer MAX / MIN of order-preserving keys."""
    from hpccoll.ops import from_ordered_keys, ordered_keys

    rng = np.random.default_rng(3)
    for dtype in _float_dtypes():
        u = _UINT[dtype.itemsize]
        xs = rng.standard_normal((4, 100)).astype(dtype)
        xs.reshape(-1)[rng.integers(0, 400, 20)] = -0.0
        xs.reshape(-1)[rng.integers(0, 400, 5)] = np.inf
        xs.reshape(-1)[rng.integers(0, 400, 5)] = -np.inf
        xs.view(u).reshape(-1)[rng.integers(0, 400, 3)] = PAYLOADS[dtype.itemsize][3]
        for op in (MAX, MIN):
            keys = np.stack([ordered_keys(x, op) for x in xs])
            pick = keys.max(axis=0) if op is MAX else keys.min(axis=0)
            got = from_ordered_keys(pick, np.empty(100, dtype), op)
            assert np.array_equal(got.view(u), reduce_in_rank_order(op, xs).view(u))


def test_reductions_never_raise_under_the_callers_seterr():
    """The host reductions silence floating-point errors whatever np.seterr says (MPI's raise
    none; a raise on one rank would leave the others waiting), and put the caller's state back."""
    big = np.full(7, np.finfo(np.float32).max, dtype=np.float32)
    before = np.geterr()
    with np.errstate(all="raise"):
        out = reduce_in_rank_order(SUM, [big, big, -big])
        assert np.isposinf(out).all()  # (max + max) overflows first: rank order
        out = reduce_in_rank_order(PROD, [np.full(3, 1e-30, np.float32)] * 3)
        assert (out == 0).all()
        token = fp_quiet()
        try:
            np.add(big, big)
        finally:
            fp_restore(token)
        with pytest.raises(FloatingPointError):
            np.add(big, big)
    assert np.geterr() == before
