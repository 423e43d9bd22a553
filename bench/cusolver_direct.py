"""Reference solvers of A x = lambda B x on one device, for bench/eig_vs_cusolver.py.

  prepare_sygvd   cuSOLVER's cusolverDnDsygvd (itype 1, lower, jobz vector or novector), called
                  through ctypes on the libcusolver that CuPy loaded; host: scipy.linalg.eigh(A, B,
                  driver="gvd"), which is LAPACK dsygvd
  prepare_sygvdx  cusolverDnDsygvdx, the eigenpairs lo..hi (range I, vectors); host: scipy's
                  subset_by_index (LAPACK dsygvx)
  prepare_anchor  the composed path of apps/eigensolver/anchors.py: Cholesky, two triangular
                  solves, the symmetric eigensolver (eigh, or eigvalsh without vectors),
                  back-substitution X = L^-T Z; each step a phase of the caller's clock

Each prepare_* does the untimed part (copies that cuSOLVER overwrites, its workspace) and
returns run(), the call to time; run() returns (w, X), X None without vectors.  A and B are
never modified.  cuSOLVER's workspace size comes from its *_bufferSize, whose lwork is a 32-bit
int: SizeLimit where it cannot hold the size (the caller then measures the anchor instead)."""
from __future__ import annotations

import ctypes

import numpy as np

INT32_MAX = 2**31 - 1
# cusolver_common.h / cublas_api.h enumerators
EIG_TYPE_1 = 1                       # A x = lambda B x
EIG_MODE_NOVECTOR, EIG_MODE_VECTOR = 0, 1
EIG_RANGE_I = 1002                   # eigenpairs il..iu (1-based, inclusive)
FILL_MODE_LOWER = 0


class SizeLimit(RuntimeError):
    """cuSOLVER's 32-bit interface cannot take this n (its workspace size overflows an int)."""


def lapack_syevd_lwork(n: int, vectors: bool) -> int:
    """LAPACK dsyevd's minimal workspace in doubles (1 + 6n + 2n^2 with vectors, 2n + 1 without):
    a lower bound on what a sygvd built on syevd asks for."""
    return 1 + 6 * n + 2 * n * n if vectors else 2 * n + 1


_lib = None


def cusolver_lib():
    """libcusolver (the copy CuPy loaded, found in /proc/self/maps) through ctypes, with the
    argument types of the four entry points used here declared."""
    global _lib
    if _lib is None:
        from cupy_backends.cuda.libs import cusolver  # noqa: F401  (loads the library)

        with open("/proc/self/maps") as fh:
            path = next((ln.split()[-1] for ln in fh if "/libcusolver.so" in ln), None)
        if path is None:
            raise RuntimeError("cusolver_direct: CuPy loaded no libcusolver.so (see /proc/self/maps): "
                               "install the CuPy wheel of this CUDA major version")
        lib = ctypes.CDLL(path)
        p, i, d, ip = ctypes.c_void_p, ctypes.c_int, ctypes.c_double, ctypes.POINTER(ctypes.c_int)
        # (handle, itype, jobz, uplo, n, A, lda, B, ldb, W, ...)
        lib.cusolverDnDsygvd_bufferSize.argtypes = [p, i, i, i, i, p, i, p, i, p, ip]
        lib.cusolverDnDsygvd.argtypes = [p, i, i, i, i, p, i, p, i, p, p, i, p]
        # (handle, itype, jobz, range, uplo, n, A, lda, B, ldb, vl, vu, il, iu, meig, W, ...)
        lib.cusolverDnDsygvdx_bufferSize.argtypes = [p, i, i, i, i, i, p, i, p, i, d, d, i, i, ip, p, ip]
        lib.cusolverDnDsygvdx.argtypes = [p, i, i, i, i, i, p, i, p, i, d, d, i, i, ip, p, p, i, p]
        for name in ("cusolverDnDsygvd_bufferSize", "cusolverDnDsygvd", "cusolverDnDsygvdx_bufferSize",
                     "cusolverDnDsygvdx"):
            getattr(lib, name).restype = ctypes.c_int
        _lib = lib
    return _lib


def cusolver_version() -> int | None:
    """cusolverGetVersion of the loaded library (e.g. 12001), None where it cannot be read."""
    try:
        v = ctypes.c_int()
        return v.value if cusolver_lib().cusolverGetVersion(ctypes.byref(v)) == 0 else None
    except Exception:  # noqa: BLE001 - informational only
        return None


def _handle() -> ctypes.c_void_p:
    """CuPy's cuSOLVER handle, on the current stream."""
    import cupy
    from cupy_backends.cuda.libs import cusolver

    handle = cupy.cuda.device.get_cusolver_handle()
    cusolver.setStream(handle, cupy.cuda.get_current_stream().ptr)
    return ctypes.c_void_p(handle)


def _ok(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"{call} returned cusolverStatus {status}")


def _workspace(status: int, lwork: int, call: str) -> int:
    """lwork from a bufferSize call; SizeLimit where the call failed or lwork is not positive (a
    size that wrapped past 2^31; one that wrapped past 2^32, a workspace of 34 GB and more, the
    callers keep out by checking LAPACK's minimum first)."""
    if status != 0 or lwork <= 0:
        raise SizeLimit(f"{call}: status {status}, lwork {lwork} (an int32): the 32-bit workspace size "
                        "overflows at this n")
    return lwork


