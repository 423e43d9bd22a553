"""The GPU tridiagonal subset's algorithm (linalg/stein_device.py), checked on the host through
its NumPy twin (stein_twin.TwinOps, the kernels' arithmetic statement for statement): the
eigenvalues against LAPACK's dstebz and SciPy's eigh_tridiagonal, the vectors' residual and
orthogonality against the host path's (stein.py: LAPACK dstein), on hard tridiagonals with
fresh random data; the index logic, the splitting, batching, the QR path, non-convergence and
non-finite input; and stein_kernels.cu compiling with NVRTC."""
from __future__ import annotations

import numpy as np
import pytest

import hpccoll
from mpi4py import MPI
from scipy.linalg import eigh_tridiagonal
from scipy.linalg.lapack import dstebz

from hpccoll_eigensolver.linalg import stein_device as sd
from hpccoll_eigensolver.linalg.stein import stein_subset
from conftest import TRIDIAGONAL_CASES as CASES
from conftest import dense_tridiagonal as dense
from conftest import hard_tridiagonal as tridiagonal
from hpccoll_eigensolver.linalg.stein_twin import TwinOps, start_values

ULP = 2.0 ** -52
OPS = TwinOps()
def _dstebz_values(d, e, lo, hi):
    """LAPACK dstebz's w[lo..hi] (ABSTOL = 0), ascending: by index, or where that fails (INFO 2
    or 3, a cluster a few ulp wide) all of them, then lo..hi (LAPACK's cure)."""
    m, wl, _, _, info = dstebz(d, e, 3, 0.0, 0.0, lo + 1, hi + 1, 0.0, "E")
    if info == 0 and m == hi - lo + 1:
        return wl[:m]
    m, wl, _, _, info = dstebz(d, e, 0, 0.0, 0.0, 1, d.shape[0], 0.0, "E")
    assert info == 0 and m == d.shape[0]
    return wl[lo:hi + 1]


def _pick(rng, n):
    lo = int(rng.integers(0, n))
    return lo, int(rng.integers(lo, n))


@pytest.fixture(scope="module")
def one_rank():
    c = hpccoll.Communicator(backend="host", deterministic=True)
    yield c
    c.Free()


# -- eigenvalues ------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_bisect_matches_lapack(case):
    """w[lo..hi] ascending, within 2 ulp ||T||_1 of LAPACK dstebz (ABSTOL = 0: both within about
    one of the exact values) and 16 ulp ||T||_1 of SciPy's eigh_tridiagonal (sterf, whose own
    error reaches ~10); the full range's values at those indices."""
    seed = np.random.SeedSequence().entropy
    rng = np.random.default_rng(seed)
    d, e = tridiagonal(case, rng)
    n = d.shape[0]
    lo, hi = _pick(rng, n)
    w, first, end = sd.bisect_blocks(OPS, d, e, lo, hi)
    what = f"{case} n={n} ({lo}, {hi}) seed={seed}"
    assert w.shape == (hi - lo + 1,) and np.all(np.diff(w) >= 0), what
    norm = np.abs(dense(d, e)).sum(axis=0).max()
    if n > 1:
        wl = _dstebz_values(d, e, lo, hi)
        assert np.abs(w - wl).max() <= 2 * ULP * norm, what
        assert np.abs(w - eigh_tridiagonal(d, e, eigvals_only=True)[lo:hi + 1]).max() <= 16 * ULP * norm, what
    whole = sd.bisect_blocks(OPS, d, e, 0, n - 1)[0][lo:hi + 1]
    if case == "graded_wide":   # eigenvalues below ulp ||T|| ~ 1e284: their order is only defined to that
        assert np.abs(w - whole).max() <= 2 * ULP * norm, what
    else:                       # each thread's bits depend on its index alone
        assert np.array_equal(w, whole), what
    assert np.all((0 <= first) & (first < end) & (end <= n)), what


