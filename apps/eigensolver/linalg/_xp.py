"""Array-module helpers: the one place that knows NumPy from CuPy.

Every GPU-specific call (cuBLAS trsm, cuSOLVER potrf, device sync) sits behind a small
function here so the solver reads the same on both and the GPU path can be tested alone."""
from __future__ import annotations

import contextlib
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
_raw_modules: dict = {}   # (file, CUDA device) -> CuPy RawModule


def _cupy():
    try:
        import cupy

        return cupy
    except Exception:  # ImportError or a broken CUDA install: host only
        return None


def raw_module(filename: str, cooperative: bool = False):
    """The CuPy RawModule of the CUDA source `filename` of this folder (sytrd_step.cu,
    stedc/dc_kernels.cu) on the current device, compiled once per device.  cooperative: its
    kernels launched by cuLaunchCooperativeKernel (every block of a grid resident at once, or
    the launch fails: sy2sb_kernels.cu's grid barrier)."""
    import cupy

    key = (filename, cupy.cuda.Device().id, cooperative)
    mod = _raw_modules.get(key)
    if mod is None:
        with open(os.path.join(HERE, filename)) as fh:
            mod = _raw_modules[key] = cupy.RawModule(code=fh.read(), options=module_options(),
                                                     enable_cooperative_groups=cooperative)
    return mod


_kept_streams: dict = {}   # (purpose, CUDA device) -> its non-blocking streams


def kept_streams(purpose: str, count: int = 1, priority: str = "default") -> list:
    """`count` non-blocking CuPy streams of this device for `purpose`, created once and kept
    (the tridiagonalization's capture stream, the divide and conquer's leaf streams); priority
    "high": the device's highest stream priority (its blocks are scheduled before those of
    default-priority streams when both wait for an SM)."""
    import cupy

    key = (purpose, cupy.cuda.Device().id, priority)
    streams = _kept_streams.get(key)
    if streams is None or len(streams) != count:
        level = -100 if priority == "high" else None   # CUDA clamps it to the device's highest
        streams = _kept_streams[key] = [cupy.cuda.Stream(non_blocking=True, priority=level) for _ in range(count)]
    return streams


def module_options() -> tuple[str, ...]:
    """Compiler options of raw_module: C++17; on the include path hpccoll's device headers
    (sytrd_step.cu's fused transfers use its sentinel protocol and bounded polls) and this
    folder (sytrd_abi.h)."""
    import hpccoll.ext

    return ("-std=c++17", f"-I{hpccoll.ext.include_dir()}", f"-I{HERE}")


def get_xp(*arrays):
    """numpy or cupy, from the array types (cupy.get_array_module when cupy is importable)."""
    cp = _cupy()
    if cp is None:
        return np
    return cp.get_array_module(*arrays)


