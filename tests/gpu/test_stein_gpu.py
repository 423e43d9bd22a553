"""The GPU tridiagonal subset (linalg/stein_device.py, stein_kernels.cu) on one GPU: the kernels
give their NumPy twin's bits (stein_twin.py; its algorithm is checked against LAPACK by
tests/unit/test_stein_device.py) on the hard cases, the cuSOLVER QR path is as accurate as
LAPACK's dstein, results repeat bitwise, and a printed timing at n = 16384.

One process, no MPI (tests/gpu/run.sh runs this file once with plain pytest):
    python -m pytest -s tests/gpu/test_stein_gpu.py"""
from __future__ import annotations

import time

import _gpu_checks  # noqa: F401 - lazily-imported modules first (see there)
import numpy as np
import pytest

from conftest import TRIDIAGONAL_CASES, dense_tridiagonal, hard_tridiagonal

pytestmark = pytest.mark.gpu
STARTS_ITS_OWN_JOBS = True  # tests/gpu/run.sh: run this file outside mpiexec (it needs no MPI)

ULP = 2.0 ** -52


def _ops():
    from hpccoll_eigensolver.linalg.stein_device import DeviceOps
    from hpccoll_eigensolver.linalg.stein_twin import TwinOps

    return DeviceOps(), TwinOps()


def _quality(d, e, w, Z):
    """Residual ||T Z - Z diag(w)||_F / (n ulp ||T||_1) and ||Z^T Z - I||_F / (n ulp), on the host."""
    n = d.shape[0]
    T = dense_tridiagonal(d, e)
    norm = max(np.abs(T).sum(axis=0).max(), np.finfo(float).tiny)
    return (np.linalg.norm(T @ Z - Z * w) / (n * ULP * norm),
            np.linalg.norm(Z.T @ Z - np.eye(Z.shape[1])) / (n * ULP))


@pytest.mark.parametrize("case", TRIDIAGONAL_CASES)
def test_bisect_kernel_gives_the_twins_bits(case):
    """stein_bisect: w and the blocks [first, end) equal to the twin's, bitwise."""
    import cupy as cp

    from hpccoll_eigensolver.linalg.stein_device import bisect_blocks, bisect_device

    seed = np.random.SeedSequence().entropy
    rng = np.random.default_rng(seed)
    d, e = hard_tridiagonal(case, rng)
    n = d.shape[0]
    lo = int(rng.integers(0, n))
    hi = int(rng.integers(lo, n))
    device, twin = _ops()
    got = bisect_blocks(device, cp.asarray(d), cp.asarray(e), lo, hi)
    want = bisect_blocks(twin, d, e, lo, hi)
    for g, t, name in zip(got, want, ("w", "first", "end")):
        assert np.array_equal(cp.asnumpy(g), t), f"{case} ({lo}, {hi}) {name} seed={seed}"
    assert np.array_equal(cp.asnumpy(bisect_device(cp.asarray(d), cp.asarray(e), lo, hi)), want[0])


@pytest.mark.parametrize("case", TRIDIAGONAL_CASES)
def test_vector_kernels_give_the_twins_bits(case):
    """stein_factor, stein_solve, stein_orth (every cluster by Gram-Schmidt: qr_from past k) and
    stein_finish: the twin's vectors, bitwise; and accurate (as tests/unit checks the twin)."""
    import cupy as cp

    from hpccoll_eigensolver.linalg.stein_device import stein_subset_device

    seed = np.random.SeedSequence().entropy
    rng = np.random.default_rng(seed)
    d, e = hard_tridiagonal(case, rng)
    n = d.shape[0]
    lo = int(rng.integers(0, n))
    hi = int(rng.integers(lo, n))
    device, twin = _ops()
    w, Z = stein_subset_device(cp.asarray(d), cp.asarray(e), lo, hi, ops=device, qr_from=n + 1)
    wt, Zt = stein_subset_device(d, e, lo, hi, ops=twin, qr_from=n + 1)
    what = f"{case} n={n} ({lo}, {hi}) seed={seed}"
    assert isinstance(Z, cp.ndarray) and Z.flags.f_contiguous and Z.shape == (n, hi - lo + 1), what
    assert np.array_equal(cp.asnumpy(w), wt), what
    assert np.array_equal(cp.asnumpy(Z), Zt, equal_nan=True), what
    res, orth = _quality(d, e, wt, Zt)
    assert res <= 8 and orth <= 8, f"{what}: {res:.3g}, {orth:.3g}"


