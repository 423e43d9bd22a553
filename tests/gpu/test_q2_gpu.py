"""q2_device's Q2 Z on one GPU, each way (apply_q2_levels, apply_q2_groups, apply_q2_device that
picks, and apply_q2_group one group at a time, as several ranks apply it): equal to
sb2st.apply_q2 (the host's block loop) to rounding on reflectors of random symmetric bands,
B = Q2 T Q2^T through it on Z = I, the same bits on two runs, and (printed, not asserted) the
speed of the levels and the groups at n = 4096 to 16384 beside the host's block loop on CuPy.
No MPI: tests/gpu/run.sh runs this file once with plain pytest.

    python -m pytest -q -rs tests/gpu/test_q2_gpu.py"""
from __future__ import annotations

import functools

import _gpu_checks  # noqa: F401 - lazily-imported modules first (see there)
import numpy as np
import pytest

from hpccoll_eigensolver.linalg.q2_device import (apply_q2_device, apply_q2_group, apply_q2_groups, apply_q2_levels,
                                                  q2_flops)
from hpccoll_eigensolver.linalg.sb2st import _groups, apply_q2, group_offsets, group_shape, sb2st

pytestmark = pytest.mark.gpu
STARTS_ITS_OWN_JOBS = True  # tests/gpu/run.sh: run this file outside mpiexec (it uses no MPI)

WIDEST = 300


def _one_group_at_a_time(flat, n, b, g, Z):
    """apply_q2_group over q = Q - 1 .. 0, each group a separate array (as a rank receives it)."""
    off = group_offsets(n, b, g)
    for q in reversed(range(_groups(n, g))):
        apply_q2_group(flat[off[q]:off[q + 1]].reshape(group_shape(n, b, g, q)).copy(), n, b, g, q, Z)
    return Z


WAYS = {"levels": apply_q2_levels, "groups": apply_q2_groups, "device": apply_q2_device,
        "one-group": _one_group_at_a_time}


def _band(rng, n, b):
    band = rng.standard_normal((b + 1, n))
    for d in range(1, b + 1):
        band[d, n - d:] = 0.0
    return band


@functools.lru_cache(maxsize=None)
def _case(n, b, g):
    """(band, d, e, flat, Z, Q2 Z by the host's apply_q2) for a fresh random band, Z n x WIDEST."""
    rng = np.random.default_rng()
    band = _band(rng, n, b)
    d, e, refl = sb2st(band, g)
    flat = np.concatenate([r.ravel() for r in refl]) if refl else np.zeros(0)
    Z = np.asfortranarray(rng.standard_normal((n, WIDEST)))
    want = apply_q2(lambda q: refl[q], n, b, g, Z.copy(), np)
    return band, d, e, flat, Z, want


def _rel(got, want):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1.0)) if want.size else 0.0


# b = 2 at n = 1000 left out: the host's sb2st takes minutes there
SIZES = [(n, b) for n in (5, 67, 300, 1000) for b in (2, 8, 32, 64) if (n, b) != (1000, 2)]


@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize("n,b", SIZES)
@pytest.mark.parametrize("width", [0, 1, 7, 65, WIDEST])
def test_matches_the_host_apply(cupy, n, b, width, way):
    _, _, _, flat, Z, want = _case(n, b, b)
    Zd = cupy.asfortranarray(cupy.asarray(Z[:, :width]))
    WAYS[way](cupy.asarray(flat), n, b, b, Zd)
    assert _rel(Zd.get(), want[:, :width]) < 1e-12


@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize("n,b,g", [(300, 8, 3), (301, 5, 16), (67, 32, 7), (500, 64, 33), (400, 40, 64)])
def test_matches_the_host_apply_for_g_other_than_b(cupy, n, b, g, way):
    _, _, _, flat, Z, want = _case(n, b, g)
    Zd = cupy.asfortranarray(cupy.asarray(Z))
    WAYS[way](cupy.asarray(flat), n, b, g, Zd)
    assert _rel(Zd.get(), want) < 1e-12


