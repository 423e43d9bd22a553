"""q2_device's schedule of Q2's compact-WY blocks, checked on the CPU: every pair of blocks by
brute force (a level's blocks are disjoint, every overlapping pair keeps sb2st.apply_q2's
order, only a level's last block is clipped), the NumPy twin of the GPU's schedule and batching
against sb2st.apply_q2, q2_kernels.cu's index math written out in Python against the twin's
factors, and the kernel source compiled with NVRTC."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpccoll_eigensolver.linalg import _xp
from hpccoll_eigensolver.linalg.q2_device import (apply_q2_twin, chunk_columns, group_block, level_factors_twin,
                                                  q2_flops, schedule)
from hpccoll_eigensolver.linalg.sb2st import _groups, apply_q2, group_offsets, sb2st, sweep_steps


def _blocks(n, b, g):
    """Every block (q, k) with its first row, in the host's order (q descending, k ascending)."""
    return [(q, k, q * g + 1 + k * b) for q in reversed(range(_groups(n, g)))
            for k in range(sweep_steps(n, b, q * g))]


SIZES = [(n, b, g) for n in (0, 1, 2, 3, 4, 5, 6, 7, 9, 13, 17, 30, 31, 64, 65, 97, 130)
         for b, g in ((1, 1), (2, 2), (3, 3), (8, 8), (16, 16), (2, 1), (3, 5), (8, 3), (5, 16), (16, 7))]


@pytest.mark.parametrize("n,b,g", SIZES)
def test_levels_are_disjoint_and_keep_every_overlapping_pair_in_order(n, b, g):
    h = b + g - 1
    blocks = _blocks(n, b, g)
    levels = schedule(n, b, g)
    level_of, seen = {}, []
    for lev, lv in enumerate(levels):
        assert lv.count >= 1, f"level {lev} is empty"
        for i in range(lv.count):
            q, k = lv.q0 + i, lv.k0 + i
            r = lv.r0 + i * (b + g)
            assert r == q * g + 1 + k * b
            assert (r + h <= n) == (i < lv.full), f"level {lev} block {i}: clipped is {r + h > n}, full {lv.full}"
            level_of[(q, k)] = lev
            seen.append((q, k))
        assert lv.count - lv.full <= 1
    assert sorted(seen) == sorted((q, k) for q, k, _ in blocks), "the levels do not hold every block once"
    for x, (q, k, r) in enumerate(blocks):            # rows unclipped: a stronger overlap test
        for q2, k2, r2 in blocks[x + 1:]:             # (q, k) goes before (q2, k2) on the host
            overlap = r < r2 + h and r2 < r + h
            if level_of[(q, k)] == level_of[(q2, k2)]:
                assert not overlap, f"({q},{k}) and ({q2},{k2}) share level {level_of[(q, k)]} and rows"
            if overlap:
                assert level_of[(q, k)] < level_of[(q2, k2)], f"({q},{k}) must go before ({q2},{k2})"


