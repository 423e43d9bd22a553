"""Thin ctypes layer over the CUDA driver: load cubins, launch kernels with a by-value Args.

Launching through cuLaunchKernel with a pre-built parameter block costs ~1-2 us of CPU,
several times less than a generic array-library launch with many arguments."""
from __future__ import annotations

import ctypes

from ..._abi import Args
from ...errors import HpccollError

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
        _cuda.cuLaunchKernelEx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
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


class _LaunchAttr(ctypes.Structure):
    """CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuLaunchKernelEx)."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint)]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


class Launcher:
    """One kernel with a reusable by-value Args parameter block.

    pdl=True launches with programmatic stream serialization (Hopper+): the kernel may be
    scheduled while the stream's previous kernel still runs; the kernel itself waits for it
    (griddepcontrol.wait, cuda/collectives.cu) before touching memory."""

    def __init__(self, fn, args: Args, pdl: bool = False, extra=None):
        self.fn = fn
        self.args = args
        self.extra = extra  # a second by-value parameter (a Group), kept alive here
        blocks = (args,) if extra is None else (args, extra)
        self.params = (ctypes.c_void_p * len(blocks))(*[ctypes.addressof(b) for b in blocks])
        self.pdl = pdl
        if pdl:
            self._attr = _LaunchAttr(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
            ctypes.memmove(self._attr.value, ctypes.byref(ctypes.c_int(1)), 4)
            self._cfg = _LaunchConfig(gridDimY=1, gridDimZ=1, blockDimY=1, blockDimZ=1,
                                      attrs=ctypes.pointer(self._attr), numAttrs=1)
            self._cfg_ref = ctypes.byref(self._cfg)
            self._launch_ex = libcuda().cuLaunchKernelEx
        self._launch = libcuda().cuLaunchKernel

    def __call__(self, grid: int, block: int, stream: int) -> None:
        if self.pdl:
            cfg = self._cfg
            cfg.gridDimX, cfg.blockDimX, cfg.hStream = grid, block, stream
            res = self._launch_ex(self._cfg_ref, self.fn, self.params, None)
        else:
            res = self._launch(self.fn, grid, 1, 1, block, 1, 1, 0, stream, self.params, None)
        if res:
            check(res, "cuLaunchKernelEx" if self.pdl else "cuLaunchKernel")


class _KernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS_v2 (cuGraphKernelNodeSetParams_v2)."""

    _fields_ = [("func", ctypes.c_void_p),
                ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("kernelParams", ctypes.c_void_p),
                ("extra", ctypes.c_void_p), ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


_CAPTURE_ACTIVE = 1  # CU_STREAM_CAPTURE_STATUS_ACTIVE


class CaptureInfo:
    """cuStreamGetCaptureInfo_v3 (CUDA >= 12.3) and cuGraphKernelNodeSetParams_v2, for the
    capture fusion (fusion.py)."""

    def __init__(self):
        lib = libcuda()
        self._info = lib.cuStreamGetCaptureInfo_v3
        self._info.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint64),
                               ctypes.c_void_p, ctypes.POINTER(ctypes.POINTER(ctypes.c_void_p)),
                               ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        self._set = lib.cuGraphKernelNodeSetParams_v2
        self._set.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self._status, self._id = ctypes.c_int(), ctypes.c_uint64()
        self._deps, self._edges, self._ndeps = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_void_p(), ctypes.c_size_t()

    def query(self, stream: int) -> tuple[int, int | None]:
        """(capture id, the stream's one dependency node, or None where it has several or none)
        while `stream` is being captured; (0, None) otherwise."""
        check(self._info(stream, ctypes.byref(self._status), ctypes.byref(self._id), None,
                         ctypes.byref(self._deps), ctypes.byref(self._edges), ctypes.byref(self._ndeps)),
              "cuStreamGetCaptureInfo")
        if self._status.value != _CAPTURE_ACTIVE:
            return 0, None
        return self._id.value, (self._deps[0] if self._ndeps.value == 1 else None)

    def set_kernel_params(self, node: int, fn, grid: int, block: int, params) -> None:
        """Replace a captured kernel node's launch (the driver copies the parameter values)."""
        p = _KernelNodeParams(func=fn, gridDimX=grid, gridDimY=1, gridDimZ=1, blockDimX=block, blockDimY=1,
                              blockDimZ=1, sharedMemBytes=0, kernelParams=ctypes.cast(params, ctypes.c_void_p))
        check(self._set(node, ctypes.byref(p)), "cuGraphKernelNodeSetParams")


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
