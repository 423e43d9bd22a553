"""Run-time compilation of the library's kernels (cuda/) with NVRTC, cached on disk.

The same function compiles the kernels at run time (GPU) and in CI (no GPU needed):
`compile_module(source, dtype, arch)` returns cubin bytes.  Cache key: the text of every
file in cuda/, the options, the NVRTC version and the architecture.  Cache folder:
HPCCOLL_CACHE_DIR, else ~/.cache/hpccoll/kernels.  `compile_file` compiles a source outside
cuda/ with the same include path (the benchmarks' lab kernels, tests)."""
from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import sys
from pathlib import Path

from ..._abi import DTYPE_CODES, cuda_dir
from ...config import Config
from ...errors import HpccollError

#: the library's kernel sources (cuda/*.cu): what the wheel ships and the runtime compiles
SOURCES = ("collectives.cu", "persistent.cu", "sol.cu")


def _loaded_nvrtc() -> str | None:
    """Path of a libnvrtc already mapped into this process (e.g. CuPy's), else None."""
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.rstrip("\n").split(" ")[-1]
                if "/libnvrtc.so" in path:
                    return path
    except OSError:
        pass
    return None


def _cupy_nvrtc() -> str | None:
    """The libnvrtc CuPy uses (loaded by asking CuPy for its version), else None.

    One process must use ONE NVRTC: NVRTC dlopens its builtins library by soname, so a second
    libnvrtc of another build gets the first one's builtins.  On the GPU machine (2026-11-30)
    hpccoll had loaded the pip wheel's NVRTC and builtins first; CuPy's NVRTC then failed on an
    empty program ("default_program(1): error: unrecognized token") in every process that had
    opened hpccoll's CUDA backend, while NCCL- and MPI-only processes compiled fine."""
    loaded = _loaded_nvrtc()
    if loaded:
        return loaded
    try:
        from cupy_backends.cuda.libs import nvrtc as cupy_nvrtc

        cupy_nvrtc.getVersion()
    except Exception:  # noqa: BLE001 - no CuPy (CPU CI) or no NVRTC for it
        return None
    return _loaded_nvrtc()


def _candidates(shared: str | None):
    env = Config.from_env().nvrtc
    if env:
        yield env
    if shared:
        yield shared
    for base in sys.path:
        for pat in ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
                    "nvidia/cu12/lib/libnvrtc.so.12"):
            yield from glob.glob(os.path.join(base, pat))
    for name in ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"):
        yield name
    yield from sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"), reverse=True)


_lib = None


def _nvrtc():
    global _lib
    if _lib is None:
        errors = []
        shared = _cupy_nvrtc()
        for cand in _candidates(shared):
            try:
                # NVRTC dlopens its builtins library by name: load it first, from the same folder
                # (not for an NVRTC already loaded by CuPy: it has found its own).
                if cand != shared:
                    for builtins in glob.glob(os.path.join(os.path.dirname(cand), "libnvrtc-builtins.so*")):
                        if ".alt." not in builtins:
                            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                _lib = ctypes.CDLL(cand)
                break
            except OSError as exc:
                errors.append(f"{cand}: {exc}")
        else:
            raise HpccollError("NVRTC not found: pip install 'nvidia-cuda-nvrtc==13.0.*' (CUDA 13) or "
                               "nvidia-cuda-nvrtc-cu12, or set HPCCOLL_NVRTC=/path/libnvrtc.so")
    return _lib


def nvrtc_version() -> str:
    lib = _nvrtc()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def _check(lib, res, what, prog=None):
    if res != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        msg = lib.nvrtcGetErrorString(res).decode()
        log = ""
        if prog is not None:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode(errors="replace")
        raise HpccollError(f"NVRTC {what} failed: {msg}\n{log}")


def base_options(dtype: str) -> list[str]:
    """What every kernel on the headers is compiled with, the library's and extensions': C++17,
    the include path of cuda/, the dtype's HC_DTYPE, no fused multiply-add (deterministic
    reductions round every step as the host does)."""
    return ["-std=c++17", f"-I{cuda_dir()}", f"-DHC_DTYPE={DTYPE_CODES[dtype]}", "--fmad=false"]


def options(dtype: str, arch: str, extra=()) -> list[str]:
    """NVRTC options of a library module for `dtype` and `arch`."""
    return [f"--gpu-architecture={arch}", *base_options(dtype), "-lineinfo", *extra]


def _source_digest() -> str:
    h = hashlib.sha256()
    for f in sorted(cuda_dir().glob("*.cu*")) + [cuda_dir() / "hc_abi.h"]:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def cache_dir() -> Path:
    return Config.from_env().kernel_cache_dir()


def compile_module(source: str, dtype: str, arch: str = "sm_90", extra=(), use_cache: bool = True) -> bytes:
    """cubin of cuda/<source> for `dtype` and `arch` (e.g. "sm_90")."""
    return compile_file(cuda_dir() / source, dtype, arch, extra, use_cache)


def compile_source(src: bytes, name: str, opts, what: str | None = None) -> bytes:
    """cubin of the CUDA source `src` with exactly the NVRTC options `opts` (no cache); `what`
    names it in a compile error (default: "compile of <name>")."""
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), src, name.encode(), 0, None, None), "create")
    try:
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        _check(lib, lib.nvrtcCompileProgram(prog, len(opts), arr), what or f"compile of {name}", prog)
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
        buf = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetCUBIN(prog, buf), "cubin")
        return buf.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def compile_file(path, dtype: str, arch: str = "sm_90", extra=(), use_cache: bool = True) -> bytes:
    """cubin of the source at `path` (which may include cuda/'s headers) for `dtype` and `arch`."""
    path = Path(path)
    source = path.name
    opts = options(dtype, arch, extra)
    src = path.read_bytes()
    key = hashlib.sha256(b"\0".join([_source_digest().encode(), src, nvrtc_version().encode(),
                                      *(o.encode() for o in opts)])).hexdigest()[:32]
    cached = cache_dir() / f"{path.stem}-{dtype}-{arch}-{key}.cubin"
    if use_cache and cached.exists():
        return cached.read_bytes()
    cubin = compile_source(src, source, opts, f"compile of {source} ({dtype}, {arch})")
    if use_cache:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(cubin)
        os.replace(tmp, cached)  # atomic: ranks compiling at once never see half a file
    return cubin
