"""Accuracy metrics (LAPACK xSGT01 style), digests and floating-point distances.

Work on numpy or cupy arrays (the norms are reduced to Python floats).  `residual` and
`b_orthogonality` take whole matrices; `distributed_accuracy` computes the same two numbers
from the ranks' column blocks without gathering an n x n matrix anywhere.  Both are computed
for A' = 2^a A, B' = 2^b B, X' = 2^(-b/2) X, w' = 2^(a-b) w with the largest magnitudes of A'
and B' in [1/4, 1) (scaling.exponent; b even): the same numbers (they are invariant under that
scaling), without overflow or underflow in the products and sums of squares for any A and B
of float64 whose eigenvalues are finite."""
from __future__ import annotations

import hashlib

import numpy as np

from .linalg import scaling
from .linalg._xp import get_xp, to_host

EPS = float(np.finfo(np.float64).eps)

#: how eigenvalue_error is defined (written into every result)
EIGENVALUE_ERROR_DEFINITION = "max_i |w_i - ref_i| / max_i |ref_i|"
#: how it is defined for a subset of the eigenpairs (written into such results)
SUBSET_EIGENVALUE_ERROR_DEFINITION = ("max_{lo <= i <= hi} |w_i - ref_i| / max_i |ref_i|: the subset lo..hi "
                                      "against the same indices of the whole reference spectrum, on the "
                                      "scale of the whole spectrum")
#: every metric a run records, defined (written into every result and the report)
DEFINITIONS = {
    "residual": "||A X - B X diag(w)||_F / (n ||A||_F ||X||_F eps), eps = 2^-52: in units of n eps; "
                "O(1) or less for a backward-stable solve",
    "b_orthogonality": "||X^T B X - I||_F / (n eps), eps = 2^-52: in units of n eps; O(1) to O(cond(B)) "
                       "for a stable solve; with a subset of k eigenpairs X is n x k and the unit k eps",
    "eigenvalue_error": EIGENVALUE_ERROR_DEFINITION + ", ref = the spectrum A and B were built with "
                        "(known, clustered, wilkinson; its rounding in forming A and B contributes "
                        "O(eps cond(B)))",
    "eigenvalue_error_vs_scipy": EIGENVALUE_ERROR_DEFINITION + ", ref = scipy.linalg.eigh(A, B) on rank 0 "
                                 "(A and B gathered there; small n only)",
    "eigenvalues_sha256": "SHA-256 of the eigenvalues' float64 bytes (little-endian, ascending)",
    "eigenvectors_sha256": "SHA-256 of the concatenated SHA-256 digests of X's columns (each column's "
                           "float64 bytes), in column order: independent of the number of ranks",
    "local_eigenvectors_sha256": "SHA-256 of the concatenated column digests of one rank's columns",
}


def _exponents(max_a: float, max_b: float) -> tuple[int, int]:
    """The metrics' scaling exponents (a, b) of A and B (see the module doc)."""
    return scaling.exponent(max_a, safe=None), scaling.exponent(max_b, even=True, safe=None)


def _times(M, k: int):
    """M * 2^k (a new array; M itself for k = 0)."""
    return scaling.scale(M.copy(), k) if k else M