def is_device(xp) -> bool:
    return xp is not np


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one GPU."""
    cp = _cupy()
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver, no device
        return False


def sync(xp) -> None:
    """Wait for queued device work (no-op on the host); used at phase boundaries only."""
    if is_device(xp):
        xp.cuda.get_current_stream().synchronize()


def to_host(a) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    return a.get()


def potrf_in_place(xp, a):
    """Overwrite the lower triangle of the column-major device matrix a (symmetric positive
    definite, lower triangle read) with its Cholesky factor: cuSOLVER potrf on a's own memory
    (no n x n copy; the strict upper triangle is left as it was).  Returns a device flag, true
    where a is not positive definite (devInfo != 0, or a pivot NaN or <= 0), read by the caller
    at its next host sync."""
    import cupy
    from cupy_backends.cuda.libs import cublas, cusolver

    if not _unit_rows(a):
        raise ValueError("potrf_in_place: `a` must be column-major (a Fortran-order array or a block of one)")
    n = a.shape[0]
    lda = _leading_dim(a)
    lower = cublas.CUBLAS_FILL_MODE_LOWER
    handle = _solver_handle()
    lwork = cusolver.dpotrf_bufferSize(handle, lower, n, a.data.ptr, lda)
    work = cupy.empty(max(1, lwork), dtype=cupy.float64)
    info = cupy.zeros((), dtype=cupy.int32)
    cusolver.dpotrf(handle, lower, n, a.data.ptr, lda, work.data.ptr, lwork, info.data.ptr)
    return (info != 0) | ~xp.all(xp.diagonal(a) > 0)


def trsm_in_place(xp, L, b, *, trans: bool = False) -> None:
    """b := L^-1 b (trans=False) or L^-T b (trans=True) for lower triangular L, both column-major
    device matrices: one cuBLAS trsm on b's own memory (no copy of b)."""
    from cupy_backends.cuda.libs import cublas

    for name, x in (("L", L), ("b", b)):
        if not _unit_rows(x):
            raise ValueError(f"trsm_in_place: `{name}` must be column-major (a Fortran-order array or a block of one)")
    m, nrhs = b.shape
    if m != L.shape[0] or L.shape[0] != L.shape[1]:
        raise ValueError(f"trsm_in_place: L is {L.shape[0]} x {L.shape[1]}, b has {m} rows: L must be {m} x {m}")
    if not b.size:
        return
    one = np.ones(1, dtype=np.float64)
    with _cublas_host_scalars() as handle:
        cublas.dtrsm(handle, cublas.CUBLAS_SIDE_LEFT, cublas.CUBLAS_FILL_MODE_LOWER,
                     cublas.CUBLAS_OP_T if trans else cublas.CUBLAS_OP_N, cublas.CUBLAS_DIAG_NON_UNIT,
                     m, nrhs, one.ctypes.data, L.data.ptr, _leading_dim(L), b.data.ptr, _leading_dim(b))


_loaded_libs: dict = {}   # "libcusolver" / "libcublas" -> ctypes handle on the copy CuPy loaded


def _loaded(name: str):
    """The library `name` (libcusolver, libcublas) that CuPy loaded, through ctypes, for the
    entry points CuPy does not bind (cusolverDnXsyevBatched, cublasDsymm, cublasDsyr2k).  None
    where it cannot be found."""
    lib = _loaded_libs.get(name)
    if lib is None:
        import ctypes

        from cupy_backends.cuda.libs import cublas, cusolver  # noqa: F401  (load the libraries)

        with open("/proc/self/maps") as fh:
            path = next((ln.split()[-1] for ln in fh if f"/{name}.so" in ln), None)
        lib = _loaded_libs[name] = ctypes.CDLL(path) if path else False
    return lib or None


def _cusolver():
    return _loaded("libcusolver")


def has_cusolver(entry: str) -> bool:
    """Whether the loaded cuSOLVER has `entry` (e.g. "cusolverDnXsyevBatched", CUDA 12.6.2 on)."""
    lib = _cusolver()
    return lib is not None and hasattr(lib, entry)


def _solver_handle():
    """CuPy's cuSOLVER handle, on the current stream."""
    import cupy
    from cupy_backends.cuda.libs import cusolver

    handle = cupy.cuda.device.get_cusolver_handle()
    cusolver.setStream(handle, cupy.cuda.get_current_stream().ptr)
    return handle


