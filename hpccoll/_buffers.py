"""What a buffer argument is: host (numpy) or device (CuPy, __cuda_array_interface__, DLPack).

Only this module looks at array types; everything else sees a `Buf`."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .ops import BFLOAT16, dtype_name


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


def _mpi_in_place():
    try:
        from mpi4py import MPI

        return MPI.IN_PLACE
    except ImportError:  # pragma: no cover
        return IN_PLACE


_MPI_IN_PLACE = _mpi_in_place()


def is_in_place(buf) -> bool:
    if buf is IN_PLACE or buf is _MPI_IN_PLACE:
        return True
    return isinstance(buf, type(_MPI_IN_PLACE)) and buf == _MPI_IN_PLACE


@dataclass
class Buf:
    """A contiguous buffer: `array` is numpy (host) or cupy (device), flat view in `flat`
    (elements in memory order).  order: "C" or "F" for a multi-dimensional array that is only
    that one, else "A" (1-D, or both at once)."""

    array: object
    flat: object
    dtype: str
    count: int
    device: int | None  # CUDA device ordinal, None for host memory
    order: str = "A"

    def overlaps(self, other: "Buf") -> bool:
        """Whether the two buffers share any byte (same memory space only)."""
        if self.device != other.device or not self.count or not other.count:
            return False
        if self.is_device:
            a, b = self.flat.data.ptr, other.flat.data.ptr
            return a < b + other.flat.nbytes and b < a + self.flat.nbytes
        return bool(np.may_share_memory(self.flat, other.flat))

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


_CUPY: list = []  # [cupy module or None], imported on first use


def _cupy():
    if not _CUPY:
        try:
            import cupy
        except Exception:  # ImportError, or a broken CUDA install
            cupy = None
        _CUPY.append(cupy)
    return _CUPY[0]


def as_buf(obj, argname: str, fn: str, *, writable: bool) -> Buf:
    """Wrap `obj` as a Buf, or raise TypeError/ValueError that names `fn`, `argname` and the fix."""
    try:
        return _as_buf(obj, argname, fn, writable)
    except TypeError as exc:
        if str(exc).startswith("dtype "):  # dtype_name's message: say which call and argument
            raise TypeError(f"{fn}: {argname}'s {exc}") from None
        raise


def _as_buf(obj, argname: str, fn: str, writable: bool) -> Buf:
    if obj is not None and not isinstance(obj, np.ndarray) and _is_cupy_array(obj):
        return _cupy_buf(obj, argname, fn, writable)
    if isinstance(obj, np.ndarray):
        arr = obj if type(obj) is np.ndarray else _plain(obj, argname, fn)
        flags = arr.flags
        if not (flags.c_contiguous or flags.f_contiguous):
            raise _not_contiguous(argname, fn, writable, "np")
        if writable and not flags.writeable:
            raise ValueError(f"{fn}: {argname} is read-only: pass a writable array (e.g. {argname}.copy())")
        if not arr.dtype.isnative:
            raise TypeError(f"{fn}: {argname} has non-native byte order ({arr.dtype.str}): " +
                            _copy_advice(argname, writable, f"{argname}.astype({argname}.dtype.newbyteorder('='))",
                                         "an array of native byte order"))
        if not flags.aligned:
            raise ValueError(f"{fn}: {argname} is not aligned to its {arr.itemsize}-byte elements: " +
                             _copy_advice(argname, writable, f"an aligned copy ({argname}.copy())", "an aligned array"))
        flat = arr.reshape(-1, order="A") if arr.ndim != 1 else arr  # "A": a view in memory order
        order = "A" if arr.ndim < 2 or (flags.c_contiguous and flags.f_contiguous) else \
            ("C" if flags.c_contiguous else "F")
        return Buf(array=arr, flat=flat, dtype=dtype_name(arr.dtype), count=int(arr.size), device=None,
                   order=order)
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
        buf = _cupy_buf(_typed_bfloat16(arr, obj), argname, fn, writable)
        dev = _foreign_device(obj, buf)
        return buf if dev == buf.device else replace(buf, device=dev)
    else:
        if isinstance(obj, (list, tuple)) and any(map(is_mpi_datatype, obj)):
            raise TypeError(f"{fn}: {argname} is an mpi4py buffer specification ([array, MPI.DOUBLE] or "
                            f"[array, count, MPI.DOUBLE]), which hpccoll does not take: pass the array itself "
                            f"(its dtype gives the datatype; a slice of it gives a count)")
        raise TypeError(f"{fn}: {argname} must be a numpy array or a device array "
                        f"(CuPy, __cuda_array_interface__ or DLPack), not {type(obj).__name__}")


def is_mpi_datatype(obj) -> bool:
    """Is `obj` an mpi4py Datatype (MPI.DOUBLE, ...)?  (By name: no mpi4py import here.)"""
    t = type(obj)
    return t.__name__ == "Datatype" and t.__module__.startswith("mpi4py")


def _plain(obj, argname: str, fn: str):
    """A numpy subclass as a plain ndarray view of the same memory (np.matrix keeps two
    dimensions through reshape(-1), and its slices are rows); a masked array is refused (its
    mask would be ignored)."""
    if isinstance(obj, np.ma.MaskedArray):
        raise TypeError(f"{fn}: {argname} is a masked array, whose mask a collective would ignore: "
                        f"pass {argname}.filled(...) or np.asarray({argname})")
    return obj.view(np.ndarray)


def _copy_advice(argname: str, written: bool, copy: str, kind: str) -> str:
    """The fix for a buffer the call cannot use as it is: a converted copy for an input; for a
    buffer the call writes, a copy passed in its place would take the results away with it."""
    if not written:
        return f"pass {copy}"
    return (f"pass {kind} as {argname} (the call writes {argname}: a copy passed in its place would "
            f"receive the results, so keep it and copy them back)")


def _foreign_device(obj, buf) -> int:
    """The GPU that really holds a foreign array's memory.  CuPy's wrapper of a
    __cuda_array_interface__ pointer reports the *current* device (seen on 2xH200: a torch
    tensor on GPU 1 passed as GPU 0), so ask the array (DLPack) or the driver (the pointer)."""
    if hasattr(obj, "__dlpack_device__"):
        try:
            kind, index = obj.__dlpack_device__()
            if int(kind) in (2, 13):  # kDLCUDA, kDLCUDAManaged
                return int(index)
        except Exception:  # noqa: BLE001 - fall through to the pointer
            pass
    ptr = buf.flat.data.ptr
    if ptr:
        import cupy

        try:
            return int(cupy.cuda.runtime.pointerGetAttributes(ptr).device)
        except Exception:  # noqa: BLE001 - not a CUDA pointer the runtime knows
            pass
    return buf.device


def _is_cupy_array(obj) -> bool:
    cp = _cupy() if type(obj).__module__.startswith("cupy") else None
    return cp is not None and type(obj) is cp.ndarray


def _cupy_buf(arr, argname: str, fn: str, writable: bool) -> Buf:
    """as_buf for a CuPy array: the common case, kept to a few attribute reads."""
    order = "A"
    if arr.ndim == 1:
        if arr.strides[0] != arr.itemsize and arr.size > 1:
            raise _not_contiguous(argname, fn, writable, "cupy")
        flat = arr
    else:
        flags = arr.flags
        if not (flags.c_contiguous or flags.f_contiguous):
            raise _not_contiguous(argname, fn, writable, "cupy")
        flat = arr.reshape(-1, order="A")  # "A": a view in memory order
        if not (flags.c_contiguous and flags.f_contiguous):
            order = "C" if flags.c_contiguous else "F"
    return Buf(array=arr, flat=flat, dtype=dtype_name(arr.dtype), count=arr.size, device=arr.data.device_id,
               order=order)


def _not_contiguous(argname: str, fn: str, writable: bool, module: str) -> ValueError:
    """`module`: the array's library ("np", "cupy"), whose ascontiguousarray makes the copy."""
    return ValueError(f"{fn}: {argname} is not contiguous: " +
                      _copy_advice(argname, writable, f"{module}.ascontiguousarray({argname})", "a contiguous array"))


