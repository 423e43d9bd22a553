"""sb2st_device, the bulge chasing kernel (sb2st_kernels.cu), on one GPU: T's eigenvalues are the
band's, B = Q2 T Q2^T with Q2 from the flat reflectors (sb2st.apply_q2), d, e and the reflectors
are the host sb2st's to the rounding a different summation order makes, and bit for bit the
kernel's CPU emulation (tests/unit/sb2st_emulation.cpp) whatever the grid; b = 65 is refused;
an expired wait raises instead of hanging.  Prints the time of n = 4096 and 8192 at b = 32, 64.

    python -m pytest -q -s tests/gpu/test_sb2st_gpu.py      (tests/gpu/run.sh runs it once)"""
from __future__ import annotations

import functools
import importlib
import sys
import time
from pathlib import Path

import _gpu_checks  # noqa: F401 - lazily-imported modules first (see there)
import numpy as np
import pytest

from hpccoll_eigensolver.linalg import sb2st as S

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
import test_sb2st_emulation as emulation  # noqa: E402 - the kernel's CPU emulation

pytestmark = pytest.mark.gpu
STARTS_ITS_OWN_JOBS = True  # tests/gpu/run.sh: plain pytest, once (one GPU, no MPI)

G_OTHER = {2: 5, 3: 1, 8: 3, 32: 7, 64: 17}   # a group size other than b, per b
CASES = [(n, b, g) for n in (3, 4, 67, 300, 1001) for b in (2, 3, 8, 32, 64) if b < n for g in (b, G_OTHER[b])]


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return emulation.build(tmp_path_factory.mktemp("sb2st"))   # skips without a C++ compiler


def _band(n, b):
    return np.random.default_rng(1000 * n + b).standard_normal((b + 1, n))


def _dense(band):
    b, n = band.shape[0] - 1, band.shape[1]
    B = np.zeros((n, n))
    for d in range(min(b, n - 1) + 1):
        i = np.arange(n - d)
        B[i + d, i] = B[i, i + d] = band[d, :n - d]
    return B


def _regroup(refl1, n, b, g):
    """Per-sweep reflectors (sb2st with g = 1) laid out as the flat array of groups of g."""
    off = S.group_offsets(n, b, g)
    flat = np.zeros(off[-1])
    for q in range(len(off) - 1):
        R = flat[off[q]:off[q + 1]].reshape(S.group_shape(n, b, g, q))
        for t in range(g):
            j = q * g + t
            if j < S.n_sweeps(n):
                R[:refl1[j].shape[0], :, t] = refl1[j][:, :, 0]
    return flat


@functools.lru_cache(maxsize=None)
def _host(n, b):
    d, e, refl1 = S.sb2st(_band(n, b), 1)
    return d, e, refl1


_emulated: dict = {}


def _emulated_flat(emu, n, b):
    if (n, b) not in _emulated:
        _emulated[(n, b)] = emulation.emulate(emu, _band(n, b), 1)
    return _emulated[(n, b)]


@pytest.mark.parametrize("n,b,g", CASES)
def test_the_gpu_tridiagonalizes_the_band(cp, n, b, g):
    from hpccoll_eigensolver.linalg.sb2st_device import sb2st_device

    band = _band(n, b)
    d, e, flat = (x.get() for x in sb2st_device(cp.asarray(band), g))
    off = S.group_offsets(n, b, g)
    assert d.shape == (n,) and e.shape == (n - 1,) and flat.shape == (off[-1],)
    B = _dense(band)
    norm = np.linalg.norm(B, 2)
    T = np.diag(d) + np.diag(e, 1) + np.diag(e, -1)
    assert np.abs(np.linalg.eigvalsh(T) - np.linalg.eigvalsh(B)).max() <= 1e-13 * norm
    if n <= 300 or b >= 8:   # n = 1001 at b = 2, 3: 10^5 compact-WY blocks, too slow to form Q2
        Q = S.apply_q2(lambda q: cp.asarray(flat[off[q]:off[q + 1]].reshape(S.group_shape(n, b, g, q))),
                       n, b, g, cp.eye(n), cp).get()
        assert np.abs(Q.T @ Q - np.eye(n)).max() <= 1e-13
        assert np.abs(Q @ T @ Q.T - B).max() <= 1e-13 * norm
    # the host's d, e and reflectors, up to the rounding of another summation order (which grows
    # along the sweeps: about 1e-10 in d and 1e-8 in the reflectors at n = 1001)
    hd, he, refl1 = _host(n, b)
    hflat = _regroup(refl1, n, b, g)
    assert np.array_equal(flat == 0, hflat == 0)
    assert np.abs(d - hd).max() <= 1e-7 * norm and np.abs(e - he).max(initial=0) <= 1e-7 * norm
    assert np.abs(flat - hflat).max(initial=0) <= 1e-6


@pytest.mark.parametrize("n,b,g", CASES)
def test_the_gpu_gives_the_emulations_bits(cp, emu, n, b, g):
    """The kernel's CPU emulation runs the same operations in one serial order: the same bits
    here say that the GPU's concurrent steps saw exactly what the serial order shows them."""
    from hpccoll_eigensolver.linalg.sb2st_device import sb2st_device

    d, e, flat = (x.get() for x in sb2st_device(cp.asarray(_band(n, b)), g))
    ed, ee, eflat = _emulated_flat(emu, n, b)
    assert d.tobytes() == ed.tobytes() and e.tobytes() == ee.tobytes()
    assert flat.tobytes() == _regroup_flat(eflat, n, b, g).tobytes()