def syev_batched(xp, T):
    """Eigenvalues (batch x m, ascending) and eigenvectors of the batch T (batch x m x m,
    C order, symmetric): one cusolverDnXsyevBatched, in place; the eigenvectors of matrix b are
    the columns of the returned Q[b] (a view of T's memory).  RuntimeError if a matrix did not
    converge (one host sync)."""
    import ctypes

    lib = _cusolver()
    if T.ndim != 3 or T.shape[1] != T.shape[2] or not T.flags.c_contiguous or T.dtype != xp.float64:
        raise ValueError("syev_batched: `T` must be a C-contiguous float64 batch x m x m array")
    nb, m = T.shape[0], T.shape[1]
    W = xp.empty((nb, m))
    handle = ctypes.c_void_p(_solver_handle())
    params = ctypes.c_void_p()
    i64, size, ptr = ctypes.c_int64, ctypes.c_size_t, ctypes.c_void_p
    r64f, vectors, lower = 1, 1, 0                   # CUDA_R_64F, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER
    _ok(lib.cusolverDnCreateParams(ctypes.byref(params)), "cusolverDnCreateParams")
    try:
        dev, host = size(), size()
        _ok(lib.cusolverDnXsyevBatched_bufferSize(handle, params, vectors, lower, i64(m), r64f, ptr(T.data.ptr), i64(m),
                                                  r64f, ptr(W.data.ptr), r64f, ctypes.byref(dev), ctypes.byref(host),
                                                  i64(nb)), "cusolverDnXsyevBatched_bufferSize")
        work = xp.empty(max(dev.value, 1), dtype=xp.uint8)
        hwork = ctypes.create_string_buffer(max(host.value, 1))
        info = xp.zeros(nb, dtype=xp.int32)
        _ok(lib.cusolverDnXsyevBatched(handle, params, vectors, lower, i64(m), r64f, ptr(T.data.ptr), i64(m), r64f,
                                       ptr(W.data.ptr), r64f, ptr(work.data.ptr), size(dev.value), hwork,
                                       size(host.value), ptr(info.data.ptr), i64(nb)), "cusolverDnXsyevBatched")
    finally:
        lib.cusolverDnDestroyParams(params)
    bad = int(xp.count_nonzero(info))
    if bad:
        raise RuntimeError(f"syev_batched: cusolverDnXsyevBatched did not converge on {bad} of {nb} matrices")
    return W, T.transpose(0, 2, 1)                   # column-major storage: Q[b] = T[b]^T


def _ok(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"{call} failed with cusolverStatus {status}")


@contextlib.contextmanager
def _cublas_host_scalars():
    """CuPy's cuBLAS handle on the current stream, with alpha / beta read from host pointers
    for the duration (the caller's pointer mode restored after)."""
    import cupy
    from cupy_backends.cuda.libs import cublas

    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    try:
        yield handle
    finally:
        cublas.setPointerMode(handle, mode)


def symm_lower(xp, C, V, out) -> None:
    """out := C V for the symmetric C given by its lower triangle (column-major device arrays;
    the strict upper triangle is not read): one cuBLAS dsymm."""
    _symmetric_call("cublasDsymm_v2", C, V, out)


def syr2k_lower(xp, C, V, W) -> None:
    """C := C - V W^T - W V^T on C's lower triangle (the strict upper triangle is not touched;
    column-major device arrays): one cuBLAS dsyr2k."""
    _symmetric_call("cublasDsyr2k_v2", C, V, W)


def release_cached(xp) -> None:
    """On the GPU, hand the CuPy default pool's unused cached blocks back to the device (what
    free_all_blocks frees: nothing in use); on the host nothing.  Between the reduction and
    the tridiagonal solver the blocks of C and of the reduction's workspaces are free, and the
    eigenvectors and the solver's workspaces, of other sizes, would otherwise be carved out of
    them in pieces or added beside them: on one H100 at n = 16384 the two-stage solve's pool
    peaked 1.56 GiB above its live bytes without the release (docs/performance.md)."""
    if is_device(xp):
        xp.cuda.Device().synchronize()
        xp.get_default_memory_pool().free_all_blocks()


def zero_strict_upper(xp, C) -> None:
    """C's strict upper triangle := 0 in place (C square; on the GPU column-major): one
    elementwise kernel writing only those entries.  potrf.zero_above_diagonal does the same for
    any layout by two launches per block of it (512 at n = 16384 on one rank, blocks of 64)."""
    n = C.shape[0]
    if C.shape != (n, n):
        raise ValueError(f"zero_strict_upper: C must be square; got {C.shape}")
    if not is_device(xp):
        for j in range(1, n):
            C[:j, j] = 0.0
        return
    if not n:
        return
    if not _unit_rows(C):
        raise ValueError("zero_strict_upper: `C` must be column-major (a Fortran-order array or a block of one)")
    _zero_upper_kernel(xp)(xp.int64(n), C.T, size=n * n)


_zero_upper_kernels: dict = {}


def _zero_upper_kernel(cupy):
    """The elementwise kernel of zero_strict_upper, made once: its raw operand is C^T (row-major
    over C's column-major memory), element i being C's row i % n of column i / n (consecutive
    threads, consecutive addresses)."""
    if "k" not in _zero_upper_kernels:
        _zero_upper_kernels["k"] = cupy.ElementwiseKernel(
            "int64 n", "raw float64 Ct", "const ptrdiff_t at[] = {i / n, i % n}; if (at[1] < at[0]) Ct[at] = 0.0;",
            "hpccoll_zero_strict_upper")
    return _zero_upper_kernels["k"]


