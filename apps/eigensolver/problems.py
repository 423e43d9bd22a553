"""Test problems A x = lambda B x (float64), built by column block on every rank.

known      A = L Q diag(lam) Q^T L^T, B = L L^T with L = U S^1/2, S = geomspace(1, 1/cond_b)
           (so cond_2(B) = cond_b): eigenvalues lam, B-orthonormal eigenvectors
           X = L^-T Q = U S^-1/2 Q, both known by construction (up to rounding).
clustered  as known, lam in tight clusters (relative spread 1e-10 inside a cluster).
wilkinson  as known, lam = the spectrum of the Wilkinson matrix W_n^+ (near-degenerate pairs).
random     A[i, j] = a standard normal drawn from (seed, min(i, j), max(i, j)), divided by sqrt(n);
           B as above; spectrum unknown.
file:A.npy,B.npy   matrices from .npy files (any real dtype, C or Fortran order); each rank
           reads only its own columns; spectrum unknown.

scf_operand gives the A of an SCF loop's later solves (solve --scf): A_j = A + (step max|A|) Z_j
for j >= 1, Z_j symmetric with entries uniform in [-1, 1) from a hash of (seed, j, min(r, c),
max(r, c)), so that, like the problems, an entry's bits depend on neither the ranks nor the
columns built with it (and are the same in NumPy and CuPy: integer hashing, then one exact
scaling by a power of two, one multiplication and one addition).

How the generated problems are built, and why.  U and Q are random *butterfly* orthogonal
matrices (`Butterfly`): products of log2(n) + 2 layers of disjoint Givens rotations with
seeded random angles, every output index depending on every input index.  They are not
Haar-distributed (a dense random orthogonal matrix costs O(n^3) to make and to apply), but
they mix every coordinate and are applied in O(n log n) per column with elementwise
operations on row slices: no BLAS, no reduction.  So column j of A (or B) is computed from the
unit vector e_j alone, at O(n log n) per column (O(n^2 log n / P) per rank), and its bits
depend only on (kind, n, cond_b, seed) and the array library, never on the number of ranks,
the block size or which columns a rank builds together.  The chain of rotations leaves A and B
symmetric only to rounding; `runs.build_local_problem` then sets M := (M + M^T) / 2 by exchanging
transposed tiles between rank pairs (tiles.symmetrize: O(n^2 / P) traffic per rank), which
gives the bits of the one-rank (M + M.T) / 2 on any number of ranks.  On the GPU the same
formulas run in CuPy (other bits than NumPy's: sqrt/cos/log and the problem digest include the
device; deterministic run to run)."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

import numpy as np

from .linalg._xp import get_xp, is_device, to_host

KINDS = ("known", "clustered", "wilkinson", "random")
#: names this construction in problem digests: a change of formulas must change it
GENERATOR = "butterfly-1"
#: names scf_operand's perturbation in problem digests: a change of its formula must change it
PERTURBATION = "scf-uniform-1"
#: columns built at a time (bounds the temporaries: a few n x CHUNK arrays)
HOST_CHUNK_BYTES = 4 * 2**20
DEVICE_CHUNK_BYTES = 512 * 2**20
#: dtypes a file: matrix may have (converted to float64)
REAL_KINDS = "biuf"


class ProblemError(ValueError):
    """A --problem that cannot be built: the message names the argument and the fix."""


@dataclass(frozen=True)
class ProblemSpec:
    """What to build: a generated kind (n, cond_b, seed) or two .npy files."""

    kind: str
    n: int
    cond_b: float = 1e3
    seed: int = 0
    files: tuple = ()            # (path A, path B) for kind "file"
    file_info: tuple = field(default=(), compare=False)  # ((shape, fortran, dtype, offset), ...)

    def identity(self, device: str) -> dict:
        """What makes the problem's bits: the spec, the construction and the device (NumPy and
        CuPy round differently); for files their resolved paths, sizes and modification times."""
        if self.kind == "file":
            files = []
            for p in self.files:
                st = os.stat(p)
                files.append([os.path.realpath(p), st.st_size, st.st_mtime_ns])
            return {"kind": "file", "files": files}
        return {"kind": self.kind, "n": self.n, "cond_b": float(self.cond_b), "seed": int(self.seed),
                "generator": GENERATOR, "device": device}

    def digest(self, device: str) -> str:
        text = json.dumps(self.identity(device), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


def npy_header(path: str):
    """(shape, fortran_order, dtype, data offset) of a .npy file, reading only its header."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        return tuple(shape), bool(fortran), np.dtype(dtype), f.tell()


