"""Z <- Q2 Z on the GPU: sb2st's reflectors applied by levels of disjoint compact-WY blocks, one
factor kernel (q2_kernels.cu) and two strided-batched cuBLAS GEMMs per level and column chunk.

The blocks.  sb2st.apply_q2 applies Q2 as blocks (q, k), q < Q = the number of groups, k < K_q:
group q's step k, rows r(q, k) = q g + 1 + k b .. + h - 1 (h = b + g - 1, clipped at n), one
I - V T V^T each, in the order q descending, then k ascending.  Launching work per block from
Python costs ~10-20 us and there are ~n^2 / (2 b g) blocks, so here the blocks go by levels:

    level(q, k) = (Q - 1 - q) + k,   levels 0 .. Q + K_0 - 2,   applied in ascending order.

Why that is Q2 Z, for any b and g.  Two blocks with disjoint rows commute, so any order that
keeps every overlapping pair in the host's order gives the same product (move the block that
goes first in the new order to the front: each block it passes is one it commutes with).
  - Same level: q' = q + d (d >= 1) means k' = k + d, so r' - r = d (g + b) >= b + g > h - 1:
    disjoint.  A level's blocks are q = max(0, Q - 1 - level) onwards while k < K_q (K_q never
    grows with q, k grows by one), row starts b + g apart.
  - (q, k) before (q', k') in the host's order and overlapping: if q = q' then k < k' and the
    level grows by k' - k.  If q > q' (d = q - q') and level(q', k') <= level(q, k), then
    k - k' >= d and r - r' = d g + (k - k') b >= g + b > h - 1: no overlap.  So the level grows.
  - Only a level's last block can reach past row n - 1: a block has r <= n - 2 (its step's
    reflector has length >= 2), the one before it ends b + g - h + 1 = 2 rows above that r.
tests/unit/test_q2_schedule.py checks all three by brute force over every pair of blocks.

Per level: q2_level_factors builds each block's dense V (h x g, skewed, tau = 0 columns zero)
and Y = V T (T by dlarft's recurrence, the UT transform sy2sb.block_reflector inverts for) into
a workspace; then per column chunk Zc of Z
    W_i = V_i^T Zc[r_i : r_i + h]        (cublasDgemmStridedBatched, Z's batch stride b + g rows)
    Zc[r_i : r_i + h] -= Y_i W_i         (the same; the level's blocks write disjoint rows)
over the level's full-height blocks, and the same two with height n - r for its clipped last
block (V's and Y's rows past n are zero, so nothing past row n - 1 is read or written).  T is
folded into Y once per block (O(h g^2), independent of Z's width) instead of a third GEMM T W
per chunk: fewer flops, one launch and one W-sized buffer fewer.

Workspace: V and Y, 2 m h g doubles (m = a level's largest block count, about n / (b + g)), and
W, m g c doubles for a chunk of c columns: c is the largest width with W within `budget` bytes
(WORKSPACE_BUDGET, 256 MiB: at n = 16384, b = g = 64, m = 128 blocks, c = 4096 columns).

Every kernel sum and every GEMM runs in a fixed order on the current stream: the same bits on
every run on the same GPU model.  apply_q2_twin is the NumPy twin of exactly this schedule and
batching (the CPU tests compare it with sb2st.apply_q2)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .sb2st import _groups, group_offsets, sweep_steps

WORKSPACE_BUDGET = 256 << 20   # bytes for W, the GEMMs' m x g x chunk intermediate
THREADS = 256                  # q2_level_factors' block size
SMEM_DEFAULT = 48 << 10        # dynamic shared memory a kernel gets without opting in


@dataclass(frozen=True)
class Level:
    """One level of the schedule: blocks (q0 + i, k0 + i) for i < count, block i's rows from
    r0 + i (b + g); the first `full` have height h, the rest (0 or 1) end at row n - 1."""
    q0: int
    k0: int
    count: int
    r0: int
    full: int


def schedule(n: int, b: int, g: int) -> list[Level]:
    """The levels of Q2's blocks (module doc), in the order they are applied."""
    _check_sizes(n, b, g)
    Q = _groups(n, g)
    if not Q:
        return []
    K = [sweep_steps(n, b, q * g) for q in range(Q)]
    h = b + g - 1
    out = []
    for lev in range(Q + K[0] - 1):
        q0 = max(0, Q - 1 - lev)
        k0 = lev - (Q - 1 - q0)
        count = 0
        while q0 + count < Q and k0 + count < K[q0 + count]:
            count += 1
        r0 = q0 * g + 1 + k0 * b
        full = sum(1 for i in range(count) if r0 + i * (b + g) + h <= n)
        out.append(Level(q0, k0, count, r0, full))
    return out


