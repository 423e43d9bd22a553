"""Accuracy metrics (LAPACK xSGT01 style), digests and floating-point distances.

Work on numpy or cupy arrays (the norms are reduced to Python floats)."""
from __future__ import annotations

import hashlib

import numpy as np

from ._xp import get_xp, to_host

EPS = float(np.finfo(np.float64).eps)

#: how eigenvalue_error is defined (written into every result)
EIGENVALUE_ERROR_DEFINITION = "max_i |w_i - ref_i| / max_i |ref_i|"


def residual(A, B, X, w) -> float:
    """||A X - B X diag(w)||_F / (n ||A||_F ||X||_F eps)."""
    xp = get_xp(A, B, X, w)
    n = A.shape[0]
    R = A @ X - (B @ X) * w[None, :]
    den = n * float(xp.linalg.norm(A)) * float(xp.linalg.norm(X)) * EPS
    return float(xp.linalg.norm(R)) / den if den else float("nan")


def b_orthogonality(B, X) -> float:
    """||X^T B X - I||_F / (n eps)."""
    xp = get_xp(B, X)
    n = X.shape[1]
    G = X.T @ (B @ X)
    G[xp.arange(n), xp.arange(n)] -= 1.0
    return float(xp.linalg.norm(G)) / (n * EPS)


def eigenvalue_error(w, ref) -> float | None:
    """max |w - ref| / max |ref| (None when ref is None)."""
    if ref is None:
        return None
    w, ref = np.asarray(to_host(w), dtype=np.float64), np.asarray(to_host(ref), dtype=np.float64)
    scale = float(np.max(np.abs(ref))) or 1.0
    return float(np.max(np.abs(w - ref))) / scale


def sha256(a) -> str:
    """SHA-256 of the bytes of a as a C-contiguous float64 array."""
    h = np.ascontiguousarray(to_host(a), dtype=np.float64)
    return hashlib.sha256(h.tobytes()).hexdigest()


def _ordered(x: np.ndarray) -> np.ndarray:
    """float64 -> int64 monotone in the float order (so differences count ULPs); -0.0 == +0.0."""
    i = np.ascontiguousarray(x, dtype=np.float64).view(np.int64)
    return np.where(i < 0, np.int64(-(2 ** 63)) - i, i)


def ulp_distance(a, b) -> np.ndarray:
    """Number of representable float64 values between a and b, elementwise (float64 counts)."""
    oa, ob = _ordered(np.asarray(a)), _ordered(np.asarray(b))
    same = (oa >= 0) == (ob >= 0)  # same sign: the int64 difference cannot overflow
    with np.errstate(over="ignore"):
        exact = np.abs(np.where(same, oa - ob, 0)).astype(np.float64)
    far = np.abs(oa.astype(np.float64)) + np.abs(ob.astype(np.float64))
    return np.where(same, exact, far)


def align_signs(X, X0) -> np.ndarray:
    """X with each column's sign flipped to agree with the same column of X0."""
    s = np.sign(np.sum(X * X0, axis=0))
    s[s == 0] = 1.0
    return X * s[None, :]


def clusters(w, rtol: float = 1e-7) -> list[tuple[int, int]]:
    """Index ranges [i, j) of ascending eigenvalues whose neighbours differ by < rtol * max|w|
    (singletons left out)."""
    w = np.asarray(w, dtype=np.float64)
    if w.size < 2:
        return []
    tol = rtol * (float(np.max(np.abs(w))) or 1.0)
    out, start = [], 0
    for i in range(1, w.size + 1):
        if i == w.size or w[i] - w[i - 1] >= tol:
            if i - start > 1:
                out.append((start, i))
            start = i
    return out


def max_subspace_angle(X, X0, groups) -> float | None:
    """Largest principal angle (radians) between matching cluster subspaces of X and X0."""
    from scipy.linalg import subspace_angles

    if not groups:
        return None
    return float(max(np.max(subspace_angles(X[:, i:j], X0[:, i:j])) for i, j in groups))
