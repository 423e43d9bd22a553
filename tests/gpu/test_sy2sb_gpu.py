"""sy2sb_device.PanelQR, the band reduction's panel kernel (sy2sb_kernels.cu), on one GPU: the
panel's R, v and tau are LAPACK dgeqrf's (scipy) to rounding and (I - V T V^T)^T A = R; T is
sy2sb.block_reflector's; V is unit lower trapezoidal; a second call gives the same bits; zero
columns give tau = 0 reflectors that drop out; a panel the kernel cannot hold is refused;
the one-GPU band reduction is an orthogonal similarity.  Fresh random panels on every run.

    python -m pytest -q tests/gpu/test_sy2sb_gpu.py      (tests/gpu/run.sh runs it once)"""
from __future__ import annotations

import _gpu_checks  # noqa: F401 - lazily-imported modules first (see there)
import numpy as np
import pytest
import scipy.linalg as sla

pytestmark = pytest.mark.gpu
STARTS_ITS_OWN_JOBS = True  # tests/gpu/run.sh: plain pytest, once (one GPU, no MPI)

SHAPES = [(m, b) for m in (1, 2, 5, 63, 64, 65, 200, 1001, 4097, 8449, 16320, 33001) for b in (64, 32, 7)]


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


def _factor(cp, A, extra_rows=3):
    """A (host, m x b) as a block of a taller F-order device array (ld = m + extra_rows, as a
    panel of C); returns (panel after, tau, V, T) on the host."""
    from hpccoll_eigensolver.linalg.sy2sb_device import PanelQR

    m, b = A.shape
    big = cp.zeros((m + extra_rows, b + 2), order="F")
    big[extra_rows:, 1:b + 1] = cp.asarray(A)
    panel = big[extra_rows:, 1:b + 1]
    tau = cp.full(b + 2, np.nan)
    V = cp.empty((m, b), order="F")
    T = cp.empty((b, b), order="F")
    qr = PanelQR(m + b, b)
    assert qr.fits
    qr(panel, tau[1:b + 1], V, T)
    assert cp.isnan(tau[0]) and cp.isnan(tau[b + 1]), "wrote outside tau[:b]"
    assert not cp.any(big[:extra_rows]) and not cp.any(big[:, 0]) and not cp.any(big[:, b + 1]), "wrote outside the panel"
    return cp.asnumpy(panel), cp.asnumpy(tau[1:b + 1]), cp.asnumpy(V), cp.asnumpy(T)


def _check(cp, A, out):
    from hpccoll_eigensolver.linalg.sy2sb import block_reflector

    qr, tau, V, T = out
    m, b = A.shape
    k = min(m, b)
    scale = max(np.linalg.norm(A), 1e-300)
    ref, tau_ref, _, info = sla.lapack.dgeqrf(np.asfortranarray(A))
    assert info == 0
    assert np.all(tau[k:] == 0.0)
    assert np.abs(tau[:k] - tau_ref[:k]).max() <= 1e-12, (m, b, "tau")
    R, Rref = np.triu(qr[:k]), np.triu(ref[:k])
    assert np.linalg.norm(R - Rref) <= 1e-13 * scale * np.sqrt(m), (m, b, "R")
    below = np.tril(qr, -1)[:, :k]
    assert np.abs(below - np.tril(ref, -1)[:, :k]).max() <= 1e-11, (m, b, "v")
    Vref = np.tril(qr, -1)
    Vref[np.arange(k), np.arange(k)] = 1.0
    Vref[:, k:] = 0.0
    assert np.array_equal(V, Vref), (m, b, "V is not the panel's unit lower trapezoidal V")
    assert np.array_equal(T, np.triu(T)), (m, b, "T below its diagonal")
    Tref = cp.asnumpy(block_reflector(cp, cp.asarray(V), cp.asarray(tau)))
    assert np.abs(T - Tref).max() <= 1e-12 * max(1.0, np.abs(Tref).max()), (m, b, "T")
    Q = np.eye(m) - V @ T @ V.T
    full = np.zeros_like(A)
    full[:k] = R
    assert np.linalg.norm(Q.T @ A - full) <= 1e-13 * scale * np.sqrt(m), (m, b, "Q^T A != R")
    assert np.linalg.norm(Q.T @ Q - np.eye(m)) <= 1e-13 * m, (m, b, "Q not orthogonal")


@pytest.mark.parametrize("m,b", [s for s in SHAPES if s[0] <= 4097])
def test_panel_is_lapacks_geqrf_and_t(cp, m, b):
    A = np.random.default_rng().standard_normal((m, b))
    out = _factor(cp, A)
    _check(cp, A, out)


