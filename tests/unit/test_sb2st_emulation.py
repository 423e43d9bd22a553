"""sb2st_kernels.cu on the CPU: its step (chase_step, compiled as C++ with SB2ST_HOST by
tests/unit/sb2st_emulation.cpp, each phase run over all 256 thread indices in turn) against the
host sb2st, in serial and in rule-permitted interleavings, under several thread orders (bit for
bit the same: no phase races); its wait rule is sb2st.steps_needed; the file compiles with
NVRTC as raw_module compiles it."""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from kernel_emulation import build_emulation, ptr

from hpccoll_eigensolver.linalg import _xp
from hpccoll_eigensolver.linalg import sb2st as S
from hpccoll_eigensolver.linalg.sb2st_device import group_starts

from test_sb2st_schedule import permitted_order


def build(folder):
    """The emulation's shared library, built in `folder` (the test skipped without a C++ compiler)."""
    so = build_emulation(folder, "sb2st_emulation.cpp", ["-Wno-unknown-pragmas"])
    P = ctypes.POINTER
    so.sb2st_emu_step.argtypes = [P(ctypes.c_double), P(ctypes.c_double), P(ctypes.c_longlong)] + [ctypes.c_int] * 6
    return so


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return build(tmp_path_factory.mktemp("sb2st"))


def emulate(so, band, g, order=None, threads=0, separate=False):
    """The kernel's steps on the CPU in `order` (default serial): (d, e, flat) as sb2st_device
    returns them; separate=True: (d, e, groups), each group its own array, addressed as
    sb2st_device addresses them (group_starts)."""
    b, n = band.shape[0] - 1, band.shape[1]
    A = S._SymmetricBand(band, 2 * b)        # the kernel's working band: the same storage
    off = S.group_offsets(n, b, g)
    if separate:
        groups = [np.zeros(S.group_shape(n, b, g, q)) for q in range(len(off) - 1)]
        base, starts = group_starts([a.ctypes.data if a.size else None for a in groups])
        flat_ptr = ctypes.cast(ctypes.c_void_p(base), ctypes.POINTER(ctypes.c_double))
    else:
        flat = np.zeros(off[-1])
        flat_ptr, starts = ptr(flat), off[:-1]
    goff = np.array(starts, dtype=np.int64)
    steps = order or [(j, k) for j in range(S.n_sweeps(n)) for k in range(S.sweep_steps(n, b, j))]
    for j, k in steps:
        so.sb2st_emu_step(ptr(A.buf), flat_ptr, ptr(goff, ctypes.c_longlong), n, b, g, j, k, threads)
    d, e = A.diagonals()
    return d, e, groups if separate else flat


def _flat(refl):
    return np.concatenate([r.ravel() for r in refl]) if refl else np.zeros(0)


def _band(n, b, seed):
    return np.random.default_rng(seed).standard_normal((b + 1, n))


def test_constants_and_rule_are_the_host_ones(emu):
    assert emu.sb2st_emu_const(2) == S.LAG and emu.sb2st_emu_const(1) == 64 and emu.sb2st_emu_const(0) in (128, 256)
    for n, b in [(3, 2), (40, 3), (67, 8), (130, 64), (101, 16)]:
        for j in range(S.n_sweeps(n) + 1):
            assert emu.sb2st_emu_sweep_steps(n, b, j) == S.sweep_steps(n, b, j)
            for k in range(S.sweep_steps(n, b, j)):
                assert emu.sb2st_emu_steps_needed(n, b, j, k) == S.steps_needed(n, b, j, k)


@pytest.mark.parametrize("n,b,g", [(67, 8, 5), (130, 64, 64), (101, 32, 7), (40, 3, 3)])
def test_groups_in_separate_allocations_get_the_same_bits(emu, n, b, g):
    """sb2st_device(separate=True)'s addressing: each group its own allocation at its offset from
    the lowest one; the same reflectors, d and e, bit for bit, as the one array."""
    band = _band(n, b, seed=None)             # fresh data: the bits agree for any band
    d, e, flat = emulate(emu, band, g)
    d2, e2, groups = emulate(emu, band, g, separate=True)
    assert np.array_equal(d, d2) and np.array_equal(e, e2)
    assert np.array_equal(flat, _flat(groups))


def test_group_starts():
    assert group_starts([None, None]) == (0, [0, 0])
    assert group_starts([4096, None, 1024, 2048]) == (1024, [384, 0, 0, 128])
    with pytest.raises(ValueError, match="aligned"):
        group_starts([1024, 1028])