def _symmetric_call(entry: str, C, X, Y) -> None:
    import ctypes

    from cupy_backends.cuda.libs import cublas

    for name, x in (("C", C), ("X", X), ("Y", Y)):
        if not _unit_rows(x):
            raise ValueError(f"{entry}: `{name}` must be column-major (a Fortran-order array or a block of one)")
    m, k = X.shape
    if C.shape != (m, m) or Y.shape != X.shape:
        raise ValueError(f"{entry}: C is {C.shape}, the operands {X.shape} and {Y.shape}: C must be m x m "
                         "and the operands m x k alike")
    if not m or not k:
        return
    lib = _loaded("libcublas")
    i, p = ctypes.c_int, ctypes.c_void_p
    lower = cublas.CUBLAS_FILL_MODE_LOWER
    with _cublas_host_scalars() as handle:
        if entry == "cublasDsymm_v2":        # Y = 1 C X + 0 Y
            one, zero = ctypes.c_double(1.0), ctypes.c_double(0.0)
            status = lib.cublasDsymm_v2(p(handle), i(cublas.CUBLAS_SIDE_LEFT), i(lower), i(m), i(k), ctypes.byref(one),
                                        p(C.data.ptr), i(_leading_dim(C)), p(X.data.ptr), i(_leading_dim(X)),
                                        ctypes.byref(zero), p(Y.data.ptr), i(_leading_dim(Y)))
        else:                                # C = -1 (X Y^T + Y X^T) + 1 C
            minus, one = ctypes.c_double(-1.0), ctypes.c_double(1.0)
            status = lib.cublasDsyr2k_v2(p(handle), i(lower), i(cublas.CUBLAS_OP_N), i(m), i(k), ctypes.byref(minus),
                                         p(X.data.ptr), i(_leading_dim(X)), p(Y.data.ptr), i(_leading_dim(Y)),
                                         ctypes.byref(one), p(C.data.ptr), i(_leading_dim(C)))
    if status != 0:
        raise RuntimeError(f"{entry} failed with cublasStatus {status}")


def trsm(xp, L, b, *, trans: bool = False, lower: bool = True):
    """Solve L x = b (trans=False) or L^T x = b (trans=True) for triangular L (lower by default)."""
    if is_device(xp):
        from cupyx.scipy.linalg import solve_triangular  # cuBLAS trsm underneath
    else:
        from scipy.linalg import solve_triangular
    return solve_triangular(L, b, lower=lower, trans=1 if trans else 0, check_finite=False)


def gemm_acc(xp, C, A, B, alpha: float = -1.0) -> None:
    """C += alpha (A @ B) in place, C a 2-D view (a block of a Fortran-order array).

    GPU: one cuBLAS gemm with beta = 1 straight into C's memory, operands read through their
    strides (a C-order operand is the transpose of a Fortran-order one): no product temporary
    and no strided elementwise pass (a product temporary would be (n - k)^2 doubles per panel in
    the Cholesky and sygst updates, and subtracting a C-order product from a Fortran-order view
    runs far below memory bandwidth).  Host: the NumPy expression."""
    if C.size == 0:
        return
    if A.shape[1] == 0:
        return
    if not is_device(xp) or C.dtype != np.float64 or A.dtype != C.dtype or B.dtype != C.dtype:
        if alpha == -1.0:
            C -= A @ B
        else:
            C += alpha * (A @ B)
        return
    if not _unit_rows(C):  # not column-major: the product, then one pass
        C += alpha * (A @ B)
        return
    from cupy_backends.cuda.libs import cublas

    m, n = C.shape
    ta, lda, A = _blas_operand(xp, A)
    tb, ldb, B = _blas_operand(xp, B)
    ldc = _leading_dim(C)
    scalars = np.array([alpha, 1.0], dtype=np.float64)  # host pointers (pointer mode host)
    with _cublas_host_scalars() as handle:
        cublas.dgemm(handle, ta, tb, m, n, A.shape[1],
                     scalars.ctypes.data, A.data.ptr, lda, B.data.ptr, ldb,
                     scalars.ctypes.data + 8, C.data.ptr, ldc)


