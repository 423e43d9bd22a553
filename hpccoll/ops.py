"""Reduction operations and the dtypes hpccoll supports.

One place defines what every backend must compute, the reference `reduce_in_rank_order`:
- SUM / PROD: IEEE arithmetic in rank order, ((x0 op x1) op x2) ..., rounded to the dtype at
  every step (16-bit floats: each step computed in fp32 and rounded back, as numpy and
  ml_dtypes do).  Deterministic device kernels reproduce it bit for bit.
- MAX / MIN: the larger / smaller value with +0 above -0; if any contribution is a NaN, the
  result is a NaN.  These are commutative and associative in bits, so every order of reduction
  gives the same bits (the host backend's MPI path uses MPI's own reduction for them).
- Every NaN of a floating-point result is the dtype's canonical NaN (cuda/hc_abi.h,
  HC_CANON_NAN_*: numpy's np.nan in each width), whatever payloads the input NaNs carried, so
  every rank holds the same bits in every mode.
Integer SUM / PROD wrap around like C.
"""
from __future__ import annotations

import numpy as np


class Op:
    """A reduction operation (SUM, MAX, MIN, PROD)."""

    __slots__ = ("name", "code")

    def __init__(self, name: str, code: int):
        self.name = name
        self.code = code

    def __repr__(self) -> str:
        return f"hpccoll.{self.name}"

    def __reduce__(self):
        return (_op_by_name, (self.name,))


SUM = Op("SUM", 0)
PROD = Op("PROD", 1)
MAX = Op("MAX", 2)
MIN = Op("MIN", 3)
OPS = {op.name: op for op in (SUM, PROD, MAX, MIN)}


def _op_by_name(name: str) -> Op:
    return OPS[name]


def as_op(op, fn: str | None = None) -> Op:
    """Accept hpccoll ops, mpi4py's MPI.SUM etc., or their names; `fn` names the call in errors."""
    if isinstance(op, Op):
        return op
    if isinstance(op, str) and op.upper() in OPS:
        return OPS[op.upper()]
    try:
        from mpi4py import MPI

        for name in OPS:
            if op == getattr(MPI, name):
                return OPS[name]
    except ImportError:  # pragma: no cover - mpi4py is a dependency
        pass
    prefix = f"{fn}: " if fn else ""
    raise ValueError(
        f"{prefix}op={op_text(op)} is not supported: use hpccoll.SUM, MAX, MIN or PROD "
        "(or mpi4py's MPI.SUM, MPI.MAX, MPI.MIN, MPI.PROD)")


def op_text(op) -> str:
    """An op as a reader knows it: hpccoll.SUM, MPI.LAND, 'avg', ... (never an object address)."""
    if isinstance(op, Op):
        return repr(op)
    try:
        from mpi4py import MPI

        if isinstance(op, MPI.Op):
            for name in ("SUM", "PROD", "MAX", "MIN", "LAND", "BAND", "LOR", "BOR", "LXOR", "BXOR",
                         "MAXLOC", "MINLOC", "REPLACE", "NO_OP", "OP_NULL"):
                if op == getattr(MPI, name, None):
                    return f"MPI.{name}"
            return "a user-defined MPI.Op"
    except ImportError:  # pragma: no cover
        pass
    if callable(op) and hasattr(op, "__name__"):
        return f"{getattr(op, '__module__', '') or ''}.{op.__name__}".lstrip(".")
    return repr(op)


def _bfloat16():
    try:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        return None


BFLOAT16 = _bfloat16()

#: dtype name -> (itemsize, is_float)
SUPPORTED_DTYPES = {
    "float64": (8, True),
    "float32": (4, True),
    "float16": (2, True),
    "bfloat16": (2, True),
    "int32": (4, False),
    "int64": (8, False),
}


_NAMES: dict = {}  # dtype object -> canonical name (the eager path asks on every call)


def dtype_name(dtype) -> str:
    """Canonical name of a dtype, or raise TypeError naming the supported ones."""
    try:
        return _NAMES[dtype]
    except (KeyError, TypeError):
        pass
    name = _dtype_name(dtype)
    if isinstance(dtype, np.dtype):
        _NAMES[dtype] = name
    return name


def _dtype_name(dtype) -> str:
    dt = np.dtype(dtype) if not _is_bf16(dtype) else BFLOAT16
    name = "bfloat16" if _is_bf16(dt) else dt.name
    if name not in SUPPORTED_DTYPES:
        raise TypeError(
            f"dtype {name} is not supported: use one of {', '.join(SUPPORTED_DTYPES)}")
    return name


def _is_bf16(dtype) -> bool:
    return BFLOAT16 is not None and dtype == BFLOAT16 or str(dtype) == "bfloat16"