def chunk_columns(levels: list[Level], g: int, ncols: int, budget: int = WORKSPACE_BUDGET) -> int:
    """Columns of Z per chunk: the most (up to ncols) with W's m g c doubles within budget."""
    m = max((lv.count for lv in levels), default=1)
    return max(1, min(ncols, budget // (8 * m * g)))


def q2_flops(n: int, b: int, g: int, ncols: int) -> int:
    """The GEMMs' flops of apply_q2_device on ncols columns: 2 (2 h' g ncols) per block of height
    h' (h, or n - r for a level's clipped block), V's and Y's zero triangles included (about
    2 n^2 ncols (b + g - 1) / b in all).  The factor kernel's O(n^2 g) are left out."""
    total = 0
    for lv in schedule(n, b, g):
        heights = lv.full * (b + g - 1) + sum(n - (lv.r0 + i * (b + g)) for i in range(lv.full, lv.count))
        total += 4 * heights * g * ncols
    return total


def group_block(flat, offsets, q: int, k: int, b: int, g: int):
    """Group q's step k, (b + 1) x g: rows < b the vectors (skewed by column), row b the taus."""
    at = offsets[q] + k * (b + 1) * g
    return flat[at:at + (b + 1) * g].reshape(b + 1, g)


def level_factors_twin(flat, offsets, lv: Level, b: int, g: int):
    """(V, Y), each count x h x g, of a level's blocks: q2_level_factors' algorithm in NumPy."""
    h = b + g - 1
    R = np.stack([group_block(flat, offsets, lv.q0 + i, lv.k0 + i, b, g) for i in range(lv.count)])
    tau = R[:, b, :]
    V = np.zeros((lv.count, h, g))
    for t in range(g):
        V[:, t:t + b, t] = R[:, :b, t] * (tau[:, t] != 0)[:, None]
    G = np.triu(V.transpose(0, 2, 1) @ V, 1)
    T = np.zeros((lv.count, g, g))
    for c in range(g):
        T[:, :c, c] = -tau[:, c, None] * np.einsum("ial,il->ia", T[:, :c, :c], G[:, :c, c])
        T[:, c, c] = tau[:, c]
    return V, V @ T


def apply_q2_twin(flat, n: int, b: int, g: int, Z, budget: int = WORKSPACE_BUDGET):
    """Z <- Q2 Z in place (NumPy): apply_q2_device's schedule, chunks and batched products."""
    levels = schedule(n, b, g)
    _check_operands(np, flat, n, b, g, Z, levels)
    ncols = Z.shape[1]
    if not levels or not ncols:
        return Z
    offsets = group_offsets(n, b, g)
    h = b + g - 1
    cw = chunk_columns(levels, g, ncols, budget)
    s0, s1 = Z.strides
    for lv in levels:
        V, Y = level_factors_twin(flat, offsets, lv, b, g)
        for c0 in range(0, ncols, cw):
            Zc = Z[:, c0:c0 + cw]
            if lv.full:   # the batch: block i's rows r0 + i (b + g) .. + h - 1, disjoint
                Zb = as_strided(Zc[lv.r0:], shape=(lv.full, h, Zc.shape[1]), strides=((b + g) * s0, s0, s1))
                W = V[:lv.full].transpose(0, 2, 1) @ Zb
                Zb -= Y[:lv.full] @ W
            if lv.count > lv.full:
                r = lv.r0 + lv.full * (b + g)
                hc = n - r
                W = V[lv.full, :hc].T @ Zc[r:]
                Zc[r:] -= Y[lv.full, :hc] @ W
    return Z


def apply_q2_device(flat, n: int, b: int, g: int, Z, budget: int = WORKSPACE_BUDGET):
    """Z <- Q2 Z in place on the GPU.  flat: CuPy float64, all groups' reflectors in the
    sb2st.group_offsets layout (group q's sb2st refl[q], C order, at flat[off[q]:off[q + 1]]);
    Z: CuPy float64 n x ncols, column-major (ncols may be 0).  `budget`: bytes for W (module
    doc).  Runs on the current stream; returns Z."""
    import cupy

    from ._xp import _cublas_host_scalars, _leading_dim, raw_module

    levels = schedule(n, b, g)
    _check_operands(cupy, flat, n, b, g, Z, levels)
    ncols = Z.shape[1]
    if not levels or not ncols:
        return Z
    from cupy_backends.cuda.libs import cublas

    h = b + g - 1
    m = max(lv.count for lv in levels)
    cw = chunk_columns(levels, g, ncols, budget)
    offsets = cupy.asarray(np.array(group_offsets(n, b, g), dtype=np.int64))
    V = cupy.empty(m * h * g, dtype=cupy.float64)
    Y = cupy.empty(m * h * g, dtype=cupy.float64)
    W = cupy.empty(m * g * cw, dtype=cupy.float64)
    kernel = raw_module("q2_kernels.cu").get_function("q2_level_factors")
    smem = (g * g + g) * 8
    _allow_shared(cupy, kernel, smem, g)
    ldz = _leading_dim(Z)
    zp, vp, yp, wp = Z.data.ptr, V.data.ptr, Y.data.ptr, W.data.ptr
    one_zero_minus = np.array([1.0, 0.0, -1.0], dtype=np.float64)   # host scalars: alpha, beta
    one, zero, minus = (one_zero_minus.ctypes.data + 8 * i for i in range(3))
    T, N = cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N
    b32, g32 = np.int32(b), np.int32(g)
    with _cublas_host_scalars() as handle:
        for lv in levels:
            kernel((lv.count,), (THREADS,), (flat, offsets, np.int32(lv.q0), np.int32(lv.k0), b32, g32, V, Y),
                   shared_mem=smem)
            for c0 in range(0, ncols, cw):
                w = min(cw, ncols - c0)
                zc = zp + 8 * c0 * ldz
                # (first block, count, height): the full-height batch, then the clipped block
                for i0, cnt, hh in ((0, lv.full, h), (lv.full, lv.count - lv.full, n - lv.r0 - lv.full * (b + g))):
                    if not cnt:
                        continue
                    z = zc + 8 * (lv.r0 + i0 * (b + g))
                    v, y = vp + 8 * i0 * h * g, yp + 8 * i0 * h * g
                    cublas.dgemmStridedBatched(handle, T, N, g, w, hh, one, v, h, h * g, z, ldz, b + g,
                                               zero, wp, g, g * w, cnt)
                    cublas.dgemmStridedBatched(handle, N, N, hh, w, g, minus, y, h, h * g, wp, g, g * w,
                                               one, z, ldz, b + g, cnt)
    return Z


def _allow_shared(cupy, kernel, smem: int, g: int) -> None:
    """Let the kernel use smem bytes of dynamic shared memory (opting in above 48 KiB)."""
    if smem <= SMEM_DEFAULT:
        return
    most = cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]
    if smem > most:
        raise ValueError(f"apply_q2_device: g = {g} needs {smem} bytes of shared memory per block, this GPU "
                         f"allows {most}: use a smaller g (sb2st's group size)")
    kernel.max_dynamic_shared_size_bytes = smem


def _check_sizes(n: int, b: int, g: int) -> None:
    if b < 1 or g < 1 or n < 0:
        raise ValueError(f"Q2: n = {n}, b = {b}, g = {g}: need n >= 0 and b, g >= 1")


def _check_operands(xp, flat, n: int, b: int, g: int, Z, levels) -> None:
    """flat and Z as apply_q2_device needs them, or ValueError saying what is wrong."""
    name = "apply_q2_device" if xp is not np else "apply_q2_twin"
    need = group_offsets(n, b, g)[-1]
    if flat.ndim != 1 or flat.dtype != np.float64 or flat.size != need or not flat.flags.c_contiguous:
        raise ValueError(f"{name}: `flat` must be a contiguous 1-D float64 array of {need} elements "
                         f"(sb2st.group_offsets(n, b, g)[-1]); got shape {flat.shape}, {flat.dtype}")
    if Z.ndim != 2 or Z.shape[0] != n or Z.dtype != np.float64:
        raise ValueError(f"{name}: `Z` must be a float64 {n} x ncols array; got shape {Z.shape}, {Z.dtype}")
    if xp is not np and Z.shape[1]:
        from ._xp import _unit_rows

        if not _unit_rows(Z):
            raise ValueError(f"{name}: `Z` must be column-major (a Fortran-order array or a block of one)")


__all__ = ["apply_q2_device", "apply_q2_twin", "q2_flops", "schedule", "chunk_columns", "Level",
           "WORKSPACE_BUDGET"]
