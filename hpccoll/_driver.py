"""Thin ctypes layer over the CUDA driver: load cubins, launch kernels with a by-value Args.

Launching through cuLaunchKernel with a pre-built parameter block costs ~1-2 us of CPU,
several times less than a generic array-library launch with many arguments."""
from __future__ import annotations

import ctypes

from .errors import HpccollError

MAX_RANKS = 8  # HC_MAX_RANKS in cuda/hc_common.cuh


class Args(ctypes.Structure):
    """Mirror of `struct Args` in cuda/hc_common.cuh (same order, natural alignment)."""

    _fields_ = [
        ("peers", ctypes.c_void_p * MAX_RANKS),
        ("in_", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("count", ctypes.c_uint64),
        ("region", ctypes.c_uint64),
        ("region2", ctypes.c_uint64),
        ("sub", ctypes.c_uint64),
        ("sub2", ctypes.c_uint64),
        ("timeoutNs", ctypes.c_uint64),
        ("hostErr", ctypes.c_void_p),
        ("rank", ctypes.c_int),
        ("nranks", ctypes.c_int),
        ("root", ctypes.c_int),
        ("iters", ctypes.c_int),
    ]


_cuda = None


def libcuda():
    global _cuda
    if _cuda is None:
        try:
            _cuda = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise HpccollError(f"libcuda.so.1 not loadable: {exc}") from None
        _cuda.cuLaunchKernel.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                         ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                         ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return _cuda


def check(res: int, what: str) -> None:
    if res != 0:
        s = ctypes.c_char_p()
        libcuda().cuGetErrorString(res, ctypes.byref(s))
        raise HpccollError(f"{what} failed: CUDA driver error {res} ({(s.value or b'?').decode()})")


class Module:
    """A loaded cubin; `fn(name)` returns a cached CUfunction handle."""

    def __init__(self, cubin: bytes):
        self._mod = ctypes.c_void_p()
        self._image = ctypes.create_string_buffer(cubin, len(cubin))
        check(libcuda().cuModuleLoadData(ctypes.byref(self._mod), self._image), "cuModuleLoadData")
        self._fns: dict[str, ctypes.c_void_p] = {}

    def fn(self, name: str) -> ctypes.c_void_p:
        f = self._fns.get(name)
        if f is None:
            f = ctypes.c_void_p()
            check(libcuda().cuModuleGetFunction(ctypes.byref(f), self._mod, name.encode()),
                  f"cuModuleGetFunction({name})")
            self._fns[name] = f
        return f


class Launcher:
    """One kernel with a reusable by-value Args parameter block."""

    def __init__(self, fn, args: Args):
        self.fn = fn
        self.args = args
        self._params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        self._launch = libcuda().cuLaunchKernel

    def __call__(self, grid: int, block: int, stream: int) -> None:
        res = self._launch(self.fn, grid, 1, 1, block, 1, 1, 0, stream, self._params, None)
        if res:
            check(res, "cuLaunchKernel")


def launch_raw(fn, grid: int, block: int, stream: int, *cargs) -> None:
    """Launch with arbitrary ctypes arguments (microbenchmarks)."""
    params = (ctypes.c_void_p * len(cargs))(*[ctypes.addressof(a) for a in cargs])
    check(libcuda().cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, params, None), "cuLaunchKernel")


def p2p_native_atomics(src: int, dst: int) -> bool:
    """cuDeviceGetP2PAttribute(NATIVE_ATOMIC_SUPPORTED) between two device ordinals."""
    lib = libcuda()
    check(lib.cuInit(0), "cuInit")
    value, d0, d1 = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    check(lib.cuDeviceGet(ctypes.byref(d0), src), "cuDeviceGet")
    check(lib.cuDeviceGet(ctypes.byref(d1), dst), "cuDeviceGet")
    check(lib.cuDeviceGetP2PAttribute(ctypes.byref(value), 3, d0, d1), "cuDeviceGetP2PAttribute")
    return bool(value.value)


def host_device_pointer(host_ptr: int) -> int:
    """Device address of mapped pinned host memory (cuMemHostGetDevicePointer)."""
    dptr = ctypes.c_uint64()
    check(libcuda().cuMemHostGetDevicePointer_v2(ctypes.byref(dptr), ctypes.c_void_p(host_ptr), 0),
          "cuMemHostGetDevicePointer")
    return dptr.value
