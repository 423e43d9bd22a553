"""Reduction operations and the dtypes hpccoll supports.

One place defines what every backend must compute: the fixed-order reference
reduction `reduce_in_rank_order`.  Deterministic device kernels reproduce it bit
for bit (16-bit floats: each step computed in fp32 and rounded back, as numpy and
ml_dtypes do; MAX/MIN: numpy's scalar rule `a if (a >= b or isnan(a)) else b`).
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


def as_op(op) -> Op:
    """Accept hpccoll ops, mpi4py's MPI.SUM etc., or their names."""
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
    raise ValueError(
        f"op={op!r} is not supported: use hpccoll.SUM, MAX, MIN or PROD "
        "(or mpi4py's MPI.SUM, MPI.MAX, MPI.MIN, MPI.PROD)")


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


def _step(op: Op, acc: np.ndarray, x: np.ndarray) -> np.ndarray:
    if op is SUM:
        return acc + x
    if op is PROD:
        return acc * x
    if acc.dtype.kind == "f" or _is_bf16(acc.dtype):
        keep = (acc >= x) if op is MAX else (acc <= x)
        keep |= np.isnan(acc)
    else:
        keep = (acc >= x) if op is MAX else (acc <= x)
    return np.where(keep, acc, x)


def reduce_in_rank_order(op: Op, contributions) -> np.ndarray:
    """The reference: ((x0 op x1) op x2) ... in rank order, rounded to the dtype each step.

    Integer SUM/PROD wrap around like C (numpy's overflow warning is silenced)."""
    it = iter(contributions)
    acc = np.array(next(it), copy=True)
    with np.errstate(over="ignore", invalid="ignore"):
        for x in it:
            acc = _step(op, acc, x).astype(acc.dtype, copy=False)
    return acc