def parse_problem(text: str, n: int, *, cond_b: float = 1e3, seed: int = 0) -> ProblemSpec:
    """The ProblemSpec of a --problem value, or a ProblemError saying what to pass instead.
    For file: problems only the .npy headers are read (shape, order, dtype)."""
    if text.startswith("file:"):
        parts = text[5:].split(",")
        if len(parts) != 2 or not all(parts):
            raise ProblemError(f"--problem {text!r}: use file:A.npy,B.npy (two .npy paths, comma-separated)")
        info = []
        for name, path in zip("AB", parts):
            if not os.path.isfile(path):
                raise ProblemError(f"--problem {text!r}: {name} file {path!r} does not exist (or is not a file)")
            try:
                shape, fortran, dtype, offset = npy_header(path)
            except (OSError, ValueError) as exc:
                raise ProblemError(f"--problem {text!r}: {name} file {path!r} is not a readable .npy file "
                                   f"({exc}); save it with numpy.save") from None
            if dtype.kind == "c":
                raise ProblemError(f"--problem {text!r}: {name} is complex ({dtype}): this solver takes real "
                                   "symmetric A and real symmetric positive definite B")
            if dtype.kind not in REAL_KINDS or dtype.hasobject or dtype.fields:
                raise ProblemError(f"--problem {text!r}: {name} has dtype {dtype}: use a real numeric dtype "
                                   "(float64 preferred)")
            if len(shape) != 2 or shape[0] != shape[1] or shape[0] < 1:
                raise ProblemError(f"--problem {text!r}: {name} has shape {shape}: it must be a square matrix")
            need, have = shape[0] * shape[1] * dtype.itemsize, os.path.getsize(path) - offset
            if have < need:
                raise ProblemError(f"--problem {text!r}: {name} file {path!r} is truncated: {have} bytes of data, "
                                   f"its header's {shape[0]} x {shape[1]} {dtype} needs {need}")
            info.append((shape, fortran, dtype, offset))
        if info[0][0] != info[1][0]:
            raise ProblemError(f"--problem {text!r}: A is {info[0][0][0]} x {info[0][0][1]}, B is "
                               f"{info[1][0][0]} x {info[1][0][1]}: they must have the same order")
        return ProblemSpec("file", info[0][0][0], files=tuple(parts), file_info=tuple(info))
    if text not in KINDS:
        raise ProblemError(f"--problem {text!r}: use one of {', '.join(KINDS)} or file:A.npy,B.npy")
    if n < 1:
        raise ProblemError(f"--n {n}: the matrix order must be >= 1")
    if not (np.isfinite(cond_b) and cond_b >= 1):
        raise ProblemError(f"--cond-b {cond_b}: the condition number of B must be a finite number >= 1")
    if seed < 0:
        raise ProblemError(f"--seed {seed}: use an integer >= 0")
    return ProblemSpec(text, n, float(cond_b), int(seed))


# -- spectra (replicated: every rank computes the same O(n) vector) ---------------------------
def spread_spectrum(n: int, rng, xp=np):
    """Eigenvalues of both signs over three decades of magnitude, ascending."""
    mag = np.geomspace(1e-3, 1.0, n)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return xp.asarray(np.sort(sign * mag))


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


def _rng(spec: ProblemSpec, stream: int) -> np.random.Generator:
    """Independent streams of one seed: 0 the spectrum, 1 U, 2 Q."""
    return np.random.default_rng([spec.seed, stream])


def spectrum(spec: ProblemSpec) -> np.ndarray | None:
    """The eigenvalues by construction (ascending, host), or None (random, file)."""
    if spec.kind == "known":
        return spread_spectrum(spec.n, _rng(spec, 0))
    if spec.kind == "clustered":
        return clustered_spectrum(spec.n, _rng(spec, 0))
    if spec.kind == "wilkinson":
        return wilkinson_spectrum(spec.n)
    return None


def b_scaling(spec: ProblemSpec) -> np.ndarray:
    """S: the eigenvalues of B, 1 down to 1/cond_b."""
    n = spec.n
    return np.geomspace(1.0, 1.0 / spec.cond_b, n) if n > 1 else np.ones(1)