def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        if BFLOAT16 is None:
            raise TypeError("bfloat16 needs the ml_dtypes package: pip install ml_dtypes")
        return BFLOAT16
    return np.dtype(name)


def canonicalize_nans(arr: np.ndarray) -> np.ndarray:
    """Replace every NaN of a floating-point array by the canonical NaN, in place; returns arr."""
    name = dtype_name(arr.dtype)
    if not SUPPORTED_DTYPES[name][1]:
        return arr
    nan = np.isnan(arr.astype(np.float32) if name == "bfloat16" else arr)
    if nan.any():
        from ._abi import CANONICAL_NAN

        arr.view(_UINT[arr.dtype.itemsize])[nan] = CANONICAL_NAN[name]
    return arr


_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_INT = {2: np.int16, 4: np.int32, 8: np.int64}


def ordered_keys(arr: np.ndarray, op: Op) -> np.ndarray:
    """Signed integers whose order is MAX/MIN's order on the floats of `arr` (+0 above -0), with
    every NaN mapped to the extreme that wins `op`: MAX/MIN of floats as an integer MAX/MIN, which
    MPI reduces exactly in any order.  `from_ordered_keys` maps back."""
    size = arr.dtype.itemsize
    i = arr.view(_INT[size]).copy()
    flip = np.array((1 << (8 * size - 1)) - 1, dtype=_INT[size])
    np.bitwise_xor(i, flip, out=i, where=i < 0)  # negatives: larger magnitude, smaller key
    info = np.iinfo(_INT[size])
    name = dtype_name(arr.dtype)
    nan = np.isnan(arr.astype(np.float32) if name == "bfloat16" else arr)
    i[nan] = info.max if op is MAX else info.min
    return i


def from_ordered_keys(keys: np.ndarray, out: np.ndarray, op: Op) -> np.ndarray:
    """The floats of `ordered_keys` back into `out` (the extreme key is the canonical NaN)."""
    from ._abi import CANONICAL_NAN

    size = out.dtype.itemsize
    info = np.iinfo(_INT[size])
    nan = keys == (info.max if op is MAX else info.min)
    flip = np.array((1 << (8 * size - 1)) - 1, dtype=_INT[size])
    bits = np.bitwise_xor(keys, flip, where=keys < 0, out=keys.copy())
    bits[nan] = np.array(CANONICAL_NAN[dtype_name(out.dtype)], dtype=_UINT[size]).view(_INT[size])
    out.reshape(-1).view(_INT[size])[...] = bits.reshape(-1)
    return out


def _is_float(dtype) -> bool:
    return np.dtype(dtype).kind == "f" or _is_bf16(dtype)


def _step(op: Op, acc: np.ndarray, x: np.ndarray) -> np.ndarray:
    if op is SUM:
        return acc + x
    if op is PROD:
        return acc * x
    if _is_float(acc.dtype):
        keys = np.stack([ordered_keys(acc, op), ordered_keys(x, op)])
        pick = keys.max(axis=0) if op is MAX else keys.min(axis=0)
        return from_ordered_keys(pick, np.empty_like(acc), op)
    return np.maximum(acc, x) if op is MAX else np.minimum(acc, x)


# Floating-point exceptions in a reduction belong to the data (MPI's reductions raise none), so
# the host reductions run with numpy's error state all "ignore", whatever np.seterr the caller
# chose.  numpy >= 2 keeps that state in a context variable, set here directly: np.errstate costs
# about 1.5 us a use, as much as a small Allreduce.  Older numpy goes through np.seterr.
try:
    from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj

    _QUIET = _make_extobj(all="ignore")

    def fp_quiet():
        """Silence floating-point errors; returns what fp_restore needs."""
        return _extobj_contextvar.set(_QUIET)

    fp_restore = _extobj_contextvar.reset
except ImportError:  # pragma: no cover - numpy 1.x
    def fp_quiet():
        """Silence floating-point errors; returns what fp_restore needs."""
        return np.seterr(all="ignore")

    def fp_restore(old) -> None:
        np.seterr(**old)


def reduce_in_rank_order(op: Op, contributions) -> np.ndarray:
    """The reference: ((x0 op x1) op x2) ... in rank order, rounded to the dtype each step, every
    NaN of the result canonical (see the module's doc).

    Integer SUM/PROD wrap around like C; no floating-point error warns or raises (fp_quiet)."""
    it = iter(contributions)
    acc = np.array(next(it), copy=True)
    token = fp_quiet()
    try:
        if op is SUM or op is PROD:
            ufunc = np.add if op is SUM else np.multiply
            for x in it:
                ufunc(acc, x, out=acc)  # same dtypes: one rounding to the dtype per step
        else:
            for x in it:
                acc = _step(op, acc, x).astype(acc.dtype, copy=False)
    finally:
        fp_restore(token)
    return canonicalize_nans(acc) if _is_float(acc.dtype) else acc