def residual(A, B, X, w) -> float:
    """||A X - B X diag(w)||_F / (n ||A||_F ||X||_F eps)."""
    xp = get_xp(A, B, X, w)
    n = A.shape[0]
    a, b = _exponents(float(xp.abs(A).max()), float(xp.abs(B).max()))
    R = A @ _times(X, a - b // 2) - (B @ _times(X, b // 2)) * _times(w, a - b)[None, :]
    den = n * float(xp.linalg.norm(_times(A, a))) * float(xp.linalg.norm(_times(X, -(b // 2)))) * EPS
    return float(xp.linalg.norm(R)) / den if den else float("nan")


def b_orthogonality(B, X) -> float:
    """||X^T B X - I||_F / (n eps)."""
    xp = get_xp(B, X)
    n = X.shape[1]
    b = _exponents(0.0, float(xp.abs(B).max()))[1]
    G = _times(X, -(b // 2)).T @ (B @ _times(X, b // 2))
    G[xp.arange(n), xp.arange(n)] -= 1.0
    return float(xp.linalg.norm(G)) / (n * EPS)


def unblocked_cholesky(B) -> np.ndarray:
    """The lower Cholesky factor of B column by column, one dot product per entry (as LAPACK's
    dpotf2), in B's dtype; reads B's lower triangle only."""
    n = B.shape[0]
    L = np.zeros_like(B)
    for j in range(n):
        L[j, j] = np.sqrt(B[j, j] - L[j, :j] @ L[j, :j])
        L[j + 1:, j] = (B[j + 1:, j] - L[j + 1:, :j] @ L[j, :j]) / L[j, j]
    return L


def stored_spectrum(A, B) -> np.ndarray:
    """The eigenvalues of the pair (A, B) as stored, ascending, on the host: the Cholesky factor
    L of B, L^-1 A and C = L^-1 (L^-1 A)^T formed in long double (x87 extended precision on
    x86-64: 11 bits more than float64; lower triangles of A and B read), C rounded to float64
    once, then LAPACK's dsyevd.  Forming A and B from a known spectrum moves theirs by about as
    much as a float64 solver's own rounding when cond(B) is large; against this reference an
    eigenvalue error is the solver's (about 1e-3 of LAPACK's at cond(B) = 1e12 by an mpmath check:
    bench/accuracy_exact.py).  O(n^3) without BLAS: small n only."""
    ld = np.longdouble
    A, B = np.asarray(to_host(A), dtype=np.float64), np.asarray(to_host(B), dtype=np.float64)
    n = A.shape[0]
    Al = np.tril(A).astype(ld)
    Al = Al + np.tril(Al, -1).T
    L = unblocked_cholesky(B.astype(ld))

    def forward(R):  # L^-1 R, row by row
        Y = np.empty_like(R)
        for i in range(n):
            Y[i] = (R[i] - L[i, :i] @ Y[:i]) / L[i, i]
        return Y

    Z = forward(forward(Al).T.copy())
    return np.linalg.eigvalsh(((Z + Z.T) / 2).astype(np.float64))


def floored_eigenvalue_error(w, ref) -> float:
    """eigenvalue_error(w, ref), at least n eps: the scale of any backward-stable solver's error,
    below which a ratio of two errors is rounding noise."""
    return max(eigenvalue_error(w, ref), len(ref) * EPS)


def lapack_reference(A, B, eigenvalues) -> tuple:
    """(residual, B-orthogonality, eigenvalue error) of LAPACK sygvd (scipy.linalg.eigh(A, B)) on
    whole host matrices A, B against the known `eigenvalues`; the eigenvalue error floored at
    n eps (floored_eigenvalue_error; the residual and B-orthogonality are in units of n eps
    too): what the accuracy checks compare against."""
    import scipy.linalg as sl

    ws, Xs = sl.eigh(A, B)
    return residual(A, B, Xs, ws), b_orthogonality(B, Xs), floored_eigenvalue_error(ws, eigenvalues)


def ratios_to(reference, A, B, X, w, eigenvalues) -> tuple:
    """(residual, B-orthogonality, eigenvalue error) of (w, X) divided by `reference`'s
    (lapack_reference)."""
    ours = residual(A, B, X, w), b_orthogonality(B, X), eigenvalue_error(w, eigenvalues)
    return tuple(o / r for o, r in zip(ours, reference))


def eigenvalue_error(w, ref, subset: tuple[int, int] | None = None) -> float | None:
    """max |w - ref| / max |ref| (None when ref is None).  subset (lo, hi): w holds eigenvalues
    lo..hi only, compared with ref[lo..hi] and scaled by max |ref| over the whole of ref
    (SUBSET_EIGENVALUE_ERROR_DEFINITION)."""
    if ref is None:
        return None
    w, ref = np.asarray(to_host(w), dtype=np.float64), np.asarray(to_host(ref), dtype=np.float64)
    scale = float(np.max(np.abs(ref))) or 1.0
    if subset is not None:
        ref = ref[subset[0]:subset[1] + 1]
    return float(np.max(np.abs(w - ref))) / scale


def column_digests(X, chunk_bytes: int = 64 * 2**20) -> list[bytes]:
    """SHA-256 (32 bytes) of each column's float64 bytes, host copies made a chunk at a time."""
    n = X.shape[0]
    step = max(1, chunk_bytes // max(1, 8 * n))
    out = []
    for k in range(0, X.shape[1], step):
        blk = np.asfortranarray(to_host(X[:, k:k + step]), dtype=np.float64)
        out += [hashlib.sha256(blk[:, j].tobytes()).digest() for j in range(blk.shape[1])]
    return out


def combine_digests(digests) -> str:
    """SHA-256 of concatenated digests (the column digests of a matrix, in column order)."""
    h = hashlib.sha256()
    for d in digests:
        h.update(d)
    return h.hexdigest()


def matrix_sha256(X) -> str:
    """eigenvectors_sha256 of a whole matrix (see DEFINITIONS)."""
    return combine_digests(column_digests(X))


def _sum_of_squares(M, chunk_bytes: int, k2: int = 0) -> float:
    """sum((2^k2 M)**2) a column block at a time (no temporary of M's size)."""
    step = max(1, chunk_bytes // max(1, 8 * M.shape[0]))
    total = 0.0
    for k in range(0, M.shape[1], step):
        v = M[:, k:k + step].ravel(order="K")
        if k2:
            v = scaling.scale(v.copy(), k2)
        total += float(v @ v)
    return total


def distributed_accuracy(A_loc, B_loc, X_loc, w, desc, comm, *, chunk_bytes: int | None = None,
                         x_desc=None) -> dict:
    """{'residual', 'b_orthogonality'} as residual() and b_orthogonality() define them, from the
    ranks' column blocks (1 x P block-cyclic: A's and B's `desc`, X's `x_desc`, by default desc;
    BlockCyclic(n, k, nb, P) for k eigenpairs, w then their k eigenvalues), the same on every rank.

    Collective over `comm`: anything with mpi4py's Bcast(buf, root), Allgather(send, recv) and
    Allreduce(send, recv) for
    arrays of xp (an hpccoll Communicator for device arrays; an mpi4py communicator suffices on
    the host, where the sums' order does not matter for a metric).  For each block of c columns of X (owner's turn, c from chunk_bytes): the owner
    Bcasts X[:, block]; every rank adds its share A[:, J_r] X[J_r, block] (and B's) and one
    Allreduce sums them; the owner keeps ||A X_b - B X_b diag(w_b)||^2 and every rank
    ||X[:, J_r]^T (B X_b) - I||^2.  Traffic n^2 doubles per rank, memory a few n x c arrays,
    flops O(n^3 / P) per rank."""
    xp = get_xp(A_loc, B_loc, X_loc)
    rank, size = comm.Get_rank(), comm.Get_size()
    n = desc.n
    x_desc = desc if x_desc is None else x_desc
    if chunk_bytes is None:   # the host's deterministic Allreduce may hold P chunks at once
        chunk_bytes = (256 if xp is not np else 2) * 2**20
    c_max = max(1, chunk_bytes // (8 * max(1, n)))
    mine = xp.asarray(desc.local_cols(rank))
    peaks = xp.stack([scaling.max_abs(A_loc, xp), scaling.max_abs(B_loc, xp)])
    every = xp.empty((size, 2), dtype=xp.float64)
    comm.Allgather(peaks, every)                    # the largest magnitudes: A' = 2^a A, B' = 2^b B
    a, b = _exponents(*(float(v) for v in to_host(every).max(axis=0)))
    w_host = scaling.scale(np.array(to_host(w), dtype=np.float64), a - b)   # w' = 2^(a-b) w
    res2 = orth2 = 0.0
    for owner in range(size):
        owner_cols = x_desc.local_cols(owner)
        for k0 in range(0, owner_cols.size, c_max):
            c = min(c_max, owner_cols.size - k0)
            Xb = xp.ascontiguousarray(X_loc[:, k0:k0 + c]) if rank == owner else xp.empty((n, c))
            comm.Bcast(Xb, root=owner)
            rows = Xb[mine, :]
            part = xp.empty((n, 2 * c))
            part[:, :c] = A_loc @ _times(rows, a - b // 2)          # A' X'
            part[:, c:] = B_loc @ scaling.scale(rows, b // 2)       # B' X' (rows is a copy)
            full = xp.empty_like(part)
            comm.Allreduce(part, full)
            del part, rows
            AXb, BXb = full[:, :c], full[:, c:]
            if rank == owner:
                lam = xp.asarray(w_host[owner_cols[k0:k0 + c]])
                res2 += float(xp.linalg.norm(AXb - BXb * lam[None, :])) ** 2
            G = scaling.scale(X_loc.T @ BXb, -(b // 2))         # (X'^T B' X')[J_r, block]
            if rank == owner:
                G[xp.arange(k0, k0 + c), xp.arange(c)] -= 1.0
            orth2 += float(xp.linalg.norm(G)) ** 2
            del full, AXb, BXb, G, Xb
    sums = xp.asarray([res2, orth2, _sum_of_squares(A_loc, chunk_bytes, a),
                       _sum_of_squares(X_loc, chunk_bytes, -(b // 2))])
    total = xp.empty_like(sums)
    comm.Allreduce(sums, total)
    res2, orth2, a2, x2 = (float(v) for v in to_host(total))
    den = n * np.sqrt(a2) * np.sqrt(x2) * EPS
    return {"residual": np.sqrt(res2) / den if den else float("nan"),
            "b_orthogonality": np.sqrt(orth2) / (x_desc.n * EPS)}


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