@pytest.mark.parametrize("case", ["tiny_e", "zero_e", "glued", "graded_wide"])
def test_bisect_finds_each_blocks_eigenvalues_to_its_own_scale(case):
    """With T split (dstebz's test), each eigenvalue's rows [first, end) are an unreduced block
    of it, every block gets as many eigenvalues as it has rows, and each is within 2 ulp
    ||T_block||_1 of the block's own (LAPACK dstebz on the block; a small block split off a
    large T too), exactly its d for a block of one row."""
    seed = np.random.SeedSequence().entropy
    d, e = tridiagonal(case, np.random.default_rng(seed))
    n = d.shape[0]
    w, first, end = sd.bisect_blocks(OPS, d, e, 0, n - 1)
    for r0, r1 in sorted(set(zip(first.tolist(), end.tolist()))):
        mine = np.sort(w[(first == r0) & (end == r1)])
        assert mine.shape[0] == r1 - r0, f"{case} block [{r0}, {r1}) seed={seed}"
        if r1 - r0 > 1:
            m, wl, *_ = dstebz(d[r0:r1], e[r0:r1 - 1], 3, 0.0, 0.0, 1, r1 - r0, 0.0, "E")
            norm = np.abs(dense(d[r0:r1], e[r0:r1 - 1])).sum(axis=0).max()
            assert np.abs(mine - wl[:m]).max() <= 2 * ULP * norm, f"{case} block [{r0}, {r1}) seed={seed}"
        else:
            assert mine[0] == d[r0]
    assert end.max() == n and first.min() == 0


def test_bisect_keeps_multiple_eigenvalues():
    """A diagonal with repeated values: each value as often as it occurs, exactly."""
    rng = np.random.default_rng()
    d = rng.choice([-2.0, 0.5, 3.0], 31)
    w = sd.bisect_blocks(OPS, d, np.zeros(30), 0, 30)[0]
    assert np.array_equal(w, np.sort(d))


def test_bisect_of_non_finite_t_is_nan_and_bad_ranges_are_refused():
    d, e = np.ones(5), np.ones(4)
    d[2] = np.nan
    assert np.isnan(sd.bisect_blocks(OPS, d, e, 1, 3)[0]).all()
    for lo, hi in ((-1, 2), (3, 2), (0, 5)):
        with pytest.raises(ValueError, match="0 <= lo <= hi <= n - 1"):
            sd.bisect_blocks(OPS, np.ones(5), np.ones(4), lo, hi)


# -- vectors ----------------------------------------------------------------------------------
def _quality(d, e, w, Z):
    """Residual ||T Z - Z diag(w)||_F / (n ulp ||T||_1) and ||Z^T Z - I||_F / (n ulp)."""
    n = d.shape[0]
    T = dense(d, e)
    norm = max(np.abs(T).sum(axis=0).max(), np.finfo(float).tiny)
    return (np.linalg.norm(T @ Z - Z * w) / (n * ULP * norm),
            np.linalg.norm(Z.T @ Z - np.eye(Z.shape[1])) / (n * ULP))


@pytest.mark.parametrize("case", CASES)
def test_vectors_as_accurate_as_lapack(case, one_rank):
    """Residual and orthogonality at most 8 n ulp (||T||_1) -- as LAPACK's dstein on the same
    subset (the host path) reaches ~2 -- and the same eigenvalues as bisect_blocks."""
    seed = np.random.SeedSequence().entropy
    rng = np.random.default_rng(seed)
    d, e = tridiagonal(case, rng)
    lo, hi = _pick(rng, d.shape[0])
    w, Z = sd.stein_subset_device(d, e, lo, hi, ops=OPS)
    assert Z.shape == (d.shape[0], hi - lo + 1) and Z.flags.f_contiguous
    assert np.array_equal(w, sd.bisect_blocks(OPS, d, e, lo, hi)[0])
    res, orth = _quality(d, e, w, Z)
    host = _quality(d, e, *stein_subset(d, e, lo, hi, 1, one_rank, np))
    assert res <= 8 and orth <= 8, f"{case} ({lo}, {hi}) seed={seed}: ours {res:.3g}, {orth:.3g}; host {host}"