# -- the butterfly orthogonal matrices --------------------------------------------------------
class Butterfly:
    """An n x n orthogonal matrix: layers of disjoint Givens rotations of rows (i, i + h).

    Strides: H (the largest power of two below n), then 1, 2, 4, ..., H.  The hypercube strides
    1 .. H/2 mix rows [0, H) completely, the first stride-H layer folds rows [H, n) into them
    first and the last one spreads the result back, so every output row depends on every input
    row for any n.  A layer of stride h rotates (i, i + h) for i mod 2h < h and i + h < n;
    angles uniform in [0, 2 pi) from the seed."""

    def __init__(self, n: int, rng: np.random.Generator):
        self.n = n
        H = 1 << max(0, (n - 1).bit_length() - 1) if n > 1 else 0
        strides = [H] + [1 << k for k in range(H.bit_length())] if n > 1 else []
        self.layers = []
        for h in strides:
            blocks = n // (2 * h)
            tail = max(0, n - blocks * 2 * h - h)
            theta = rng.uniform(0.0, 2.0 * np.pi, size=blocks * h + tail)
            self.layers.append((h, blocks, tail, np.cos(theta), np.sin(theta)))
        self._on = {}

    def _on_device(self, xp):
        """The layers' cosines and sines as arrays of xp (moved to the device once)."""
        key = id(xp)
        if key not in self._on:
            self._on[key] = [(h, b, t, xp.asarray(c), xp.asarray(s)) for h, b, t, c, s in self.layers]
        return self._on[key]

    def apply(self, X, transpose: bool = False) -> None:
        """X := U X (or U^T X) in place, X an n x m array (numpy or cupy, any memory order)."""
        xp = get_xp(X)
        layers = self._on_device(xp)
        for h, blocks, tail, c, s in (reversed(layers) if transpose else layers):
            if transpose:
                s = -s
            main = blocks * 2 * h
            if blocks:
                # splitting the row axis is always a view (any memory order), so the rotation
                # below updates X itself
                V = X[:main].reshape(blocks, 2, h, X.shape[1])
                assert xp.may_share_memory(V, X), "Butterfly.apply: reshape copied"
                cm = c[:blocks * h].reshape(blocks, h, 1)
                sm = s[:blocks * h].reshape(blocks, h, 1)
                _rotate(V[:, 0], V[:, 1], cm, sm)
            if tail:
                ct = c[blocks * h:].reshape(tail, 1)
                st = s[blocks * h:].reshape(tail, 1)
                _rotate(X[main:main + tail], X[main + h:main + h + tail], ct, st)


def _rotate(a, b, c, s) -> None:
    """(a, b) := (c a - s b, s a + c b) elementwise, in place (one rounding per operation, so the
    bits of an element do not depend on the shape of the arrays)."""
    new_a = c * a - s * b
    b[...] = s * a + c * b
    a[...] = new_a


# -- the random kind's A: a symmetric counter-based normal --------------------------------------
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(x):
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def _splitmix64_int(x: int) -> int:
    """_splitmix64 of one Python int (mod 2^64): no NumPy scalar overflow warnings."""
    m = (1 << 64) - 1
    x = (x + int(_GOLDEN)) & m
    x = ((x ^ (x >> 30)) * int(_MIX1)) & m
    x = ((x ^ (x >> 27)) * int(_MIX2)) & m
    return x ^ (x >> 31)


def _hash_normal(spec: ProblemSpec, cols, xp):
    """n x len(cols) standard normals z(seed, min(i, j), max(i, j)) (Box-Muller on two hashes)."""
    i = xp.arange(spec.n, dtype=xp.uint64)[:, None]
    j = xp.asarray(np.asarray(cols, dtype=np.uint64))[None, :]
    key = xp.minimum(i, j) * np.uint64(spec.n) + xp.maximum(i, j)
    base = np.uint64(_splitmix64_int(spec.seed ^ 0x5EED))
    u1 = _splitmix64(key ^ base)
    u2 = _splitmix64(u1 ^ _GOLDEN)
    scale = 2.0 ** -53
    f1 = ((u1 >> np.uint64(11)).astype(xp.float64) + 1.0) * scale     # (0, 1]
    f2 = (u2 >> np.uint64(11)).astype(xp.float64) * scale             # [0, 1)
    return xp.sqrt(-2.0 * xp.log(f1)) * xp.cos((2.0 * np.pi) * f2)


