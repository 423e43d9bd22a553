"""Array-module helpers: the one place that knows NumPy from CuPy.

Every GPU-specific call (cuBLAS trsm, cuSOLVER potrf, device sync) sits behind a small
function here so the solver reads the same on both and the GPU path can be tested alone."""
from __future__ import annotations

import contextlib
import os

import numpy as np

_raw_modules: dict = {}   # (file, CUDA device) -> CuPy RawModule


def _cupy():
    try:
        import cupy

        return cupy
    except Exception:  # ImportError or a broken CUDA install: host only
        return None


def raw_module(filename: str, defines: tuple[str, ...] = ()):
    """The CuPy RawModule of this package's CUDA source `filename` (sytrd_step.cu,
    dc_kernels.cu) on the current device with the macros `defines` ("NAME=VALUE"), compiled
    once per device and macros."""
    import cupy

    key = (filename, cupy.cuda.Device().id, defines)
    mod = _raw_modules.get(key)
    if mod is None:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), filename)) as fh:
            mod = _raw_modules[key] = cupy.RawModule(code=fh.read(), options=module_options(defines))
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


def module_options(defines: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Compiler options of raw_module: C++17, hpccoll's device headers on the include path
    (sytrd_step.cu's fused transfers use its sentinel protocol and bounded polls), the macros."""
    import hpccoll.ext

    return ("-std=c++17", f"-I{hpccoll.ext.include_dir()}") + tuple(f"-D{d}" for d in defines)


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


def potrf(xp, a):
    """Lower Cholesky factor of the small SPD block a; NaNs (never an exception) if not SPD.

    cuSOLVER potrf reports failure through devInfo (CuPy then fills NaN or warns); numpy
    raises: both become NaNs so every rank can agree on the failure after the next Bcast."""
    if is_device(xp):
        import cupyx

        with cupyx.errstate(linalg="ignore"):  # GPU: no host sync for devInfo
            return xp.linalg.cholesky(a)
    try:
        return np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        return np.full_like(a, np.nan)


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


_cusolver_lib = None      # ctypes handle on the libcusolver CuPy loaded


def _cusolver():
    """libcusolver (the copy CuPy loaded) through ctypes, for the entry points CuPy does not
    bind: cusolverDnXsyevBatched and cusolverDnDormtr.  None where it cannot be found."""
    global _cusolver_lib
    if _cusolver_lib is None:
        import ctypes

        from cupy_backends.cuda.libs import cusolver  # noqa: F401  (loads the library)

        with open("/proc/self/maps") as fh:
            path = next((ln.split()[-1] for ln in fh if "/libcusolver.so" in ln), None)
        _cusolver_lib = ctypes.CDLL(path) if path else False
    return _cusolver_lib or None


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


def ormtr_in_place(xp, V, tau, Z) -> None:
    """Z := Q Z with Q = H_0 ... H_{n-2} of a lower sytrd (reflector j in V[j+1:, j], unit
    first entry implied; tau[:n-1] its scalars): one cusolverDnDormtr on Z's own memory.
    V and Z column-major device matrices, V n x n, Z n x k.  Not the solver's way (householder.
    ormtr's blocks measured faster on one H200: bench/onerank_lab.py), its reference there."""
    import ctypes

    lib = _cusolver()
    for name, x in (("V", V), ("Z", Z)):
        if not _unit_rows(x):
            raise ValueError(f"ormtr_in_place: `{name}` must be column-major (a Fortran-order array or a block of one)")
    n, k = Z.shape
    if V.shape != (n, n) or tau.shape[0] < n - 1:
        raise ValueError(f"ormtr_in_place: V is {V.shape}, tau has {tau.shape[0]} entries, Z has {n} rows: "
                         f"need V {n} x {n} and n - 1 scalars")
    if n < 2 or not k:
        return
    handle, ptr, lwork = ctypes.c_void_p(_solver_handle()), ctypes.c_void_p, ctypes.c_int()
    left, lower, no_trans = 0, 0, 0                  # CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N
    args = (handle, left, lower, no_trans, n, k, ptr(V.data.ptr), _leading_dim(V), ptr(tau.data.ptr),
            ptr(Z.data.ptr), _leading_dim(Z))
    _ok(lib.cusolverDnDormtr_bufferSize(*args, ctypes.byref(lwork)), "cusolverDnDormtr_bufferSize")
    work = xp.empty(max(lwork.value, 1))
    info = xp.zeros(1, dtype=xp.int32)
    _ok(lib.cusolverDnDormtr(*args, ptr(work.data.ptr), lwork.value, ptr(info.data.ptr)), "cusolverDnDormtr")


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
    and no strided elementwise pass.  That temporary was (n - k)^2 doubles per panel in the
    Cholesky and sygst updates, and subtracting a C-order product from a Fortran-order view
    ran far below memory bandwidth.  Host: the NumPy expression."""
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


def sygst_block(xp, a, L):
    """C = L^-1 a L^-T for a small symmetric block a (its lower triangle is read) and lower
    triangular L, returned symmetric (both triangles, from C's lower one).  Host: LAPACK dsygst
    (unblocked for a block this size, as inside LAPACK's blocked sygst); GPU: two triangular
    solves."""
    if is_device(xp):
        low = xp.tril(a)
        sym = low + xp.tril(a, -1).T
        c = trsm(xp, L, trsm(xp, L, sym).T)
    else:
        from scipy.linalg.lapack import dsygst

        c, info = dsygst(np.asfortranarray(a, dtype=np.float64), np.asfortranarray(L, dtype=np.float64),
                         itype=1, lower=1)
        if info != 0:
            raise RuntimeError(f"dsygst failed with info={info}")
    return xp.tril(c) + xp.tril(c, -1).T


def tridiagonal_matrix(xp, d, e):
    """The dense symmetric tridiagonal matrix with diagonal d and off-diagonal e."""
    T = xp.diag(d)
    if d.shape[0] > 1:
        i = xp.arange(d.shape[0] - 1)
        T[i + 1, i] = e
        T[i, i + 1] = e
    return T


def tridiagonal_eigh(d: np.ndarray, e: np.ndarray):
    """Eigenvalues (ascending) and eigenvectors of the symmetric tridiagonal (d, e): LAPACK dstevd
    (divide and conquer, the 'stedc' step), on the host, float64."""
    from scipy.linalg.lapack import dstevd

    n = d.size
    if n == 1:
        return d.copy(), np.ones((1, 1))
    w, z, info = dstevd(np.array(d, dtype=np.float64), np.array(e, dtype=np.float64), compute_v=1)
    if info != 0:
        raise RuntimeError(f"dstevd failed with info={info}")
    return w, z


# -- small fused steps of the Householder tridiagonalization ----------------------------------
# On the GPU each is one CuPy ElementwiseKernel (one launch instead of ~10 for the scalar
# chain); on the host the same arithmetic in NumPy, in the same order.  HH_SCALARS_BODY is
# plain C so tests/unit/test_eigensolver_gpu_code.py can compile it with NVRTC without a GPU.
HH_SCALARS_BODY = """
    double xnorm = sqrt(xn2);
    bool flat = xnorm == 0.0;
    double b = flat ? alpha : -copysign(hypot(alpha, xnorm), alpha);
    tau = flat ? 0.0 : (b - alpha) / b;
    scale = flat ? 0.0 : 1.0 / (alpha - b);
    beta = b;
    dout = din;
    one = 1.0;
"""
W_UPDATE_BODY = "out = w + ((-0.5 * t) * dot) * v;"

_kernels: dict = {}


def _ew(name: str):
    k = _kernels.get(name)
    if k is None:
        import cupy

        if name == "hh":
            k = cupy.ElementwiseKernel(
                "float64 alpha, float64 xn2, float64 din",
                "float64 tau, float64 beta, float64 scale, float64 dout, float64 one",
                HH_SCALARS_BODY, "hpccoll_eig_hh_scalars")
        else:
            k = cupy.ElementwiseKernel("float64 w, float64 t, float64 dot, float64 v", "float64 out",
                                       W_UPDATE_BODY, "hpccoll_eig_w_update")
        _kernels[name] = k
    return k


def householder(xp, col, buf, scale) -> None:
    """LAPACK dlarfg on col[1:] (col = [d_j, alpha, x...], length m + 1 >= 2), packed into the
    broadcast buffer buf = [v (m), d_j, tau, beta]: v[0] = 1, v[1:] = x * scale.  Scalars stay
    on the device (no host sync).  `scale` is a 1-element scratch array."""
    m = col.size - 1
    x = col[2:]
    xn2 = x @ x if m > 1 else xp.zeros((), dtype=col.dtype)   # numpy norm = sqrt(x . x)
    if is_device(xp):
        _ew("hh")(col[1], xn2, col[0], buf[m + 1:m + 2], buf[m + 2:m + 3], scale, buf[m:m + 1], buf[0:1])
    else:  # the same arithmetic, one array op at a time
        alpha = col[1]
        xnorm = xp.sqrt(xn2)
        flat = xnorm == 0
        beta = xp.where(flat, alpha, -xp.copysign(xp.hypot(alpha, xnorm), alpha))
        buf[m + 1] = xp.where(flat, 0.0, (beta - alpha) / xp.where(flat, 1.0, beta))
        buf[m + 2] = beta
        scale[0] = xp.where(flat, 0.0, 1.0 / xp.where(flat, 1.0, alpha - beta))
        buf[m] = col[0]
        buf[0] = 1.0
    if m > 1:
        xp.multiply(x, scale[0], out=buf[1:m])


def w_update(xp, w, t, v, out) -> None:
    """out = w + (-0.5 t (w . v)) v  (LAPACK latrd's w correction), one fused kernel on the GPU."""
    dot = w @ v
    if is_device(xp):
        _ew("w")(w, t, dot, v, out)
    else:
        out[...] = w + ((-0.5 * t) * dot) * v