def test_unconverged_vectors_are_nan_as_in_the_twin(monkeypatch):
    """MAXITS = 2 (no vector passes the growth test EXTRA + 1 times): stein_finish's NaN columns
    (blocks of one row excepted) are the twin's."""
    import cupy as cp

    from hpccoll_eigensolver.linalg import stein_device as sd

    d, e = hard_tridiagonal("tiny_e", np.random.default_rng())
    e[:2] = 0.0
    n = d.shape[0]
    monkeypatch.setattr(sd, "MAXITS", 2)
    device, twin = _ops()
    Z = sd.stein_subset_device(cp.asarray(d), cp.asarray(e), 0, n - 1, ops=device)[1]
    Zt = sd.stein_subset_device(d, e, 0, n - 1, ops=twin)[1]
    assert np.isnan(Zt).any() and np.array_equal(cp.asnumpy(Z), Zt, equal_nan=True)


@pytest.mark.parametrize("case", ["cluster", "glued", "wilkinson", "random"])
def test_householder_path_is_accurate_and_repeatable(case):
    """Clusters of at least qr_from = 2 vectors orthonormalized by cuSOLVER's QR: accurate,
    and the same bits on a second run."""
    import cupy as cp

    from hpccoll_eigensolver.linalg.stein_device import stein_subset_device

    seed = np.random.SeedSequence().entropy
    d, e = hard_tridiagonal(case, np.random.default_rng(seed))
    n = d.shape[0]
    dg, eg = cp.asarray(d), cp.asarray(e)
    w, Z = stein_subset_device(dg, eg, 0, n - 1, qr_from=2)
    w2, Z2 = stein_subset_device(dg, eg, 0, n - 1, qr_from=2)
    assert cp.array_equal(w, w2) and cp.array_equal(Z, Z2), f"{case} seed={seed}"
    res, orth = _quality(d, e, cp.asnumpy(w), cp.asnumpy(Z))
    assert res <= 8 and orth <= 8, f"{case} seed={seed}: {res:.3g}, {orth:.3g}"


def _random_tridiagonal(n, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n), rng.standard_normal(n - 1)


def test_timing_n16384(capsys):
    """Printed, not asserted: n = 16384 (a random tridiagonal), bisection of all n eigenvalues and
    of the lowest n/10, and the lowest n/10 vectors (the Householder path for their large
    clusters); a check of the vectors' residual and orthogonality on the GPU."""
    import cupy as cp

    from hpccoll_eigensolver.linalg.stein_device import (
        DeviceOps, bisect_blocks, bisect_device, make_plan, stein_device,
    )

    n, k = 16384, 1638
    d, e = _random_tridiagonal(n, 0)
    dg, eg = cp.asarray(d), cp.asarray(e)
    stein_device(dg[:200], eg[:199], *bisect_blocks(DeviceOps(), dg[:200], eg[:199], 0, 99), 0, qr_from=2)  # warm up
    cp.cuda.Device().synchronize()

    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        cp.cuda.Device().synchronize()
        return out, time.perf_counter() - t0

    _, t_all = timed(lambda: bisect_device(dg, eg, 0, n - 1))
    (w, first, end), t_low = timed(lambda: bisect_blocks(DeviceOps(), dg, eg, 0, k - 1))
    Z, t_vec = timed(lambda: stein_device(dg, eg, w, first, end, 0))
    plan = make_plan(d, e, cp.asnumpy(w), cp.asnumpy(first), cp.asnumpy(end), 0)
    sizes = np.sort(plan.cend - plan.cstart)[::-1]
    TZ = dg[:, None] * Z
    TZ[:-1] += eg[:, None] * Z[1:]
    TZ[1:] += eg[:, None] * Z[:-1]
    norm = float(cp.abs(dg).max() + 2 * cp.abs(eg).max())
    res = float(cp.linalg.norm(TZ - Z * w[None, :])) / (n * ULP * norm)
    orth = float(cp.linalg.norm(Z.T @ Z - cp.eye(k))) / (n * ULP)
    with capsys.disabled():
        print(f"\nstein on the GPU, n = {n} (random tridiagonal): bisection of all n {t_all:.3f} s, "
              f"of the lowest {k} {t_low:.3f} s; their vectors {t_vec:.3f} s "
              f"({sizes.size} clusters, largest {list(sizes[:4])}); residual {res:.3g}, orthogonality {orth:.3g} "
              "(n ulp units)")
    assert bool(cp.isfinite(Z).all())
    assert res <= 8 and orth <= 8