@pytest.mark.parametrize("way", ["levels", "groups"])
def test_on_a_block_of_a_larger_array(cupy, way):
    """Z a column block of a taller Fortran array (leading dimension > n; for the levels a small
    budget: several chunks): the rows below n and the other columns stay untouched."""
    n, b = 300, 32
    _, _, _, flat, Z, want = _case(n, b, b)
    big = cupy.asfortranarray(cupy.asarray(np.random.default_rng().standard_normal((n + 5, WIDEST + 9))))
    before = big.get()
    big[:n, 4:4 + WIDEST] = cupy.asarray(Z)
    extra = {"budget": 8 * b * 5 * 7} if way == "levels" else {}
    WAYS[way](cupy.asarray(flat), n, b, b, big[:n, 4:4 + WIDEST], **extra)
    after = big.get()
    assert _rel(after[:n, 4:4 + WIDEST], want) < 1e-12
    assert np.array_equal(after[n:], before[n:]) and np.array_equal(after[:, :4], before[:, :4])
    assert np.array_equal(after[:, 4 + WIDEST:], before[:, 4 + WIDEST:])


@pytest.mark.parametrize("way", ["levels", "groups"])
@pytest.mark.parametrize("n,b", [(67, 8), (300, 64), (1000, 32), (1000, 64)])
def test_rebuilds_the_band_on_the_identity(cupy, n, b, way):
    band, d, e, flat, _, _ = _case(n, b, b)
    Q2 = cupy.asfortranarray(cupy.eye(n))
    WAYS[way](cupy.asarray(flat), n, b, b, Q2)
    Q2 = Q2.get()
    B = np.zeros((n, n))
    for k in range(b + 1):
        B[np.arange(k, n), np.arange(n - k)] = band[k, :n - k]
    B = np.tril(B) + np.tril(B, -1).T
    T = np.diag(d) + np.diag(e, 1) + np.diag(e, -1)
    assert _rel(Q2 @ T @ Q2.T, B) < 1e-12
    assert _rel(Q2.T @ Q2, np.eye(n)) < 1e-12


@pytest.mark.parametrize("way", ["levels", "groups"])
def test_same_bits_on_two_runs(cupy, way):
    n, b = 1000, 64
    _, _, _, flat, Z, _ = _case(n, b, b)
    runs = []
    for _ in range(2):
        Zd = cupy.asfortranarray(cupy.asarray(Z))
        WAYS[way](cupy.asarray(flat), n, b, b, Zd)
        runs.append(Zd.get())
    assert np.array_equal(runs[0], runs[1])


@pytest.mark.parametrize("way", sorted(WAYS))
def test_rejects_a_c_order_z(cupy, way):
    n, b = 67, 8
    _, _, _, flat, Z, _ = _case(n, b, b)
    with pytest.raises(ValueError, match="column-major"):
        WAYS[way](cupy.asarray(flat), n, b, b, cupy.ascontiguousarray(cupy.asarray(Z)))


@pytest.mark.parametrize("n,b,g,width", [(1000, 64, 64, 300), (301, 5, 16, 65), (500, 64, 33, 7)])
def test_one_group_at_a_time_is_the_group_path_bit_for_bit(cupy, n, b, g, width):
    _, _, _, flat, Z, _ = _case(n, b, g)
    fd = cupy.asarray(flat)
    got, want = (cupy.asfortranarray(cupy.asarray(Z[:, :width])) for _ in range(2))
    _one_group_at_a_time(fd, n, b, g, got)
    apply_q2_groups(fd, n, b, g, want)
    assert cupy.array_equal(got, want)


