"""q2_kernels.cu's group path on the CPU: q2_group_T and q2_group_apply, compiled as C++ with
Q2_HOST by tests/unit/q2_emulation.cpp (each phase over all Q2_THREADS (512) thread indices in turn, each mma
as the sum each lane's outputs take), group by group in apply_q2_groups' order, against the
host's block loop (sb2st.apply_q2) to rounding; bit for bit the same under three thread orders
(no phase races); rows and columns outside Z untouched."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from kernel_emulation import build_emulation, ptr

from hpccoll_eigensolver.linalg.sb2st import _groups, apply_q2, block_reflector, group_offsets, group_shape, sweep_steps

P = ctypes.POINTER


def build(folder):
    """The emulation's shared library, built in `folder` (the test skipped without a C++ compiler)."""
    so = build_emulation(folder, "q2_emulation.cpp", ["-Wno-unknown-pragmas"])
    so.q2_emu_group_T.argtypes = [P(ctypes.c_double), P(ctypes.c_longlong)] + [ctypes.c_int] * 4 + [
        P(ctypes.c_double), ctypes.c_int]
    so.q2_emu_group_apply.argtypes = [P(ctypes.c_double), P(ctypes.c_longlong), P(ctypes.c_double)] + [
        ctypes.c_int] * 5 + [P(ctypes.c_double), ctypes.c_longlong, ctypes.c_int, ctypes.c_int]
    return so


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return build(tmp_path_factory.mktemp("q2"))


def random_flat(rng, n, b, g):
    """Reflectors in the group_offsets layout: v's unit first entry, entries up to row n - 1,
    tau = 2 / |v|^2 (an orthogonal Q2, as sb2st's), tau = 0 where sweep q g + t has no step k."""
    off = group_offsets(n, b, g)
    flat = rng.standard_normal(off[-1])
    i = np.arange(b)[None, :, None]
    t = np.arange(g)[None, None, :]
    for q in range(len(off) - 1):
        K = group_shape(n, b, g, q)[0]
        R = flat[off[q]:off[q + 1]].reshape(K, b + 1, g)
        s = q * g + 1 + np.arange(K)[:, None, None] * b + t
        v = R[:, :b, :]
        v *= s + i < n
        v[:, 0, :] = 1.0
        R[:, b, :] = np.where(s[:, 0, :] <= n - 2, 2.0 / (v * v).sum(axis=1), 0.0)
    return flat


def emulate(so, flat, n, b, g, Z, order=0):
    """apply_q2_groups' launches on the CPU: Z <- Q2 Z in place (Z Fortran-order, or a column
    block of one)."""
    off = np.array(group_offsets(n, b, g), dtype=np.int64)
    ncols = Z.shape[1]
    ldz = Z.strides[1] // 8 if ncols > 1 else n
    K = [sweep_steps(n, b, q * g) for q in range(_groups(n, g))]
    T = np.full(max(K, default=0) * g * g, np.nan)
    for q in reversed(range(len(K))):
        if K[q] and ncols:
            so.q2_emu_group_T(ptr(flat), ptr(off, ctypes.c_longlong), q, K[q], b, g, ptr(T), order)
            so.q2_emu_group_apply(ptr(flat), ptr(off, ctypes.c_longlong), ptr(T), q, K[q], n, b, g,
                                  Z.ctypes.data_as(P(ctypes.c_double)), ldz, ncols, order)
    return Z


def _host(flat, n, b, g, Z):
    off = group_offsets(n, b, g)
    return apply_q2(lambda q: flat[off[q]:off[q + 1]].reshape(group_shape(n, b, g, q)), n, b, g, Z, np)


def _rel(got, want):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1.0)) if want.size else 0.0


CASES = [(5, 2, 2, 3), (67, 8, 8, 70), (130, 16, 16, 65), (300, 32, 32, 129), (301, 5, 16, 64), (200, 64, 64, 130),
         (257, 40, 64, 66), (500, 64, 33, 1), (160, 64, 64, 200)]


@pytest.mark.parametrize("n,b,g,ncols", CASES)
def test_matches_the_host_block_loop(emu, n, b, g, ncols):
    rng = np.random.default_rng()
    flat = random_flat(rng, n, b, g)
    Z = np.asfortranarray(rng.standard_normal((n, ncols)))
    want = _host(flat, n, b, g, Z.copy(order="F"))
    got = emulate(emu, flat, n, b, g, Z.copy(order="F"))
    assert np.isfinite(got).all()
    assert _rel(got, want) < 1e-12


@pytest.mark.parametrize("n,b,g,ncols", [(130, 16, 16, 65), (257, 40, 64, 66)])
def test_the_same_bits_in_any_thread_order(emu, n, b, g, ncols):
    rng = np.random.default_rng()
    flat = random_flat(rng, n, b, g)
    Z = np.asfortranarray(rng.standard_normal((n, ncols)))
    runs = [emulate(emu, flat, n, b, g, Z.copy(order="F"), order) for order in (0, 1, 7)]
    assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[0], runs[2])


def test_on_a_block_of_a_larger_array_the_rest_is_untouched(emu):
    n, b, g, ncols = 200, 32, 32, 70
    rng = np.random.default_rng()
    flat = random_flat(rng, n, b, g)
    big = np.asfortranarray(rng.standard_normal((n + 5, ncols + 9)))
    before = big.copy()
    want = _host(flat, n, b, g, np.asfortranarray(big[:n, 4:4 + ncols]))
    emulate(emu, flat, n, b, g, big[:n, 4:4 + ncols])
    assert _rel(big[:n, 4:4 + ncols], want) < 1e-12
    assert np.array_equal(big[n:], before[n:]) and np.array_equal(big[:, :4], before[:, :4])
    assert np.array_equal(big[:, 4 + ncols:], before[:, 4 + ncols:])


@pytest.mark.parametrize("b,g", [(64, 64), (16, 5), (8, 33)])
def test_group_T_is_the_host_block_reflector(emu, b, g):
    n = 300
    rng = np.random.default_rng()
    flat = random_flat(rng, n, b, g)
    off = group_offsets(n, b, g)
    q = 1
    K = sweep_steps(n, b, q * g)
    T = np.full(K * g * g, np.nan)
    emu.q2_emu_group_T(ptr(flat), ptr(np.array(off, dtype=np.int64), ctypes.c_longlong), q, K, b, g, ptr(T), 0)
    R = flat[off[q]:off[q + 1]].reshape(K, b + 1, g)
    for k in range(K):
        V = np.zeros((b + g - 1, g))
        for t in range(g):
            V[t:t + b, t] = R[k, :b, t]
        want = block_reflector(np, V, R[k, b])
        assert _rel(T[k * g * g:(k + 1) * g * g].reshape(g, g, order="F"), want) < 1e-13