@pytest.mark.parametrize("n,b,g", [(3, 2, 2), (4, 2, 1), (5, 3, 3), (17, 2, 2), (17, 16, 16), (67, 3, 3),
                                   (67, 8, 5), (130, 64, 64), (101, 32, 7), (66, 64, 1), (90, 5, 1), (10, 16, 16)])
def test_the_kernel_step_computes_what_the_host_does(emu, n, b, g):
    band = _band(n, b, seed=n * 1000 + b)
    d, e, flat = emulate(emu, band, g)
    hd, he, hrefl = S.sb2st(band, g)
    hflat = _flat(hrefl)
    scale = np.abs(band).max() * np.sqrt(b + 1)
    assert flat.shape == hflat.shape
    assert np.abs(d - hd).max() < 1e-12 * scale and np.abs(e - he).max(initial=0) < 1e-12 * scale
    assert np.abs(flat - hflat).max(initial=0) < 1e-11
    assert np.array_equal(flat == 0, hflat == 0)          # the same entries written
    # the spectrum of T is the band's
    B = np.zeros((n, n))
    for dd in range(min(b, n - 1) + 1):
        idx = np.arange(n - dd)
        B[idx + dd, idx] = B[idx, idx + dd] = band[dd, :n - dd]
    T = np.diag(d) + np.diag(e, 1) + np.diag(e, -1)
    assert np.abs(np.linalg.eigvalsh(T) - np.linalg.eigvalsh(B)).max() < 1e-13 * n * np.abs(B).max()


@pytest.mark.parametrize("n,b,g", [(47, 2, 2), (67, 3, 4), (90, 8, 8), (150, 16, 3)])
def test_interleavings_and_thread_orders_give_the_same_bits(emu, n, b, g):
    band = _band(n, b, seed=n + b)
    ref = emulate(emu, band, g)
    rng = np.random.default_rng(n * b)
    runs = [emulate(emu, band, g, threads=1), emulate(emu, band, g, threads=7)]
    for t in range(3):
        runs.append(emulate(emu, band, g, permitted_order(n, b, S.steps_needed, rng), threads=t + 2))
    runs.append(emulate(emu, band, g, permitted_order(n, b, S.steps_needed, rng, greedy=True)))
    for got in runs:
        assert all(x.tobytes() == y.tobytes() for x, y in zip(got, ref))


def test_zero_pivot_columns_give_the_identity(emu):
    """A band already tridiagonal in places: the steps with nothing below the pivot store v[0] = 1,
    tau = 0 and change nothing, as the host's."""
    n, b, g = 40, 4, 4
    band = _band(n, b, seed=5)
    band[2:, :20] = 0.0                      # the leading 20 columns tridiagonal
    band[1:, 19] = 0.0                       # and decoupled from the rest
    d, e, flat = emulate(emu, band, g)
    hd, he, hrefl = S.sb2st(band, g)
    hflat = _flat(hrefl)
    assert np.array_equal(flat == 0, hflat == 0)
    assert np.abs(flat - hflat).max() < 1e-12 and np.abs(d - hd).max() < 1e-12 and np.abs(e - he).max() < 1e-12
    R0 = flat[:S.group_offsets(n, b, g)[1]].reshape(S.group_shape(n, b, g, 0))
    assert np.all(R0[:, b, :] == 0.0) and np.all(R0[0, 0, :] == 1.0)   # sweeps 0..3: H = I throughout
    assert np.array_equal(d[:19], band[0, :19]) and np.array_equal(e[:19], band[1, :19])


def test_the_kernel_file_compiles_with_nvrtc():
    import hpccoll.ext
    from hpccoll import HpccollError

    try:
        cubin = hpccoll.ext.compile_cubin(Path(_xp.HERE) / "sb2st_kernels.cu", _xp.module_options())
    except HpccollError as exc:
        if "NVRTC not found" in str(exc):
            pytest.skip(str(exc))
        raise
    assert cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("n,b", [(3, 2), (10, 16), (67, 8), (130, 64)])
def test_sb2st_device_starts_from_the_hosts_working_band(n, b):
    from hpccoll_eigensolver.linalg.sb2st_device import working_band

    band = _band(n, b, seed=n)
    A = working_band(band, np)
    host = S._SymmetricBand(band, 2 * b).buf
    assert A.shape == (n * (4 * b + 1),) and np.array_equal(A, host[:A.size]) and not host[A.size:].any()
