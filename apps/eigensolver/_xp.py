"""Array-module helpers: the one place that knows NumPy from CuPy.

Every GPU-specific call (cuBLAS trsm, cuSOLVER potrf, device sync) sits behind a small
function here so the solver reads the same on both and the GPU path can be tested alone."""
from __future__ import annotations

import numpy as np


def _cupy():
    try:
        import cupy

        return cupy
    except Exception:  # ImportError or a broken CUDA install: host only
        return None


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


def trsm(xp, L, b, *, trans: bool = False):
    """Solve L x = b (trans=False) or L^T x = b (trans=True) for lower-triangular L."""
    if is_device(xp):
        from cupyx.scipy.linalg import solve_triangular  # cuBLAS trsm underneath
    else:
        from scipy.linalg import solve_triangular
    return solve_triangular(L, b, lower=True, trans=1 if trans else 0, check_finite=False)


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