def prepare_sygvd(xp, A, B, vectors: bool):
    """run() for dsygvd of (A, B): cuSOLVER on device arrays, LAPACK through scipy on the host."""
    if xp is np:
        import scipy.linalg as sl

        def run_host():
            out = sl.eigh(A, B, eigvals_only=not vectors, driver="gvd", check_finite=False)
            return (out[0], out[1]) if vectors else (out, None)
        return run_host
    n = A.shape[0]
    need = lapack_syevd_lwork(n, vectors)
    if need > INT32_MAX:   # cuSOLVER's int lwork cannot hold it: its bufferSize would wrap
        raise SizeLimit(f"dsygvd: LAPACK's minimal syevd workspace at n = {n} is {need} doubles, beyond "
                        f"the 32-bit lwork ({INT32_MAX})")
    lib, h = cusolver_lib(), _handle()
    jobz = EIG_MODE_VECTOR if vectors else EIG_MODE_NOVECTOR
    a, b = xp.array(A, order="F", copy=True), xp.array(B, order="F", copy=True)  # overwritten by the call
    w = xp.empty(n, dtype=xp.float64)
    lw = ctypes.c_int(0)
    st = lib.cusolverDnDsygvd_bufferSize(h, EIG_TYPE_1, jobz, FILL_MODE_LOWER, n, a.data.ptr, n, b.data.ptr, n,
                                         w.data.ptr, ctypes.byref(lw))
    lwork = _workspace(st, lw.value, "cusolverDnDsygvd_bufferSize")
    work = xp.empty(lwork, dtype=xp.float64)
    info = xp.zeros((), dtype=xp.int32)

    def run():
        _ok(lib.cusolverDnDsygvd(h, EIG_TYPE_1, jobz, FILL_MODE_LOWER, n, a.data.ptr, n, b.data.ptr, n, w.data.ptr,
                                 work.data.ptr, lwork, info.data.ptr), "cusolverDnDsygvd")
        if int(info):   # > n: B's leading minor info - n is not positive definite
            raise RuntimeError(f"cusolverDnDsygvd: devInfo {int(info)}")
        return w, (a if vectors else None)
    run.workspace_bytes = 8 * lwork
    return run


def prepare_sygvdx(xp, A, B, lo: int, hi: int):
    """run() for the eigenpairs lo..hi (0-based, inclusive) of (A, B), with vectors: dsygvdx
    (range I) on device arrays, LAPACK dsygvx through scipy on the host."""
    if xp is np:
        import scipy.linalg as sl

        return lambda: sl.eigh(A, B, subset_by_index=(lo, hi), driver="gvx", check_finite=False)
    n = A.shape[0]
    if lapack_syevd_lwork(n, True) > INT32_MAX:   # as dsygvd: a wrapped lwork would be silently wrong
        raise SizeLimit(f"dsygvdx: at n = {n} a syevd-sized workspace overflows the 32-bit lwork ({INT32_MAX})")
    lib, h = cusolver_lib(), _handle()
    a, b = xp.array(A, order="F", copy=True), xp.array(B, order="F", copy=True)
    w = xp.empty(n, dtype=xp.float64)
    lw, meig = ctypes.c_int(0), ctypes.c_int(0)
    args = (h, EIG_TYPE_1, EIG_MODE_VECTOR, EIG_RANGE_I, FILL_MODE_LOWER, n, a.data.ptr, n, b.data.ptr, n,
            0.0, 0.0, lo + 1, hi + 1, ctypes.byref(meig), w.data.ptr)
    lwork = _workspace(lib.cusolverDnDsygvdx_bufferSize(*args, ctypes.byref(lw)), lw.value,
                       "cusolverDnDsygvdx_bufferSize")
    work = xp.empty(lwork, dtype=xp.float64)
    info = xp.zeros((), dtype=xp.int32)

    def run():
        _ok(lib.cusolverDnDsygvdx(*args, work.data.ptr, lwork, info.data.ptr), "cusolverDnDsygvdx")
        if int(info):
            raise RuntimeError(f"cusolverDnDsygvdx: devInfo {int(info)}")
        k = hi - lo + 1      # range I returns exactly these; meig (host) says so once the call is done
        if meig.value != k:
            raise RuntimeError(f"cusolverDnDsygvdx: {meig.value} eigenpairs for {lo + 1}..{hi + 1}")
        return w[:k], a[:, :k]
    run.workspace_bytes = 8 * lwork
    return run


def prepare_anchor(xp, A, B, vectors: bool, clock):
    """run() for the composed path (apps/eigensolver/anchors.py): potrf, sygst as two triangular
    solves, syevd (eigh; eigvalsh without vectors), trsm; each step timed as a phase of `clock`
    (an object with phase(name), a context manager).  Intermediates are dropped as soon as the
    next step has what it needs."""
    if xp is np:
        from scipy.linalg import solve_triangular
    else:
        from cupyx.scipy.linalg import solve_triangular

    def run():
        with clock.phase("potrf"):
            L = xp.linalg.cholesky(B)
        with clock.phase("sygst"):
            Y = solve_triangular(L, A, lower=True)
            C = solve_triangular(L, Y.T, lower=True)
            del Y
            C = (C + C.T) / 2
        with clock.phase("syevd"):
            if not vectors:
                return xp.linalg.eigvalsh(C), None
            w, Z = xp.linalg.eigh(C)
            del C
        with clock.phase("trsm"):
            X = solve_triangular(L, Z, lower=True, trans=1)
        return w, X
    return run