def test_host_subset_of_a_cluster_lapack_cannot_index():
    """The host path's bisection (stein._bisect) where LAPACK dstebz cannot find lo..hi by index
    (INFO = 2: a cluster a few ulp wide; about 1 in 300 of the cluster case's draws, three known
    ones first, then fresh ones): the eigenvalues within 16 ulp ||T||_1 of SciPy's, the vectors'
    residual and orthogonality as the other cases'."""
    one = hpccoll.Communicator(MPI.COMM_SELF, backend="host", deterministic=True)
    seeds = [426, 519, 695] + [int(s) for s in np.random.SeedSequence().generate_state(300)]
    hit = 0
    for seed in seeds:
        rng = np.random.default_rng(seed)
        d, e = tridiagonal("cluster", rng)
        n = d.shape[0]
        lo, hi = _pick(rng, n)
        if dstebz(d, e, 3, 0.0, 0.0, lo + 1, hi + 1, 0.0, "B")[4] == 0:
            continue                              # LAPACK found them by index: the usual path
        hit += 1
        w, Z = stein_subset(d, e, lo, hi, 1, one, np)
        norm = np.abs(dense(d, e)).sum(axis=0).max()
        assert np.abs(w - eigh_tridiagonal(d, e, eigvals_only=True)[lo:hi + 1]).max() <= 16 * ULP * norm, seed
        res, orth = _quality(d, e, w, Z)
        assert res <= 8 and orth <= 8, f"seed={seed}: {res:.3g}, {orth:.3g}"
    one.Free()
    assert hit >= 3


@pytest.mark.parametrize("case", ["tiny_e", "zero_e", "graded_wide"])
def test_vectors_of_a_split_t_are_zero_outside_their_block(case):
    """T split (dstebz's test): each vector is exactly zero outside its block's rows, as dstein
    leaves it, and eigenvectors() on bisect_blocks' output is stein_subset_device's result."""
    d, e = tridiagonal(case, np.random.default_rng())
    n = d.shape[0]
    w, first, end = sd.bisect_blocks(OPS, d, e, 0, n - 1)
    Z = sd.eigenvectors(OPS, d, e, w, first, end, 0)
    rows = np.arange(n)[:, None]
    assert np.all(Z[(rows < first) | (rows >= end)] == 0.0)
    assert np.array_equal(Z, sd.stein_subset_device(d, e, 0, n - 1, ops=OPS)[1])


@pytest.mark.parametrize("qr_from", [2, 5])
def test_householder_path_as_accurate_as_gram_schmidt(qr_from):
    """Clusters of at least qr_from vectors through the QR step: as accurate as MGS."""
    seed = np.random.SeedSequence().entropy
    rng = np.random.default_rng(seed)
    for case in ("cluster", "glued", "random"):
        d, e = tridiagonal(case, rng)
        w, Z = sd.stein_subset_device(d, e, 0, d.shape[0] - 1, ops=OPS, qr_from=qr_from)
        res, orth = _quality(d, e, w, Z)
        assert res <= 8 and orth <= 8, f"{case} seed={seed}: {res:.3g}, {orth:.3g}"


@pytest.mark.parametrize("case", ["glued", "cluster"])
def test_results_do_not_depend_on_batches_or_runs(case):
    """Bitwise: two runs; batches of whole clusters of at most 5 vectors, and a cluster larger
    than that factored 5 vectors (or 1) at a time each step, against one batch."""
    d, e = tridiagonal(case, np.random.default_rng())
    n = d.shape[0]
    w1, Z1 = sd.stein_subset_device(d, e, 3, n - 4, ops=OPS)
    w2, Z2 = sd.stein_subset_device(d, e, 3, n - 4, ops=OPS)
    assert np.array_equal(w1, w2) and np.array_equal(Z1, Z2)
    for vectors in (5, 1):
        assert np.array_equal(Z1, sd.stein_subset_device(d, e, 3, n - 4, ops=OPS, work_bytes=33 * n * vectors)[1])


