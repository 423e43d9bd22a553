"""Test problems A x = lambda B x, generated deterministically from a seed (float64, host numpy).

known      A = L Q diag(lam) Q^T L^T, B = L L^T of condition cond_b: eigenvalues lam and
           eigenvectors X = L^-T Q known by construction (up to the rounding of forming A, B).
clustered  as known, lam in tight clusters (relative spread 1e-10 inside a cluster).
wilkinson  as known, lam = the spectrum of the Wilkinson matrix W_n^+ (near-degenerate pairs).
random     symmetric Gaussian A, SPD B of condition cond_b; spectrum unknown.
file:A.npy,B.npy   matrices from files; spectrum unknown."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("known", "clustered", "wilkinson", "random")


@dataclass
class Problem:
    name: str
    A: np.ndarray
    B: np.ndarray
    eigenvalues: np.ndarray | None  # ascending, when known by construction
    Q: np.ndarray | None = None     # orthogonal factor: X_true = L^-T Q (columns in ascending order)

    @property
    def n(self) -> int:
        return self.A.shape[0]


# The builders below take the array module `xp` (NumPy by default; with CuPy and a CuPy
# Generator they build a problem on the GPU: bench/make_problem_gpu.py, other bits than NumPy's).
def random_orthogonal(n: int, rng, xp=np):
    """Haar-distributed orthogonal matrix (QR of a Gaussian with the sign fix)."""
    q, r = xp.linalg.qr(rng.standard_normal((n, n)))
    return q * xp.sign(xp.diag(r))[None, :]


def spd_matrix(n: int, cond: float, rng, xp=np):
    """Symmetric positive definite matrix with 2-norm condition number cond (eigenvalues 1 .. 1/cond)."""
    if cond < 1:
        raise ValueError(f"cond_b={cond} must be >= 1")
    s = xp.asarray(np.geomspace(1.0, 1.0 / cond, n) if n > 1 else np.ones(1))
    q = random_orthogonal(n, rng, xp)
    b = (q * s[None, :]) @ q.T
    return (b + b.T) / 2


def spread_spectrum(n: int, rng, xp=np):
    """Eigenvalues of both signs over three decades of magnitude, ascending."""
    mag = xp.asarray(np.geomspace(1e-3, 1.0, n))
    sign = xp.where(rng.random(n) < 0.5, -1.0, 1.0)
    return xp.sort(sign * mag)


def clustered_spectrum(n: int, rng: np.random.Generator, cluster: int = 8,
                       spread: float = 1e-10) -> np.ndarray:
    """n eigenvalues in clusters of `cluster` values, centres in [-1, 1], relative spread `spread`."""
    k = max(1, -(-n // cluster))
    centres = np.linspace(-1.0, 1.0, k)
    lam = np.repeat(centres, cluster)[:n] + spread * rng.uniform(-1, 1, size=n)
    return np.sort(lam)


def wilkinson_spectrum(n: int) -> np.ndarray:
    """Eigenvalues of W_n^+ (diagonal |i - (n-1)/2|, off-diagonal 1) scaled to max 1: its large
    eigenvalues come in pairs agreeing to many digits."""
    from scipy.linalg import eigh_tridiagonal

    if n == 1:
        return np.ones(1)
    d = np.abs(np.arange(n) - (n - 1) / 2.0)
    lam = eigh_tridiagonal(d, np.ones(n - 1), eigvals_only=True)
    return np.sort(lam / np.max(np.abs(lam)))


def with_spectrum(name: str, lam, cond_b: float, rng, xp=np) -> Problem:
    """A = L Q diag(lam) Q^T L^T, B = L L^T of condition cond_b (arrays of xp)."""
    n = lam.size
    B = spd_matrix(n, cond_b, rng, xp)
    L = xp.linalg.cholesky(B)
    Q = random_orthogonal(n, rng, xp)
    LQ = L @ Q
    A = (LQ * lam[None, :]) @ LQ.T
    return Problem(name, (A + A.T) / 2, B, xp.sort(lam), Q)


def make_problem(kind: str, n: int, *, cond_b: float = 1e3, seed: int = 0) -> Problem:
    """The problem named `kind` (see the module doc) of order n; identical bits for equal arguments."""
    rng = np.random.default_rng(seed)
    if kind.startswith("file:"):
        try:
            fa, fb = kind[5:].split(",")
        except ValueError:
            raise ValueError(f"problem {kind!r}: use file:A.npy,B.npy") from None
        A, B = np.load(fa).astype(np.float64), np.load(fb).astype(np.float64)
        if A.shape != B.shape or A.ndim != 2 or A.shape[0] != A.shape[1]:
            raise ValueError(f"problem {kind!r}: A {A.shape} and B {B.shape} must be equal square matrices")
        return Problem(kind, np.ascontiguousarray(A), np.ascontiguousarray(B), None)
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    if kind == "known":
        return with_spectrum(kind, spread_spectrum(n, rng), cond_b, rng)
    if kind == "clustered":
        return with_spectrum(kind, clustered_spectrum(n, rng), cond_b, rng)
    if kind == "wilkinson":
        return with_spectrum(kind, wilkinson_spectrum(n), cond_b, rng)
    if kind == "random":
        A = rng.standard_normal((n, n)) / np.sqrt(n)
        return Problem(kind, (A + A.T) / 2, spd_matrix(n, cond_b, rng), None)
    raise ValueError(f"problem {kind!r}: use one of {', '.join(KINDS)} or file:A.npy,B.npy")


def cached_problem(kind: str, n: int, *, cond_b: float = 1e3, seed: int = 0,
                   cache_dir: str | None = None) -> Problem:
    """make_problem, memoised as .npy files under cache_dir (None: no cache).

    Generating a problem costs two n x n QRs (~20 s at n = 8192); a benchmark that launches
    several configurations on the same problem reads it back instead.  Written atomically."""
    import os

    if not cache_dir or kind.startswith("file:"):
        return make_problem(kind, n, cond_b=cond_b, seed=seed)
    stem = os.path.join(cache_dir, f"{kind}_n{n}_cond{cond_b!r}_seed{seed}")
    names = {"A": stem + "_A.npy", "B": stem + "_B.npy", "w": stem + "_w.npy"}
    if all(os.path.exists(p) for p in names.values()):
        w = np.load(names["w"])
        return Problem(kind, np.load(names["A"]), np.load(names["B"]), w if w.size else None)
    prob = make_problem(kind, n, cond_b=cond_b, seed=seed)
    os.makedirs(cache_dir, exist_ok=True)
    arrays = {"A": prob.A, "B": prob.B,
              "w": prob.eigenvalues if prob.eigenvalues is not None else np.zeros(0)}
    for key, path in names.items():
        tmp = f"{path}.tmp{os.getpid()}.npy"
        np.save(tmp, arrays[key])
        os.replace(tmp, path)
    return prob