def test_one_group_rejects_a_wrong_group(cupy):
    n, b = 300, 8
    _, _, _, flat, Z, _ = _case(n, b, b)
    Zd = cupy.asfortranarray(cupy.asarray(Z))
    R = cupy.zeros(group_shape(n, b, b, 3))
    with pytest.raises(ValueError, match="group 2's"):
        apply_q2_group(R, n, b, b, 2, Zd)
    with pytest.raises(ValueError, match="q = 99"):
        apply_q2_group(R, n, b, b, 99, Zd)
    with pytest.raises(ValueError, match="<= 64"):
        apply_q2_group(cupy.zeros(group_shape(n, 65, 65, 0)), n, 65, 65, 0, Zd)


def test_groups_reject_a_band_above_64(cupy):
    n, b = 300, 64
    _, _, _, flat, Z, _ = _case(n, b, b)
    with pytest.raises(ValueError, match="<= 64"):
        apply_q2_groups(cupy.zeros(group_offsets(n, 65, 65)[-1]), n, 65, 65, cupy.asfortranarray(cupy.asarray(Z)))


def _random_flat(cupy, n, b, g):
    """Reflectors in the group_offsets layout without a band reduction (sb2st's cost at these n):
    v's unit first entry, entries up to row n - 1, tau = 2 / |v|^2, tau = 0 where sweep q g + t
    has no step k (its first row past n - 2).  Q2 is orthogonal, as sb2st's is."""
    off = group_offsets(n, b, g)
    flat = cupy.random.standard_normal(off[-1])
    i = cupy.arange(b)[None, :, None]
    t = cupy.arange(g)[None, None, :]
    for q in range(len(off) - 1):
        K = group_shape(n, b, g, q)[0]
        R = flat[off[q]:off[q + 1]].reshape(K, b + 1, g)
        s = q * g + 1 + cupy.arange(K)[:, None, None] * b + t     # the first row of v_t at step k
        v = R[:, :b, :]
        v *= s + i < n
        v[:, 0, :] = 1.0
        R[:, b, :] = cupy.where(s[:, 0, :] <= n - 2, 2.0 / (v * v).sum(axis=1), 0.0)
    return flat


def _seconds(cupy, fn):
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / 1e3


def test_speed(cupy, capsys):
    """Printed: both ways' time for ncols = n and n / 10 (the levels' GEMM rate beside), and the
    host's block loop on CuPy at n = 4096 (its launches per block are what both ways avoid)."""
    lines = []
    warm = cupy.asfortranarray(cupy.ones((300, 3)))
    for way in (apply_q2_levels, apply_q2_groups):     # compile and load first
        way(_random_flat(cupy, 300, 64, 64), 300, 64, 64, warm)
    for n in (4096, 8192, 16384):
        for b in (32, 64):
            flat = _random_flat(cupy, n, b, b)
            Z0 = cupy.asfortranarray(cupy.random.standard_normal((n, n)))
            for cols in (n, n // 10):
                Z = Z0[:, :cols].copy(order="F")
                tl = _seconds(cupy, lambda: apply_q2_levels(flat, n, b, b, Z))
                Z = Z0[:, :cols].copy(order="F")
                tg = _seconds(cupy, lambda: apply_q2_groups(flat, n, b, b, Z))
                rate = q2_flops(n, b, b, cols) / tl / 1e12
                lines.append(f"n={n} b=g={b} ncols={cols}: levels {tl:.3f} s ({rate:.1f} TFLOP/s), "
                             f"groups {tg:.3f} s: {tl / tg:.2f}x")
            if n == 4096:
                off = group_offsets(n, b, b)
                shapes = [group_shape(n, b, b, q) for q in range(len(off) - 1)]
                Zh = Z0.copy(order="F")
                th = _seconds(cupy, lambda: apply_q2(lambda q: flat[off[q]:off[q + 1]].reshape(shapes[q]),
                                                     n, b, b, Zh, cupy))
                lines.append(f"host block loop on CuPy n={n} b=g={b} ncols={n}: {th:.3f} s")
            del flat, Z0, Z
            cupy.get_default_memory_pool().free_all_blocks()
    with capsys.disabled():
        print("\n" + "\n".join(lines))