def test_a_vector_that_does_not_converge_is_nan(monkeypatch):
    """Past MAXITS solves without EXTRA + 1 passed growth tests: NaN columns (the driver then
    reports NonFiniteResult), blocks of one row excepted (their vector is exact)."""
    d, e = tridiagonal("tiny_e", np.random.default_rng())
    e[:3] = 0.0                                   # rows 0..2: blocks of one row
    monkeypatch.setattr(sd, "MAXITS", 2)
    _, Z = sd.stein_subset_device(d, e, 0, d.shape[0] - 1, ops=OPS)
    _, first, end = sd.bisect_blocks(OPS, d, e, 0, d.shape[0] - 1)
    one_row = end - first == 1
    assert one_row.sum() >= 3
    assert np.isnan(Z[:, ~one_row]).any(axis=0).all() and np.isfinite(Z[:, one_row]).all()


def test_non_finite_t_gives_nan_vectors():
    d, e = np.ones(7), np.full(6, 0.5)
    e[3] = np.inf
    w, Z = sd.stein_subset_device(d, e, 2, 4, ops=OPS)
    assert np.isnan(w).all() and np.isnan(Z).all() and Z.shape == (7, 3)


def test_start_vectors_are_fixed_uniforms():
    """start_values: in [-1, 1), a function of (index, row) only, not of the batch."""
    v = start_values(np.array([5, 9]), 1000)
    assert v.min() >= -1 and v.max() < 1 and abs(v.mean()) < 0.1
    assert np.array_equal(start_values(np.array([9]), 1000)[:, 0], v[:, 1])
    assert np.array_equal(start_values(np.array([5]), 10)[:, 0], v[:10, 0])


def test_plan_clusters_and_shifts_follow_dstein():
    """Clusters break where neighbours in a block are more than 1e-3 ||T_block||_1 apart or the
    block changes; equal eigenvalues get dstein's 10 ulp |x| steps."""
    d = np.array([1.0, 1.0, 1.0, 5.0, 7.0])
    e = np.array([0.0, 0.0, 1e-3, 0.0])           # blocks [0], [1], [2, 3], [4]
    w, first, end = sd.bisect_blocks(OPS, d, e, 0, 4)
    plan = sd.make_plan(d, e, w, first, end, 0)
    assert [(int(a), int(b)) for a, b in zip(plan.first, plan.end)] == [(0, 1), (1, 2), (2, 4), (2, 4), (4, 5)]
    assert list(plan.cstart) == [0, 1, 2, 3, 4]
    d2, e2 = np.full(6, 2.0), np.full(5, 1e-9)    # one block, eigenvalues 2 +- O(1e-9): one cluster
    w2, f2, n2 = sd.bisect_blocks(OPS, d2, e2, 0, 5)
    plan2 = sd.make_plan(d2, e2, w2, f2, n2, 0)
    assert list(plan2.cstart) == [0] and np.all(np.diff(plan2.shift) > 0)
    same = sd.make_plan(np.ones(3), np.ones(2), np.full(3, 4.0), np.zeros(3, np.int64), np.full(3, 3), 0)
    assert np.array_equal(same.shift, 4.0 + np.array([0, 1, 2]) * 10 * abs(ULP * 4.0))


def test_kernels_compile():
    """stein_kernels.cu compiles with NVRTC for sm_90 (raw_module's options)."""
    from pathlib import Path

    import hpccoll.ext
    from hpccoll import HpccollError

    from hpccoll_eigensolver.linalg import _xp

    try:
        cubin = hpccoll.ext.compile_cubin(Path(_xp.HERE) / "stein_kernels.cu", _xp.module_options())
    except HpccollError as exc:
        if "NVRTC not found" in str(exc):
            pytest.skip(str(exc))
        raise
    assert cubin[:4] == b"\x7fELF"