def _typed_bfloat16(arr, source):
    """A foreign bfloat16 tensor (torch) arrives from DLPack as raw 2-byte void elements
    (CuPy maps no DLPack bfloat16 code; seen on the GPU machine, 2026-11-30): view it as
    ml_dtypes' bfloat16 when the source says that is what it holds."""
    if arr.dtype.kind == "V" and arr.dtype.itemsize == 2 and BFLOAT16 is not None \
            and str(getattr(source, "dtype", "")).endswith("bfloat16"):
        return arr.view(BFLOAT16)
    return arr


def result_like(x, stream):
    """Communicator.allreduce's result, made so that the call's stream may write it at once.  Made
    on any other stream, its memory could be an array's just freed there whose last kernels,
    queued on that stream, still read it: a CuPy result comes from the call's stream's pool; a torch result
    from torch's allocator, the call's stream waiting for torch's current stream (the memory's
    earlier users).  Not recorded on the tensor (record_stream): torch would record an event on
    the call's stream when the tensor is freed, and a CuPy or raw stream may be gone by then."""
    buf = as_buf(x, "x", "allreduce", writable=False)  # (its errors name allreduce's x)
    if buf.device is None:
        return np.empty_like(x)
    import cupy

    from .backends.streams import stream_ptr  # (no cycle: streams imports nothing of hpccoll)

    with cupy.cuda.Device(buf.device):
        s = stream_ptr(stream)
        if type(x).__module__.split(".")[0] == "torch":
            import torch

            out = torch.empty_like(x)
            current = torch.cuda.current_stream(x.device)
            if current.cuda_stream != s:
                torch.cuda.ExternalStream(s, device=x.device).wait_stream(current)
            return out
        if stream is None:  # the call runs on CuPy's current stream: allocate there
            return cupy.empty_like(buf.array)
        with cupy.cuda.ExternalStream(s):
            return cupy.empty_like(buf.array)