def test_levels_count_and_spacing_at_the_default_sizes():
    n, b = 1000, 64
    levels = schedule(n, b, b)
    Q, K0 = _groups(n, b), sweep_steps(n, b, 0)
    assert len(levels) == Q + K0 - 1
    assert sum(lv.count for lv in levels) == len(_blocks(n, b, b))
    assert max(lv.count for lv in levels) <= -(-n // (2 * b))


def _band(rng, n, b):
    """A random symmetric band, lower band storage ((b + 1) x n, zero past row n)."""
    band = rng.standard_normal((b + 1, n))
    for d in range(1, b + 1):
        band[d, n - d:] = 0.0
    return band


def _dense(band):
    b1, n = band.shape
    B = np.zeros((n, n))
    for d in range(min(b1, n)):
        B[np.arange(d, n), np.arange(n - d)] = band[d, :n - d]
    return np.tril(B) + np.tril(B, -1).T


def _reflectors(rng, n, b, g):
    d, e, refl = sb2st(_band(rng, n, b), g)
    flat = np.concatenate([r.ravel() for r in refl]) if refl else np.zeros(0)
    assert flat.size == group_offsets(n, b, g)[-1]
    return d, e, refl, flat


def _rel(got, want):
    return np.abs(got - want).max() / max(np.abs(want).max(), 1.0) if want.size else 0.0


CASES = [(n, b) for n in (3, 4, 5, 6, 11, 16, 33, 50, 67) for b in (2, 3, 8, 16)]


@pytest.mark.parametrize("n,b", CASES)
@pytest.mark.parametrize("width", [0, 1, 7, 50])
def test_twin_matches_the_host_apply(n, b, width):
    rng = np.random.default_rng()
    _, _, refl, flat = _reflectors(rng, n, b, b)
    Z = np.asfortranarray(rng.standard_normal((n, width)))
    want = apply_q2(lambda q: refl[q], n, b, b, Z.copy(), np)
    got = apply_q2_twin(flat, n, b, b, Z)
    assert _rel(got, want) < 1e-13


@pytest.mark.parametrize("n,b,g", [(40, 8, 3), (41, 3, 8), (37, 5, 5), (29, 2, 7), (50, 16, 1)])
def test_twin_matches_the_host_apply_for_g_other_than_b(n, b, g):
    rng = np.random.default_rng()
    _, _, refl, flat = _reflectors(rng, n, b, g)
    Z = np.asfortranarray(rng.standard_normal((n, 9)))
    want = apply_q2(lambda q: refl[q], n, b, g, Z.copy(), np)
    assert _rel(apply_q2_twin(flat, n, b, g, Z), want) < 1e-13


def test_twin_in_column_chunks_on_a_block_of_a_larger_array():
    """Several chunks, Z a column block of a taller Fortran array (leading dimension > n): the
    rows below n and the other columns stay as they were."""
    rng = np.random.default_rng()
    n, b, width = 61, 8, 23
    _, _, refl, flat = _reflectors(rng, n, b, b)
    big = np.asfortranarray(rng.standard_normal((n + 4, width + 5)))
    before = big.copy()
    want = apply_q2(lambda q: refl[q], n, b, b, big[:n, 2:2 + width].copy(), np)
    budget = 8 * b * 4 * max(lv.count for lv in schedule(n, b, b))   # 4 columns a chunk
    assert chunk_columns(schedule(n, b, b), b, width, budget) == 4
    apply_q2_twin(flat, n, b, b, big[:n, 2:2 + width], budget=budget)
    assert _rel(big[:n, 2:2 + width], want) < 1e-13
    assert np.array_equal(big[n:], before[n:])
    assert np.array_equal(big[:, :2], before[:, :2]) and np.array_equal(big[:, 2 + width:], before[:, 2 + width:])


def test_twin_rejects_a_c_order_z():
    rng = np.random.default_rng()
    _, _, _, flat = _reflectors(rng, 20, 4, 4)
    with pytest.raises(ValueError, match="column-major"):
        apply_q2_twin(flat, 20, 4, 4, np.zeros((20, 3)))


@pytest.mark.parametrize("n,b", [(57, 8), (100, 16), (9, 16)])
def test_twin_on_the_identity_rebuilds_the_band(n, b):
    rng = np.random.default_rng()
    band = _band(rng, n, b)
    d, e, refl = sb2st(band, b)
    flat = np.concatenate([r.ravel() for r in refl]) if refl else np.zeros(0)
    Q2 = apply_q2_twin(flat, n, b, b, np.asfortranarray(np.eye(n)))
    T = np.diag(d) + np.diag(e, 1) + np.diag(e, -1)
    assert _rel(Q2 @ T @ Q2.T, _dense(band)) < 1e-13
    assert _rel(Q2.T @ Q2, np.eye(n)) < 1e-13


@pytest.mark.parametrize("n,b,g,ncols", [(100, 8, 8, 13), (67, 16, 16, 1), (40, 3, 7, 5), (5, 8, 8, 2)])
def test_flops_count_every_block_at_its_height(n, b, g, ncols):
    h = b + g - 1
    want = sum(4 * min(h, n - r) * g * ncols for _, _, r in _blocks(n, b, g))
    assert q2_flops(n, b, g, ncols) == want


def _factors_by_hand(flat, offsets, q0, k0, count, b, g):
    """q2_kernels.cu's q2_level_factors transliterated (every thread's loop run in turn; the
    barriers order whole loops): V and Y as the flat column-major buffers it writes."""
    h = b + g - 1
    V = np.full(count * h * g, np.nan)
    Y = np.full(count * h * g, np.nan)
    for blk in range(count):
        q, k = q0 + blk, k0 + blk
        base = offsets[q] + k * (b + 1) * g
        R = flat[base:]
        S = np.full(g * g + g, np.nan)
        tau = S[g * g:]
        for t in range(g):
            tau[t] = R[b * g + t]
        for e in range(h * g):
            r, a = e % h, e // h
            d = r - a
            V[blk * h * g + e] = R[d * g + a] if (0 <= d < b and tau[a] != 0.0) else 0.0
        for e in range(g * g):
            c, a = e % g, e // g
            if a < c:
                lag = c - a
                s = 0.0
                if tau[a] != 0.0 and tau[c] != 0.0:
                    for r in range(b - lag):
                        s += R[(r + lag) * g + a] * R[r * g + c]
                S[e] = s
        for c in range(g):
            for a in range(c):
                s = 0.0
                for l in range(a, c):
                    s += S[a + l * g] * S[c + l * g]
                S[a + c * g] = -tau[c] * s
            S[c + c * g] = tau[c]
        for e in range(h * g):
            r, c = e % h, e // h
            lo, hi = max(r - b + 1, 0), min(r, c)
            s = 0.0
            for a in range(lo, hi + 1):
                if tau[a] != 0.0:
                    s += R[(r - a) * g + a] * S[a + c * g]
            Y[blk * h * g + e] = s
    return V, Y


@pytest.mark.parametrize("n,b,g", [(30, 4, 4), (23, 3, 5), (26, 6, 2)])
def test_kernel_index_math_matches_the_twin(n, b, g):
    rng = np.random.default_rng()
    _, _, _, flat = _reflectors(rng, n, b, g)
    offsets = group_offsets(n, b, g)
    h = b + g - 1
    for lv in schedule(n, b, g):
        V, Y = _factors_by_hand(flat, offsets, lv.q0, lv.k0, lv.count, b, g)
        Vt, Yt = level_factors_twin(flat, offsets, lv, b, g)
        # column-major h x g per block: element (r, c) of block i at i h g + r + c h
        np.testing.assert_allclose(V.reshape(lv.count, g, h).transpose(0, 2, 1), Vt, rtol=0, atol=0)
        np.testing.assert_allclose(Y.reshape(lv.count, g, h).transpose(0, 2, 1), Yt, rtol=1e-13, atol=1e-13)


def test_twin_factor_is_the_product_of_the_reflectors():
    """I - V T V^T (T recovered from Y = V T on V's unit-diagonal rows) is H_0 ... H_{g-1}."""
    rng = np.random.default_rng()
    n, b, g = 40, 6, 6
    _, _, _, flat = _reflectors(rng, n, b, g)
    offsets = group_offsets(n, b, g)
    lv = schedule(n, b, g)[3]
    V, Y = level_factors_twin(flat, offsets, lv, b, g)
    for i in range(lv.count):
        R = group_block(flat, offsets, lv.q0 + i, lv.k0 + i, b, g)
        P = np.eye(b + g - 1)
        for t in range(g):
            v = np.zeros(b + g - 1)
            v[t:t + b] = R[:b, t]
            P = P @ (np.eye(b + g - 1) - R[b, t] * np.outer(v, v))
        assert _rel(np.eye(b + g - 1) - Y[i] @ V[i].T, P) < 1e-14


def test_schedule_rejects_bad_sizes():
    with pytest.raises(ValueError, match="b, g >= 1"):
        schedule(10, 0, 4)


def test_twin_rejects_a_flat_of_the_wrong_length():
    with pytest.raises(ValueError, match="group_offsets"):
        apply_q2_twin(np.zeros(5), 20, 4, 4, np.zeros((20, 2)))


def test_q2_kernels_compile():
    """q2_kernels.cu compiles with NVRTC for sm_90 with raw_module's options."""
    import hpccoll.ext
    from hpccoll import HpccollError

    try:
        cubin = hpccoll.ext.compile_cubin(Path(_xp.HERE) / "q2_kernels.cu", _xp.module_options())
    except HpccollError as exc:
        if "NVRTC not found" in str(exc):
            pytest.skip(str(exc))
        raise
    assert cubin[:4] == b"\x7fELF"


def test_the_group_path_needs_b_and_g_in_33_to_64_and_columns_for_half_the_sms():
    from hpccoll_eigensolver.linalg.q2_device import uses_groups

    assert uses_groups(64, 64, 16384, 132) and uses_groups(33, 40, 64 * 66, 132)
    assert not uses_groups(64, 64, 64 * 65, 132)                    # 65 blocks for 132 SMs
    assert uses_groups(64, 64, 64 * 65 + 1, 132)                    # 66 blocks: a partial one counts
    assert not uses_groups(32, 64, 16384, 132) and not uses_groups(64, 32, 16384, 132)
    assert not uses_groups(65, 64, 16384, 132) and not uses_groups(64, 65, 16384, 132)
    assert not uses_groups(64, 64, 0, 132)


def test_launch_constants_are_the_kernel_files():
    """q2_device launches q2_group_apply with the block size, columns per block and largest b, g
    that q2_kernels.cu is written for (Q2_THREADS: its __launch_bounds__ and tile assignment)."""
    import re

    from hpccoll_eigensolver.linalg import q2_device

    src = (Path(_xp.HERE) / "q2_kernels.cu").read_text()
    defined = {m.group(1): int(m.group(2)) for m in re.finditer(r"^#define (Q2_\w+) (\d+)\b", src, re.M)}
    assert defined["Q2_THREADS"] == q2_device.GROUP_THREADS
    assert defined["Q2_COLS"] == q2_device.GROUP_COLUMNS
    assert defined["Q2_PAD"] == q2_device.GROUP_MAX