@pytest.mark.parametrize("m,b", [s for s in SHAPES if s[0] > 4097 and s[1] == 64])
def test_tall_panels_factor_and_repeat_bitwise(cp, m, b):
    """Tall panels (several rows a block, every SM): R and tau as LAPACK's, Q^T A = R checked
    through V T V^T's action (no m x m Q), and a second call the same bits."""
    from hpccoll_eigensolver.linalg.sy2sb import block_reflector

    A = np.random.default_rng().standard_normal((m, b))
    qr, tau, V, T = out = _factor(cp, A)
    ref, tau_ref, _, _ = sla.lapack.dgeqrf(np.asfortranarray(A))
    scale = np.linalg.norm(A)
    assert np.abs(tau - tau_ref).max() <= 1e-12
    assert np.linalg.norm(np.triu(qr[:b]) - np.triu(ref[:b])) <= 1e-13 * scale * np.sqrt(m)
    QtA = A - V @ (T.T @ (V.T @ A))
    QtA[:b] -= np.triu(qr[:b])
    assert np.linalg.norm(QtA) <= 1e-13 * scale * np.sqrt(m)
    Tref = cp.asnumpy(block_reflector(cp, cp.asarray(V), cp.asarray(tau)))
    assert np.abs(T - Tref).max() <= 1e-12 * np.abs(Tref).max()
    again = _factor(cp, A)
    for x, y, name in zip(out, again, ("panel", "tau", "V", "T")):
        assert np.array_equal(x, y), f"m = {m}: {name} differs between two calls"


@pytest.mark.parametrize("m", [3, 70, 1000])
def test_zero_columns_give_identity_reflectors(cp, m):
    """Columns 2, 6 and 7 zero (nothing below the diagonal, exactly, once the earlier reflectors
    are applied): tau = 0 there (LAPACK's too), T's rows and columns zero there, Q^T A = R."""
    b = 8
    A = np.random.default_rng().standard_normal((m, b))
    A[:, 2] = 0.0
    A[:, 6:] = 0.0
    qr, tau, V, T = out = _factor(cp, A)
    assert tau[2] == 0.0 and np.all(tau[6:] == 0.0)
    for c in np.flatnonzero(tau == 0.0):
        assert not T[c].any() and not T[:, c].any(), f"T's row or column {c} (tau = 0) is not zero"
    _check(cp, A, out)


def test_panels_the_kernel_cannot_hold_are_refused(cp):
    from hpccoll_eigensolver.linalg.sy2sb_device import B_MAX, PanelQR

    assert not PanelQR(1000, B_MAX + 1).fits
    qr = PanelQR(1000, 64)
    with pytest.raises(ValueError, match="V must be F-order"):
        qr(cp.zeros((936, 64), order="F"), cp.zeros(64), cp.zeros((936, 64)), cp.zeros((64, 64), order="F"))
    with pytest.raises(ValueError, match="does not fit"):
        qr(cp.zeros((936, 32), order="F"), cp.zeros(64), cp.zeros((936, 32), order="F"), cp.zeros((32, 32), order="F"))


@pytest.mark.parametrize("n", [193, 1000])
def test_one_gpu_band_reduction_is_an_orthogonal_similarity(cp, comm, n):
    """sy2sb on one GPU (every panel through the kernel): Q1^T A Q1 is the band (Q1 by ormtr)."""
    from hpccoll_eigensolver.linalg.layout import BlockCyclic
    from hpccoll_eigensolver.linalg.ormtr import ormtr
    from hpccoll_eigensolver.linalg.sy2sb import sy2sb

    b = 64
    A = np.random.default_rng().standard_normal((n, n))
    A = A + A.T
    desc = BlockCyclic(n, n, 64, 1)
    C = cp.asfortranarray(cp.asarray(np.tril(A)))
    band, tau = sy2sb(C, desc, comm, cp, b)
    band = cp.asnumpy(band)
    B = np.zeros((n, n))
    for d in range(b + 1):
        i = np.arange(n - d)
        B[i + d, i] = B[i, i + d] = band[d, :n - d]
    Q = cp.asfortranarray(cp.eye(n))
    Q = cp.asnumpy(ormtr(C, tau, Q, desc, comm, cp, offset=b))
    assert np.abs(Q.T @ Q - np.eye(n)).max() < 1e-13
    QtAQ = Q.T @ A @ Q
    assert np.abs(np.tril(QtAQ, -b - 1)).max() < 1e-12 * np.abs(A).max()
    assert np.abs(QtAQ - B).max() < 1e-12 * n * np.abs(A).max()
