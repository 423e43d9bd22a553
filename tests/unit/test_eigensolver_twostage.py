"""Serial tests of the two-stage tridiagonalization's pieces: sy2sb (Q1^T C Q1 banded, Q1
orthogonal), sb2st (band -> tridiagonal similarity, Q2 orthogonal), the band width choice, and
the CuPy run of the array-agnostic parts (marked gpu)."""
from __future__ import annotations

import functools

import numpy as np
import pytest

import hpccoll
from hpccoll_eigensolver import BlockCyclic
from hpccoll_eigensolver.linalg.ormtr import ormtr
from hpccoll_eigensolver.linalg.sb2st import apply_q2, sb2st
from hpccoll_eigensolver.linalg.sy2sb import gather_band, sy2sb, trailing_runs
from hpccoll_eigensolver.linalg.twostage import band_width


@pytest.fixture(scope="module")
def comm():
    c = hpccoll.Communicator(backend="host", deterministic=True)
    yield c
    c.Free()


def _symmetric(n, seed=0):
    a = np.random.default_rng(seed).standard_normal((n, n))
    return a + a.T


def _lower_band(A, b):
    n = A.shape[0]
    band = np.zeros((b + 1, n))
    for d in range(min(b, n - 1) + 1):
        band[d, :n - d] = np.diagonal(A, -d)
    return band


@pytest.mark.parametrize("n,nb,b", [(50, 8, 8), (37, 12, 4), (9, 16, 16), (3, 2, 2), (65, 32, 32)])
def test_sy2sb_bands_by_an_orthogonal_similarity(comm, n, nb, b):
    A = _symmetric(n)
    desc = BlockCyclic(n, n, nb, 1)
    C = np.asfortranarray(np.tril(A))
    band, tau = sy2sb(C, desc, comm, np, b)
    Bfull = np.zeros((n, n))
    full = gather_band(band, desc, comm, np)
    for d in range(min(b, n - 1) + 1):
        idx = np.arange(n - d)
        Bfull[idx + d, idx] = full[d, :n - d]
        Bfull[idx, idx + d] = full[d, :n - d]
    Q = np.eye(n)
    ormtr(C, tau, Q, desc, comm, np, offset=b)       # Q1 = Q1 I
    assert np.abs(Q.T @ Q - np.eye(n)).max() < 1e-13
    QtAQ = Q.T @ A @ Q
    assert np.abs(np.tril(QtAQ, -b - 1)).max(initial=0.0) < 1e-12 * np.abs(A).max()
    assert np.abs(QtAQ - Bfull).max() < 1e-12 * n * np.abs(A).max()


@pytest.mark.parametrize("n,b,g", [(57, 5, 3), (40, 8, 8), (33, 16, 5), (10, 3, 7), (4, 2, 2), (2, 1, 1)])
def test_sb2st_tridiagonalizes_by_an_orthogonal_similarity(n, b, g):
    A = np.tril(np.triu(_symmetric(n, 1), -b), b)
    d, e, refl = sb2st(_lower_band(A, b), g)
    T = np.diag(d) + np.diag(e, 1) + np.diag(e, -1)
    Q = apply_q2(lambda q: refl[q], n, b, g, np.eye(n), np)
    assert np.abs(Q.T @ Q - np.eye(n)).max() < 1e-13
    assert np.abs(Q @ T @ Q.T - A).max() < 1e-13 * n * np.abs(A).max()


def test_trailing_runs_cover_the_owned_columns_from_start():
    for n, nb, P, width in [(50, 8, 3, 5), (64, 16, 1, 20), (17, 4, 2, 100)]:
        desc = BlockCyclic(n, n, nb, P)
        for start in (0, 3, 8, 17, n - 1):
            for r in range(P):
                runs = list(trailing_runs(desc, r, start, width))
                got = np.concatenate([np.arange(g0, g1) for g0, g1, _, _ in runs] or [np.zeros(0, int)])
                cols = desc.local_cols(r)
                assert got.tolist() == cols[cols >= start].tolist()
                for g0, g1, l0, l1 in runs:
                    assert g1 - g0 == l1 - l0 <= width and cols[l0] == g0