def _uniform_symmetric(seed: int, index: int, n: int, cols, xp):
    """n x len(cols) entries of Z_index (scf_operand): uniform in [-1, 1), Z[r, c] = Z[c, r]."""
    r = xp.arange(n, dtype=xp.uint64)[:, None]
    c = xp.asarray(np.asarray(cols, dtype=np.uint64))[None, :]
    key = xp.minimum(r, c) * np.uint64(n) + xp.maximum(r, c)
    base = np.uint64(_splitmix64_int(_splitmix64_int(seed ^ 0x5CF) ^ index))
    u = _splitmix64(key ^ base)
    # 53 bits as an integer-valued float (exact), times 2^-52 (exact): [0, 2); minus 1 (exact)
    return (u >> np.uint64(11)).astype(xp.float64) * 2.0 ** -52 - 1.0


def scf_operand(A, cols, index: int, scale: float, seed: int, xp=None):
    """A new array A + scale Z_index for the columns `cols` of A (A[:, k] is column cols[k]; any
    of them, e.g. a rank's), built a chunk of columns at a time; index 0: a copy of A.  solve
    --scf passes scale = step max|A| (max over the whole A)."""
    xp = get_xp(A) if xp is None else xp
    out = xp.array(A, dtype=xp.float64, order="F", copy=True)
    if index == 0:
        return out
    n, cols = A.shape[0], np.asarray(cols, dtype=np.int64)
    c = _chunk_columns(n, xp)
    for k in range(0, cols.size, c):
        out[:, k:k + c] += scale * _uniform_symmetric(seed, index, n, cols[k:k + c], xp)
    return out


def scf_identity(identity: dict, index: int, step: float) -> dict:
    """The problem identity of an SCF loop's solve `index` (A_index) from the problem's: solve 0
    is the problem itself."""
    if index == 0:
        return identity
    return {"problem": identity, "scf": {"index": int(index), "step": float(step), "perturbation": PERTURBATION}}


# -- building columns --------------------------------------------------------------------------
class Generator:
    """Builds the columns of a generated problem; holds the spec's replicated O(n log n) state."""

    def __init__(self, spec: ProblemSpec):
        if spec.kind not in KINDS:
            raise ValueError(f"Generator: {spec.kind!r} is not a generated kind")
        self.spec = spec
        self.lam = spectrum(spec)
        self.S = b_scaling(spec)
        self.U = Butterfly(spec.n, _rng(spec, 1))
        self.Q = Butterfly(spec.n, _rng(spec, 2)) if self.lam is not None else None

    def columns(self, cols, xp=np):
        """(A[:, cols], B[:, cols]) before symmetrization, Fortran order, arrays of xp."""
        n, m = self.spec.n, len(cols)
        Y = xp.zeros((n, m), dtype=xp.float64, order="F")
        if m:
            Y[xp.asarray(np.asarray(cols, dtype=np.int64)), xp.arange(m)] = 1.0
        self.U.apply(Y, transpose=True)                 # U^T e_j
        S = xp.asarray(self.S)[:, None]
        B = Y * S
        self.U.apply(B)                                 # U S U^T e_j
        if self.lam is None:                            # random: A is the symmetric hash matrix
            A = xp.asfortranarray(_hash_normal(self.spec, cols, xp) / np.sqrt(n))
        else:
            root = xp.sqrt(S)
            A = Y * root
            del Y
            self.Q.apply(A, transpose=True)
            A *= xp.asarray(self.lam)[:, None]
            self.Q.apply(A)
            A *= root
            self.U.apply(A)                             # U S^1/2 Q diag(lam) Q^T S^1/2 U^T e_j
        return xp.asfortranarray(A), xp.asfortranarray(B)