def _regroup_flat(flat1, n, b, g):
    off1 = S.group_offsets(n, b, 1)
    refl1 = [flat1[off1[j]:off1[j + 1]].reshape(S.group_shape(n, b, 1, j)) for j in range(len(off1) - 1)]
    return _regroup(refl1, n, b, g)


@pytest.mark.parametrize("n,b", [(1001, 8), (300, 32), (700, 3)])
def test_runs_and_grids_give_the_same_bits(cp, n, b):
    from hpccoll_eigensolver.linalg.sb2st_device import sb2st_device

    band = cp.asarray(_band(n, b))
    ref = [x.get() for x in sb2st_device(band)]
    for grid in (None, 1, 2, 5, 64):
        got = [x.get() for x in sb2st_device(band, grid=grid)]
        assert all(x.tobytes() == y.tobytes() for x, y in zip(got, ref)), f"grid={grid}"


@pytest.mark.parametrize("n,b,g", [(1001, 64, 64), (300, 32, 7), (700, 3, 3), (2, 5, 5)])
def test_groups_in_separate_allocations_are_the_flat_arrays_bits(cp, n, b, g):
    from hpccoll_eigensolver.linalg.sb2st_device import sb2st_device

    band = cp.asarray(_band(n, b))
    d, e, flat = (x.get() for x in sb2st_device(band, g))
    d2, e2, groups = sb2st_device(band, g, separate=True)
    assert [R.shape for R in groups] == [S.group_shape(n, b, g, q) for q in range(len(groups))]
    assert np.array_equal(d, d2.get()) and np.array_equal(e, e2.get())
    assert np.array_equal(flat, np.concatenate([R.get().ravel() for R in groups]) if groups else np.zeros(0))


@pytest.mark.parametrize("n,b", [(1, 2), (2, 5), (10, 1), (10, 0), (2, 70)])
def test_small_n_or_b_is_already_tridiagonal(cp, n, b):
    from hpccoll_eigensolver.linalg.sb2st_device import sb2st_device

    band = _band(n, b)
    if b > 64:
        with pytest.raises(ValueError, match=f"b={b}"):
            sb2st_device(cp.asarray(band), 1)
        return
    d, e, flat = (x.get() for x in sb2st_device(cp.asarray(band), 1))
    hd, he, refl = S.sb2st(band, 1)
    assert np.array_equal(d, hd) and np.array_equal(e, he)
    assert flat.size == sum(r.size for r in refl) and not flat.any()


def test_b_above_64_and_g_below_1_are_refused(cp):
    from hpccoll_eigensolver.linalg.sb2st_device import sb2st_device

    with pytest.raises(ValueError, match="b=65"):
        sb2st_device(cp.asarray(_band(300, 65)))
    with pytest.raises(ValueError, match="g=0"):
        sb2st_device(cp.asarray(_band(300, 8)), 0)


def test_an_expired_wait_raises(cp):
    """timeout_s=0: a block that waits longer than its first 256 polls times out (block i's
    first step waits for about 3 i steps of the sweeps before it); every block returns."""
    from hpccoll_eigensolver.linalg.sb2st_device import sb2st_device

    band = cp.asarray(_band(4096, 64))
    with pytest.raises(RuntimeError, match="waited"):
        sb2st_device(band, timeout_s=0.0)
    d, _, _ = sb2st_device(cp.asarray(_band(67, 8)))   # the GPU is usable afterwards
    assert d.shape == (67,)


def test_print_the_time(cp, capsys):
    M = importlib.import_module("hpccoll_eigensolver.linalg.sb2st_device")
    func, smem = M.chase_kernel()
    most = M.resident_blocks(func, smem)
    lines = [f"sb2st_device on {cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)['name'].decode()}, "
             f"{most} resident blocks of {M.TPB} threads, {smem} bytes of shared memory each"]
    for n in (4096, 8192):
        for b in (32, 64):
            band = cp.random.default_rng(n + b).standard_normal((b + 1, n))
            M.sb2st_device(band)                                  # compiled, warmed
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            M.sb2st_device(band)
            cp.cuda.Device().synchronize()
            lines.append(f"  n={n} b={b}: {1e3 * (time.perf_counter() - t0):.1f} ms "
                         f"({min(S.n_sweeps(n), most)} blocks)")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


@pytest.mark.parametrize("n,b", [(300, 32), (1001, 8), (130, 64)])
def test_without_reflectors_the_same_diagonals(cp, n, b):
    """reflectors=False (eigenvalues only): no reflector array, d and e bit for bit as with it."""
    from hpccoll_eigensolver.linalg.sb2st_device import sb2st_device

    band = cp.asarray(_band(n, b))
    d, e, flat = sb2st_device(band)
    d2, e2, none = sb2st_device(band, reflectors=False)
    assert none is None and flat is not None
    assert d.get().tobytes() == d2.get().tobytes() and e.get().tobytes() == e2.get().tobytes()