# -- the launches: DeviceOps' arguments against the kernels' signatures --------------------------
_C_TYPES = {"double*": np.float64, "long long*": np.int64, "int*": np.int32, "signed char*": np.int8,
            "double": np.float64, "long long": np.int64, "int": np.int32}


def _signatures() -> dict:
    """{kernel: [C type of each parameter]} of stein_kernels.cu's extern "C" kernels."""
    import re
    from pathlib import Path

    from hpccoll_eigensolver.linalg import _xp

    src = (Path(_xp.HERE) / "stein_kernels.cu").read_text()
    out = {}
    for name, params in re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', src):
        out[name] = [re.sub(r"\s+", " ", p.replace("const ", "").rsplit(" ", 1)[0].strip()).replace(" *", "*")
                     + ("*" if "*" in p.rsplit(" ", 1)[1] else "") for p in params.split(",")]
    return out


class _Launch:
    """A kernel standing in for the GPU's: checks the grid, block and every argument's C type."""

    def __init__(self, name, types, seen):
        self.name, self.types, self.seen = name, types, seen

    def __call__(self, grid, block, args, shared_mem=0):
        assert len(args) == len(self.types), f"{self.name}: {len(args)} arguments for {len(self.types)} parameters"
        for i, (a, t) in enumerate(zip(args, self.types)):
            want = _C_TYPES[t]
            got = a.dtype if isinstance(a, np.ndarray) else type(a)
            assert got == want, f"{self.name} argument {i}: {got} for {t}"
            assert isinstance(a, np.ndarray) == t.endswith("*"), f"{self.name} argument {i}: array/scalar for {t}"
        assert len(grid) == 1 and len(block) == 1 and grid[0] >= 1
        if self.name == "stein_orth":
            assert block[0] == sd.TPB and shared_mem == 8 * sd.TPB
        self.seen.add(self.name)


class _CheckedOps(sd.DeviceOps):
    """DeviceOps on host arrays with _Launch kernels (each launch checked), the twin's results."""

    def __init__(self):
        self.xp, self.twin, self.seen = np, TwinOps(), set()
        sigs = _signatures()
        self.mod = type("Module", (), {"get_function": lambda _, name: _Launch(name, sigs[name], self.seen)})()

    def bisect(self, d, e, st, lo, k):
        super().bisect(d, e, st, lo, k)
        return self.twin.bisect(d, e, st, lo, k)

    def factor(self, d, e, put, Y, start):
        self.lu = super().factor(d, e, put, Y.copy(), start)
        return self.twin.factor(d, e, put, Y, start)

    def solve(self, put, lu, Y, active):
        super().solve(put, self.lu, Y.copy(), active)
        return self.twin.solve(put, lu, Y, active)

    def orth(self, put, active, qr_from, expo, nrmchk, Y):
        super().orth(put, active, qr_from, expo, nrmchk.copy(), Y.copy())
        self.twin.orth(put, active, qr_from, expo, nrmchk, Y)

    def finish(self, put, nrmchk, Y):
        super().finish(put, nrmchk, Y.copy())
        self.twin.finish(put, nrmchk, Y)


def test_device_launches_match_the_kernel_signatures():
    """Every kernel launch of DeviceOps passes as many arguments as the kernel has parameters,
    each of the parameter's type (arrays of its element type, NumPy scalars of its width)."""
    assert set(_signatures()) == {"stein_bisect", "stein_factor", "stein_solve", "stein_orth", "stein_finish"}
    d, e = tridiagonal("glued", np.random.default_rng())
    ops = _CheckedOps()
    w, Z = sd.stein_subset_device(d, e, 2, d.shape[0] - 3, ops=ops)
    assert ops.seen == set(_signatures())
    assert np.array_equal(Z, sd.stein_subset_device(d, e, 2, d.shape[0] - 3, ops=OPS)[1])