def test_band_width_divides_nb():
    assert band_width(64) == 64 and band_width(256) == 64 and band_width(48) == 48 and band_width(96) == 48


@pytest.mark.gpu
def test_two_stage_on_cupy_matches_the_host():
    cp = pytest.importorskip("cupy")
    from hpccoll_eigensolver.linalg._xp import gpu_available

    if not gpu_available():
        pytest.skip("no GPU")
    from hpccoll_eigensolver.linalg.twostage import two_stage

    n, nb = 150, 32
    A = _symmetric(n, 2)
    desc = BlockCyclic(n, n, nb, 1)
    c = hpccoll.Communicator(backend="host", deterministic=True)
    try:
        C = cp.asfortranarray(cp.asarray(np.tril(A)))
        d, e, Q = two_stage(C, desc, c, cp)
        Z = cp.eye(n)
        Q.apply(Z)
        T = np.diag(cp.asnumpy(d)) + np.diag(cp.asnumpy(e), 1) + np.diag(cp.asnumpy(e), -1)
        Zh = cp.asnumpy(Z)
        assert np.abs(Zh @ T @ Zh.T - A).max() < 1e-12 * n * np.abs(A).max()
    finally:
        c.Free()


@pytest.mark.parametrize("kernel", [True, False], ids=["panel-kernel", "geqrf"])
@pytest.mark.parametrize("n,b", [(50, 8), (37, 4), (9, 8), (65, 32), (130, 64)])
def test_the_one_gpu_panel_loop_is_the_distributed_one(comm, monkeypatch, n, b, kernel):
    """sy2sb's one-GPU loop (the panel by sy2sb_device.PanelQR or, where it does not fit, by an
    in-place geqrf and block_reflector; symm, the update of C22's lower triangle, blocked on the
    first panels and syr2k on the rest, the strict upper zeroed at the end) run with NumPy
    stand-ins for PanelQR (LAPACK's geqrf, V and T: what tests/gpu/test_sy2sb_gpu.py checks the
    kernel against), geqrf, symm and syr2k gives the band and reflectors of the 1 x P loop at P = 1
    (UPDATE_COLUMNS small: several blocks)."""
    from scipy.linalg.lapack import dgeqrf

    from hpccoll_eigensolver.linalg import sy2sb as S
    from hpccoll_eigensolver.linalg import sy2sb_device

    class PanelQR:
        def __init__(self, n, b):
            self.fits = kernel

        def __call__(self, panel, tau, V, T):
            qr, t, _, info = dgeqrf(panel)
            assert info == 0 and kernel
            panel[...] = qr
            tau[:V.shape[1]] = 0.0
            tau[:t.size] = t
            V[...] = np.tril(qr, -1)
            V[np.arange(t.size), np.arange(t.size)] = 1.0
            T[...] = S.block_reflector(np, V, tau[:V.shape[1]])

    monkeypatch.setattr(sy2sb_device, "PanelQR", PanelQR)

    def geqrf_in_place(xp, a, tau, work=None):
        qr, t, _, info = dgeqrf(a)
        assert info == 0
        a[...] = qr
        tau[:t.size] = t

    def symm_lower(xp, C, V, out):
        out[...] = (np.tril(C) + np.tril(C, -1).T) @ V

    def syr2k_lower(xp, C, V, W):
        C -= np.tril(V @ W.T + W @ V.T)

    for name, fn in [("geqrf_in_place", geqrf_in_place), ("symm_lower", symm_lower), ("syr2k_lower", syr2k_lower),
                     ("geqrf_work", lambda shape: 1)]:
        monkeypatch.setattr(S, name, fn)
    monkeypatch.setattr(S, "UPDATE_COLUMNS", 24)
    monkeypatch.setattr(S, "UPDATE_BLOCKED_ROWS", n // 2)     # the first panels blocked, the rest syr2k
    A = _symmetric(n, n + b)
    desc = BlockCyclic(n, n, 64, 1)
    C1 = np.asfortranarray(np.tril(A))
    band1, tau1 = sy2sb(C1, desc, comm, np, b)
    C2 = np.asfortranarray(np.tril(A))
    tau2 = np.zeros(n)
    S._sy2sb_one_device(C2, n, b, np, tau2)
    band2 = S._band_and_reflectors_one_device(C2, n, b, np)
    scale = np.abs(A).max() * n
    assert np.abs(band1 - band2).max() < 1e-12 * scale
    assert np.abs(tau1 - tau2).max() < 1e-12 and np.array_equal(tau1 == 0, tau2 == 0)
    assert np.abs(C1 - C2).max() < 1e-11 and np.array_equal(C1 == 0, C2 == 0)


@pytest.mark.parametrize("m,k,width", [(1, 1, 4), (10, 3, 4), (37, 5, 8), (64, 8, 64), (65, 8, 64), (5, 2, 100)])
def test_update_lower_is_syr2k_on_the_lower_triangle(m, k, width):
    """update_lower's blocked GEMMs then zero_strict_upper: C22 - V W^T - W V^T's lower
    triangle, the strict upper zero; before the zeroing only the blocks' upper triangles changed."""
    from hpccoll_eigensolver.linalg._xp import zero_strict_upper
    from hpccoll_eigensolver.linalg.sy2sb import update_lower

    rng = np.random.default_rng()
    C = np.asfortranarray(np.tril(rng.standard_normal((m, m))))
    V, W = rng.standard_normal((m, k)), rng.standard_normal((m, k))
    want = np.tril(C - V @ W.T - W @ V.T)
    update_lower(np, C, V, W, width)
    block = np.arange(m)[:, None] // width == np.arange(m)[None, :] // width
    assert not np.triu(C, 1)[~block].any()
    zero_strict_upper(np, C)
    assert np.abs(C - want).max() < 1e-13 * max(1.0, np.abs(want).max()) * k
    assert not np.triu(C, 1).any()


def test_zero_strict_upper_rejects_a_non_square_matrix():
    from hpccoll_eigensolver.linalg._xp import zero_strict_upper

    with pytest.raises(ValueError, match="square"):
        zero_strict_upper(np, np.zeros((3, 4)))


@pytest.mark.parametrize("m", [1, 2, 63, 64, 65, 1000, 4097, 16320, 24448, 32704, 48000])
@pytest.mark.parametrize("b", [1, 17, 64])
def test_the_panel_kernels_grid_covers_the_rows_and_fits(m, b):
    """sy2sb_device.panel_grid on an H100's 132 SMs and 232448 bytes a block: G blocks of R rows
    cover the m rows with no empty block, within the SMs, in the shared memory."""
    from hpccoll_eigensolver.linalg.sy2sb_device import BLOCKS_MAX, MIN_ROWS, panel_grid, panel_smem

    sms, most = 132, 232448
    G, R = panel_grid(m, b, sms, most)
    assert 1 <= G <= sms and G * R >= m and (G - 1) * R < m
    assert panel_smem(R, b) <= most
    if panel_smem(-(-m // min(BLOCKS_MAX, -(-m // MIN_ROWS))), b) <= most:
        assert G == max(1, min(BLOCKS_MAX, -(-m // MIN_ROWS)))     # more blocks only where rows do not fit


def test_the_panel_kernels_sizes_are_the_kernel_files(tmp_path):
    """sy2sb_device's shared memory and work sizes are sy2sb_kernels.cu's own (its size functions
    built for the CPU: tests/unit/sy2sb_sizes.cpp)."""
    import ctypes

    from kernel_emulation import build_emulation

    from hpccoll_eigensolver.linalg.sy2sb_device import panel_smem, panel_work

    lib = build_emulation(tmp_path, "sy2sb_sizes.cpp")
    lib.sy2sb_sizes_smem.restype = lib.sy2sb_sizes_work.restype = ctypes.c_longlong
    for R in (1, 2, 3, 63, 64, 124, 255, 382, 455):
        for b in (1, 7, 32, 63, 64):
            assert panel_smem(R, b) == lib.sy2sb_sizes_smem(R, b), (R, b)
    for G in (1, 4, 64, 132):
        assert panel_work(G) == lib.sy2sb_sizes_work(G), G


def test_the_panel_kernel_refuses_what_it_cannot_hold():
    from hpccoll_eigensolver.linalg.sy2sb_device import B_MAX, panel_grid

    assert panel_grid(1000, B_MAX + 1, 132, 232448) is None
    assert panel_grid(0, 64, 132, 232448) is None
    assert panel_grid(60000, 64, 132, 232448) is None               # 132 blocks of 455 rows do not fit
    assert panel_grid(60000, 64, 64, 232448) is None


def test_the_gpu_band_is_the_largest_divisor_of_nb_up_to_64():
    from hpccoll_eigensolver.linalg.twostage import device_band

    assert device_band(64) == 64 and device_band(128) == 64 and device_band(48) == 48 and device_band(96) == 48
    assert device_band(100) == 50 and device_band(7) == 7


def test_auto_takes_two_stages_on_one_gpu_rank_from_8192_with_few_vectors_and_16384_with_more():
    from hpccoll_eigensolver.linalg.driver import AUTO_TWO_STAGE_ALL_MIN_N, AUTO_TWO_STAGE_MIN_N, reduction_for

    n, m = AUTO_TWO_STAGE_MIN_N, AUTO_TWO_STAGE_ALL_MIN_N
    mid, big, small = BlockCyclic(n, n, 64, 1), BlockCyclic(m, m, 64, 1), BlockCyclic(n - 1, n - 1, 64, 1)
    auto = functools.partial(reduction_for, "auto")
    assert auto(mid, True, 0) == "two-stage" and auto(mid, True, n // 2) == "two-stage"
    assert auto(mid, True, n // 2 + 1) == "one-stage" and auto(mid, True) == "one-stage"
    assert auto(big, True, m // 2 + 1) == "two-stage" and auto(big, True) == "two-stage"
    assert reduction_for("auto", small, True, 0) == "one-stage"
    assert reduction_for("auto", big, False, 0) == "one-stage"                              # the host
    assert reduction_for("auto", BlockCyclic(32768, 32768, 64, 2), True, 0) == "one-stage"  # ranks sharing GPUs
    assert reduction_for("one-stage", big, True, 0) == "one-stage"
    assert reduction_for("two-stage", small, False) == "two-stage"


@pytest.mark.parametrize("n,nb,block,offset", [(150, 16, 32, 8), (101, 16, 16, 1), (64, 64, 64, 64), (7, 4, 4, 4)])
def test_packed_reflectors_give_ormtrs_bits_in_about_half_the_memory(n, nb, block, offset):
    """ormtr on pack_reflectors' blocks: the same bits as on V's columns (tau = 0 reflectors
    included), in n^2 / 2 + n block / 2 numbers or fewer; every block a copy (V's memory free)."""
    from hpccoll_eigensolver.linalg.ormtr import ormtr, pack_reflectors

    rng = np.random.default_rng()
    desc = BlockCyclic(n, n, nb, 1)
    V = np.asfortranarray(np.tril(rng.standard_normal((n, n)), -offset))
    for c in range(n - offset):
        V[c + offset, c] = 1.0
    tau = rng.uniform(0.1, 2.0, n) * (rng.random(n) < 0.8)
    tau[max(n - offset, 0):] = 0.0
    Z = np.asfortranarray(rng.standard_normal((n, 9)))
    want = ormtr(V, tau, Z.copy(order="F"), desc, None, np, block=block, offset=offset)
    packed = pack_reflectors(V, tau, desc, np, block=block, offset=offset)
    assert packed.nbytes <= 8 * (n * n / 2 + n * block)
    assert not any(np.shares_memory(b, V) for b in packed.blocks.values())
    got = ormtr(packed, tau, Z.copy(order="F"), desc, None, np, block=999, offset=1)
    assert np.array_equal(got, want)
