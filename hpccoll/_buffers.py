"""What a buffer argument is: host (numpy) or device (CuPy, __cuda_array_interface__, DLPack).

Only this module looks at array types; everything else sees a `Buf`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ops import dtype_name


class _InPlace:
    """Marker for MPI_IN_PLACE (hpccoll.IN_PLACE; mpi4py's MPI.IN_PLACE is accepted too)."""

    _inst = None

    def __new__(cls):
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __repr__(self) -> str:
        return "hpccoll.IN_PLACE"


IN_PLACE = _InPlace()


def is_in_place(buf) -> bool:
    if buf is IN_PLACE:
        return True
    try:
        from mpi4py import MPI

        return buf is MPI.IN_PLACE or (isinstance(buf, type(MPI.IN_PLACE)) and buf == MPI.IN_PLACE)
    except ImportError:  # pragma: no cover
        return False


@dataclass
class Buf:
    """A contiguous buffer: `array` is numpy (host) or cupy (device), flat view in `flat`."""

    array: object
    flat: object
    dtype: str
    count: int
    device: int | None  # CUDA device ordinal, None for host memory

    @property
    def is_device(self) -> bool:
        return self.device is not None

    @property
    def nbytes(self) -> int:
        return self.flat.nbytes

    @property
    def ptr(self) -> int:
        if self.is_device:
            return self.flat.data.ptr
        return self.flat.ctypes.data


def _cupy():
    try:
        import cupy

        return cupy
    except Exception:  # ImportError, or a broken CUDA install
        return None


def as_buf(obj, argname: str, fn: str, *, writable: bool) -> Buf:
    """Wrap `obj` as a Buf, or raise TypeError/ValueError that names `argname` and the fix."""
    if isinstance(obj, np.ndarray):
        arr = obj
        device = None
        if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
            raise ValueError(f"{fn}: {argname} is not contiguous: pass np.ascontiguousarray({argname})")
        if writable and not arr.flags.writeable:
            raise ValueError(f"{fn}: {argname} is read-only: pass a writable array (e.g. {argname}.copy())")
        flat = arr.reshape(-1, order="A") if arr.ndim != 1 else arr  # "A": a view in memory order
    elif hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__dlpack_device__"):
        cp = _cupy()
        if cp is None:
            raise TypeError(f"{fn}: {argname} is a device array but CuPy is not installed: "
                            "pip install 'hpccoll[cuda13]' (or [cuda12])")
        if isinstance(obj, cp.ndarray):
            arr = obj
        elif hasattr(obj, "__cuda_array_interface__"):
            arr = cp.asarray(obj)
        else:
            arr = cp.from_dlpack(obj)
        if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
            raise ValueError(f"{fn}: {argname} is not contiguous: pass cupy.ascontiguousarray({argname})")
        device = arr.device.id
        flat = arr.reshape(-1, order="A") if arr.ndim != 1 else arr  # "A": a view in memory order
    else:
        raise TypeError(f"{fn}: {argname} must be a numpy array or a device array "
                        f"(CuPy, __cuda_array_interface__ or DLPack), not {type(obj).__name__}")
    return Buf(array=arr, flat=flat, dtype=dtype_name(arr.dtype), count=int(arr.size), device=device)