def _chunk_columns(n: int, xp) -> int:
    target = DEVICE_CHUNK_BYTES if is_device(xp) else HOST_CHUNK_BYTES
    return max(1, target // (8 * max(1, n)))


def generated_columns(spec: ProblemSpec, cols, xp=np):
    """(A[:, cols], B[:, cols]) of a generated problem before symmetrization, built in chunks."""
    gen = Generator(spec)
    n, cols = spec.n, np.asarray(cols, dtype=np.int64)
    A = xp.empty((n, cols.size), dtype=xp.float64, order="F")
    B = xp.empty((n, cols.size), dtype=xp.float64, order="F")
    c = _chunk_columns(n, xp)
    for k in range(0, cols.size, c):
        a, b = gen.columns(cols[k:k + c], xp)
        A[:, k:k + c] = a
        B[:, k:k + c] = b
    return A, B


def _runs(cols: np.ndarray):
    """Maximal runs of consecutive indices: [(position in cols, first column, length)]."""
    out, start = [], 0
    for i in range(1, cols.size + 1):
        if i == cols.size or cols[i] != cols[i - 1] + 1:
            out.append((start, int(cols[start]), i - start))
            start = i
    return out


def _exact(data: np.ndarray, count: int, path: str) -> np.ndarray:
    """data, which a read asked `count` values of; ProblemError naming the file if it got fewer."""
    if data.size != count:
        raise ProblemError(f"{path}: truncated: a read of {count} values got {data.size}")
    return data


def read_columns(path: str, cols, xp=np, info=None, digests: list | None = None):
    """Columns `cols` of the square .npy matrix at path as float64 (n x len(cols), Fortran order,
    xp array), reading only those columns (Fortran-order files) or row chunks of the file
    (C-order files), never the whole matrix at once.  digests: if given, SHA-256 of each column
    (its float64 bytes) is appended in the order of cols."""
    shape, fortran, dtype, offset = info or npy_header(path)
    n = shape[0]
    cols = np.asarray(cols, dtype=np.int64)
    out = xp.empty((n, cols.size), dtype=xp.float64, order="F")
    host = []
    with open(path, "rb") as f:
        if fortran:
            for pos, c0, length in _runs(cols):
                f.seek(offset + c0 * n * dtype.itemsize)
                blk = _exact(np.fromfile(f, dtype=dtype, count=n * length), n * length, path)
                blk = blk.reshape((n, length), order="F")
                blk = np.asfortranarray(blk, dtype=np.float64)
                host.append((pos, blk))
                out[:, pos:pos + length] = xp.asarray(blk)
        else:
            rows = max(1, HOST_CHUNK_BYTES // max(1, n * dtype.itemsize))
            staged = np.empty((n, cols.size), dtype=np.float64, order="F") if digests is not None else None
            for r0 in range(0, n, rows):
                r1 = min(n, r0 + rows)
                f.seek(offset + r0 * n * dtype.itemsize)
                blk = _exact(np.fromfile(f, dtype=dtype, count=(r1 - r0) * n), (r1 - r0) * n, path)
                blk = blk.reshape(r1 - r0, n)
                part = blk[:, cols].astype(np.float64)
                out[r0:r1, :] = xp.asarray(part)
                if staged is not None:
                    staged[r0:r1] = part
            if staged is not None:
                host.append((0, staged))
    if digests is not None:
        for _, blk in host:
            for j in range(blk.shape[1]):
                digests.append(hashlib.sha256(np.ascontiguousarray(blk[:, j]).tobytes()).digest())
    return out


# -- the whole problem on one process (tests, the one-GPU anchor, the scipy reference) ----------
@dataclass
class Problem:
    name: str
    A: np.ndarray
    B: np.ndarray
    eigenvalues: np.ndarray | None  # ascending, when known by construction

    @property
    def n(self) -> int:
        return self.A.shape[0]


def make_problem(kind: str, n: int, *, cond_b: float = 1e3, seed: int = 0, xp=np) -> Problem:
    """The whole problem named `kind` (see the module doc) of order n on this process: the same
    bits as runs.build_local_problem's columns on any number of ranks (same xp)."""
    spec = parse_problem(kind, n, cond_b=cond_b, seed=seed)
    if spec.kind == "file":
        cols = np.arange(spec.n)
        A = read_columns(spec.files[0], cols, xp, spec.file_info[0])
        B = read_columns(spec.files[1], cols, xp, spec.file_info[1])
        return Problem(kind, A, B, None)
    A, B = generated_columns(spec, np.arange(spec.n), xp)
    A = (A + A.T) / 2
    B = (B + B.T) / 2
    lam = spectrum(spec)
    return Problem(kind, A, B, None if lam is None else xp.asarray(lam))


def gather_problem_on_root(A_loc, B_loc, desc, mpi_comm, root: int = 0):
    """The whole A and B on `root` (host arrays; None elsewhere), one column block at a time over
    MPI: for the scipy reference at small n only (it needs 2 n^2 doubles on root)."""
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    out = []
    for M in (A_loc, B_loc):
        full = np.empty((desc.n, desc.n), order="F") if rank == root else None
        for q in range(size):
            cols = desc.local_cols(q)
            if q == root and rank == root:
                full[:, cols] = to_host(M)
            elif rank == q:
                mpi_comm.Send(np.asfortranarray(to_host(M)), dest=root, tag=23)
            elif rank == root:
                buf = np.empty((desc.n, cols.size), order="F")
                mpi_comm.Recv(buf, source=q, tag=23)
                full[:, cols] = buf
        out.append(full)
    return out[0], out[1]