def _unit_rows(x) -> bool:
    """True when the 2-D array x is column-major with a valid leading dimension."""
    it = x.itemsize
    rows, cols = x.shape
    s0, s1 = x.strides
    return (s0 == it or rows == 1) and (cols == 1 or (s1 > 0 and s1 % it == 0 and s1 // it >= rows))


def _leading_dim(x) -> int:
    """BLAS's leading dimension of a column-major (_unit_rows) 2-D array: its column stride in
    elements (a single column's stride means nothing: its row count)."""
    rows, cols = x.shape
    return max(1, rows, x.strides[1] // x.itemsize if cols > 1 else rows)


def _blas_operand(xp, x):
    """(op, leading dimension, array) of a 2-D device operand for column-major BLAS: op N where
    its rows are unit-stride, op T where its columns are (x^T is then column-major), else a
    Fortran-order copy."""
    from cupy_backends.cuda.libs import cublas

    if _unit_rows(x):
        return cublas.CUBLAS_OP_N, _leading_dim(x), x
    if _unit_rows(x.T):
        return cublas.CUBLAS_OP_T, _leading_dim(x.T), x
    x = xp.asfortranarray(x)
    return cublas.CUBLAS_OP_N, _leading_dim(x), x


def geqrf_in_place(xp, a, tau, work=None):
    """LAPACK geqrf of the column-major device matrix a (m x k, a block of a Fortran-order array)
    on a's own memory: R on and above its diagonal, the Householder vectors below; tau (a
    contiguous float64 device array of at least min(m, k)) gets their scalars.  One cuSOLVER
    dgeqrf, queued (no host sync, no copy); work: a float64 device workspace of at least
    geqrf_work(a.shape) entries, or None (allocated here).  Returns the device info flag (nonzero
    only for an argument cuSOLVER rejects)."""
    from cupy_backends.cuda.libs import cusolver

    if not _unit_rows(a):
        raise ValueError("geqrf_in_place: `a` must be column-major (a Fortran-order array or a block of one)")
    m, k = a.shape
    if tau.size < min(m, k) or not tau.flags.c_contiguous or tau.dtype != xp.float64:
        raise ValueError(f"geqrf_in_place: `tau` must be a contiguous float64 array of at least {min(m, k)}")
    info = xp.zeros((), dtype=xp.int32)
    if not m or not k:
        return info
    handle = _solver_handle()
    lwork = geqrf_work(a.shape)
    if work is None or work.size < lwork:
        work = xp.empty(max(1, lwork), dtype=xp.float64)
    cusolver.dgeqrf(handle, m, k, a.data.ptr, _leading_dim(a), tau.data.ptr, work.data.ptr, lwork, info.data.ptr)
    return info


def geqrf_work(shape) -> int:
    """cuSOLVER dgeqrf's workspace (doubles) for an m x k matrix, its leading dimension m (the
    query does not depend on the matrix's contents or leading dimension)."""
    from cupy_backends.cuda.libs import cusolver

    m, k = shape
    return int(cusolver.dgeqrf_bufferSize(_solver_handle(), m, k, 0, max(1, m))) if m and k else 1


def geqrf(xp, a):
    """LAPACK geqrf of the 2-D array a: (qr, tau), qr F-order m x k holding R on and above its
    diagonal and the Householder vectors (unit diagonal implied) below, tau of length min(m, k).
    Host: scipy's dgeqrf; GPU: cuSOLVER through cupy.linalg.qr(mode="raw") (whose qr comes
    transposed, as NumPy's does)."""
    if is_device(xp):
        h, tau = xp.linalg.qr(a, mode="raw")
        return xp.asfortranarray(h.T), tau
    from scipy.linalg.lapack import dgeqrf

    qr, tau, _, info = dgeqrf(np.asfortranarray(a, dtype=np.float64))
    if info != 0:
        raise RuntimeError(f"dgeqrf: argument {-int(info)} was rejected")
    return qr, tau
