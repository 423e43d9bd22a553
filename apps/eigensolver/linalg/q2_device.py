"""Z <- Q2 Z on the GPU, two ways; apply_q2_device picks (uses_groups).

Levels (apply_q2_levels): sb2st's reflectors applied by levels of disjoint compact-WY blocks, one
factor kernel (q2_kernels.cu) and two strided-batched cuBLAS GEMMs per level and column chunk;
every level streams its rows of Z through the GEMMs.  Any b and g.

Groups (apply_q2_groups): per group one factor kernel (each step's T) and one q2_group_apply
launch whose blocks each take 64 of Z's columns through all of the group's steps in the host's
order, the 128 rows a step touches held on chip and the products on the tensor cores (fp64
mma m16n8k8); a step brings in b new rows and writes b back.  b, g <= 64; its grid is
ncols / 64 blocks, so it pays where those fill the GPU.

The blocks.  sb2st.apply_q2 applies Q2 as blocks (q, k), q < Q = the number of groups, k < K_q:
group q's step k, rows r(q, k) = q g + 1 + k b .. + h - 1 (h = b + g - 1, clipped at n), one
I - V T V^T each, in the order q descending, then k ascending.  There are ~n^2 / (2 b g) blocks,
each a few launches from Python that cost more than its work, so here the blocks go by levels:

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
every run on the same GPU model.  apply_q2_twin runs the same schedule, workspaces and GEMM
parameters (level_gemms) in NumPy, checking each GEMM's reach; the CPU tests compare it with
sb2st.apply_q2."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .sb2st import _groups, group_offsets, group_shape, sweep_steps

WORKSPACE_BUDGET = 256 << 20   # bytes for W, the GEMMs' m x g x chunk intermediate
THREADS = 256                  # q2_level_factors' block size
SMEM_DEFAULT = 48 << 10        # dynamic shared memory a kernel gets without opting in
GROUP_COLUMNS = 64             # q2_group_apply's Z columns per block (Q2_COLS)
GROUP_THREADS = 512            # its block size (Q2_THREADS)
GROUP_MAX = 64                 # its largest b and g (Q2_PAD)
#: apply_q2_device's group path needs min(b, g) above this: on an H100 at n = 16384, ncols = n,
#: the group path (256 threads a block) took 0.71 s against the levels' 1.12 s at b = g = 64, and
#: 1.72 s against 1.76 s at b = g = 32, where its factors padded to 64 x 64 do twice the work; at
#: 512 threads a block it takes 0.58 s at b = g = 64 (docs/performance.md)
GROUP_MIN = 32


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
    """The GEMMs' flops of apply_q2_levels on ncols columns: 2 (2 h' g ncols) per block of height
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


@dataclass(frozen=True)
class Gemm:
    """One cublasDgemmStridedBatched, column-major: C_i = alpha op(A_i) op(B_i) + beta C_i for
    i < count, op(X) = X^T where ta / tb; operand X_i starts at element x[1] + i sx of buffer
    x[0] ("V", "Y", "W" or "Z": Z's memory from Z[0, 0]), leading dimension ldx."""
    ta: bool
    tb: bool
    m: int
    n: int
    k: int
    alpha: float
    a: tuple[str, int]
    lda: int
    sa: int
    b: tuple[str, int]
    ldb: int
    sb: int
    beta: float
    c: tuple[str, int]
    ldc: int
    sc: int
    count: int


def level_gemms(lv: Level, n: int, b: int, g: int, w: int, z0: int, ldz: int) -> list[Gemm]:
    """The GEMMs of one level on the w columns of Z from element z0 (a chunk): W = V^T Z and
    Z -= Y W over its full-height blocks (Z's batch stride b + g rows), then over its clipped
    block with height n - r.  V, Y: the level's factors, h x g column-major per block."""
    h = b + g - 1
    out = []
    for i0, cnt, hh in ((0, lv.full, h), (lv.full, lv.count - lv.full, n - lv.r0 - lv.full * (b + g))):
        if cnt:
            z = ("Z", z0 + lv.r0 + i0 * (b + g))
            v, y, W = ("V", i0 * h * g), ("Y", i0 * h * g), ("W", 0)
            out.append(Gemm(True, False, g, w, hh, 1.0, v, h, h * g, z, ldz, b + g, 0.0, W, g, g * w, cnt))
            out.append(Gemm(False, False, hh, w, g, -1.0, y, h, h * g, W, g, g * w, 1.0, z, ldz, b + g, cnt))
    return out


def apply_q2_twin(flat, n: int, b: int, g: int, Z, budget: int = WORKSPACE_BUDGET):
    """Z <- Q2 Z in place (NumPy, Z column-major): apply_q2_levels' schedule, chunks,
    workspaces and GEMM parameters (level_gemms), each GEMM's reach checked against its buffer."""
    from ._xp import _leading_dim

    levels = schedule(n, b, g)
    _check_operands(np, flat, n, b, g, Z, levels)
    ncols = Z.shape[1]
    if not levels or not ncols:
        return Z
    offsets = group_offsets(n, b, g)
    h = b + g - 1
    m = max(lv.count for lv in levels)
    cw = chunk_columns(levels, g, ncols, budget)
    ldz = _leading_dim(Z)
    bufs = {"V": np.empty(m * h * g), "Y": np.empty(m * h * g), "W": np.empty(m * g * cw),
            "Z": as_strided(Z, shape=(ldz * (ncols - 1) + n,), strides=(8,))}
    for lv in levels:
        V, Y = level_factors_twin(flat, offsets, lv, b, g)
        bufs["V"][:V.size] = V.transpose(0, 2, 1).ravel()      # block i's (r, c) at i h g + r + c h
        bufs["Y"][:Y.size] = Y.transpose(0, 2, 1).ravel()
        for c0 in range(0, ncols, cw):
            for gm in level_gemms(lv, n, b, g, min(cw, ncols - c0), c0 * ldz, ldz):
                _gemm_twin(gm, bufs, n, ldz)
    return Z


def _gemm_twin(gm: Gemm, bufs: dict, n: int, ldz: int) -> None:
    """Run one Gemm in NumPy on bufs; AssertionError where an operand reaches past its buffer
    (or, in Z, past row n - 1)."""
    def operand(x, rows, cols, ld, stride):
        name, off = x
        buf = bufs[name]
        assert rows <= ld and off + (gm.count - 1) * stride + (rows - 1) + (cols - 1) * ld < buf.size, (gm, name)
        if name == "Z":
            assert all((off + i * stride) % ldz + rows <= n for i in (0, gm.count - 1)), (gm, "rows past n")
        return as_strided(buf[off:], shape=(gm.count, rows, cols), strides=(8 * stride, 8, 8 * ld))

    A = operand(gm.a, *((gm.k, gm.m) if gm.ta else (gm.m, gm.k)), gm.lda, gm.sa)
    B = operand(gm.b, *((gm.n, gm.k) if gm.tb else (gm.k, gm.n)), gm.ldb, gm.sb)
    C = operand(gm.c, gm.m, gm.n, gm.ldc, gm.sc)
    prod = gm.alpha * ((A.transpose(0, 2, 1) if gm.ta else A) @ (B.transpose(0, 2, 1) if gm.tb else B))
    if gm.beta == 0.0:                  # C is not read (cuBLAS's rule: W starts uninitialized)
        C[...] = prod
    else:
        C[...] = prod + gm.beta * C


def apply_q2_device(flat, n: int, b: int, g: int, Z):
    """Z <- Q2 Z in place on the GPU: apply_q2_groups where uses_groups says so, else
    apply_q2_levels.  flat, Z as apply_q2_levels takes them; runs on the current stream;
    returns Z."""
    import cupy

    sms = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    if Z.ndim == 2 and uses_groups(b, g, Z.shape[1], sms):
        return apply_q2_groups(flat, n, b, g, Z)
    return apply_q2_levels(flat, n, b, g, Z)


def uses_groups(b: int, g: int, ncols: int, sms: int) -> bool:
    """Whether apply_q2_device takes the group path for ncols columns on a GPU of sms SMs: with
    b and g above GROUP_MIN (q2_group_apply pads its factors to 64 x 64) and at least half as many
    64-column blocks as SMs (each block of the grid runs every step of a group: a GPU with fewer
    blocks than SMs runs a group in the time of a full one)."""
    return GROUP_MIN < min(b, g) and max(b, g) <= GROUP_MAX and 2 * -(-ncols // GROUP_COLUMNS) >= sms


def apply_q2_levels(flat, n: int, b: int, g: int, Z, budget: int = WORKSPACE_BUDGET):
    """Z <- Q2 Z in place on the GPU by levels of batched GEMMs.  flat: CuPy float64, all groups'
    reflectors in the sb2st.group_offsets layout (group q's sb2st refl[q], C order, at
    flat[off[q]:off[q + 1]]); Z: CuPy float64 n x ncols, column-major (ncols may be 0).  `budget`: bytes for W (module
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
    base = {"V": V.data.ptr, "Y": Y.data.ptr, "W": W.data.ptr, "Z": Z.data.ptr}
    scalars = np.array([1.0, 0.0, -1.0], dtype=np.float64)     # host pointer mode: alpha, beta
    at = {1.0: scalars.ctypes.data, 0.0: scalars.ctypes.data + 8, -1.0: scalars.ctypes.data + 16}
    op = {False: cublas.CUBLAS_OP_N, True: cublas.CUBLAS_OP_T}
    b32, g32 = np.int32(b), np.int32(g)
    with _cublas_host_scalars() as handle:
        for lv in levels:
            kernel((lv.count,), (THREADS,), (flat, offsets, np.int32(lv.q0), np.int32(lv.k0), b32, g32, V, Y),
                   shared_mem=smem)
            for c0 in range(0, ncols, cw):
                for gm in level_gemms(lv, n, b, g, min(cw, ncols - c0), c0 * ldz, ldz):
                    cublas.dgemmStridedBatched(
                        handle, op[gm.ta], op[gm.tb], gm.m, gm.n, gm.k, at[gm.alpha],
                        base[gm.a[0]] + 8 * gm.a[1], gm.lda, gm.sa, base[gm.b[0]] + 8 * gm.b[1], gm.ldb, gm.sb,
                        at[gm.beta], base[gm.c[0]] + 8 * gm.c[1], gm.ldc, gm.sc, gm.count)
    return Z


_group_kernels: dict = {}   # CUDA device -> (q2_group_T, q2_group_apply, the latter's shared memory)


def group_kernels():
    """q2_group_T and q2_group_apply on the current device, and q2_group_apply's dynamic shared
    memory in bytes (sizeof(Q2Smem), asked of the kernel file once; the limit raised to it)."""
    import cupy

    from ._xp import raw_module

    dev = cupy.cuda.Device().id
    if dev not in _group_kernels:
        mod = raw_module("q2_kernels.cu")
        out = cupy.zeros(1, dtype=cupy.int64)
        mod.get_function("q2_apply_smem_bytes")((1,), (1,), (out,))
        smem = int(out.get()[0])
        apply = mod.get_function("q2_group_apply")
        _allow_shared(cupy, apply, smem, 64)
        _group_kernels[dev] = (mod.get_function("q2_group_T"), apply, smem)
    return _group_kernels[dev]


def apply_q2_groups(flat, n: int, b: int, g: int, Z):
    """Z <- Q2 Z in place on the GPU, group by group (q2_kernels.cu's q2_group_apply: each block
    of the grid takes 64 columns of Z through all of a group's steps with the rows on chip), the
    host's order (sb2st.apply_q2).  b, g <= 64.  flat, Z as apply_q2_levels takes them."""
    import cupy

    _check_operands(cupy, flat, n, b, g, Z, None)
    _check_group_width(b, g)
    off = group_offsets(n, b, g)
    if Z.shape[1]:
        for q in reversed(range(_groups(n, g))):
            _launch_group(flat[off[q]:off[q + 1]], n, b, g, q, Z)
    return Z


def apply_q2_group(R, n: int, b: int, g: int, q: int, Z):
    """Z <- (group q's block product) Z in place on the GPU: one group of sweeps alone, for a
    caller that holds one group's reflectors at a time (R: sb2st's refl[q], a C-order
    (K_q, b + 1, g) CuPy float64 array).  Applying q = Q - 1 down to 0 is apply_q2_groups, bit
    for bit.  b, g <= 64; Z as apply_q2_levels takes it."""
    import cupy

    shape = group_shape(n, b, g, q)
    if not 0 <= q < max(_groups(n, g), 1):
        raise ValueError(f"apply_q2_group: q = {q}: groups are 0 .. {_groups(n, g) - 1} (n = {n}, g = {g})")
    if R.shape != shape or R.dtype != np.float64 or not R.flags.c_contiguous:
        raise ValueError(f"apply_q2_group: `R` must be group {q}'s C-order float64 {shape} array "
                         f"(sb2st.group_shape(n, b, g, q)); got shape {R.shape}, {R.dtype}")
    _check_operands(cupy, None, n, b, g, Z, None)
    _check_group_width(b, g)
    if Z.shape[1]:
        _launch_group(R.reshape(-1), n, b, g, q, Z)
    return Z


_zeros: dict = {}   # CUDA device -> int64 zeros, grown as needed


def _zero_offsets(count: int):
    import cupy

    dev = cupy.cuda.Device().id
    if dev not in _zeros or _zeros[dev].size < count:
        _zeros[dev] = cupy.zeros(max(count, 512), dtype=cupy.int64)
    return _zeros[dev][:count]


def _check_group_width(b: int, g: int) -> None:
    if b > GROUP_MAX or g > GROUP_MAX:
        raise ValueError(f"apply_q2_groups: b = {b}, g = {g}: both must be <= {GROUP_MAX}")


def _launch_group(R, n: int, b: int, g: int, q: int, Z) -> None:
    """q2_group_T and q2_group_apply of group q on Z (ncols >= 1), R its reflectors (1-D)."""
    import cupy
    from ._xp import _leading_dim

    K = sweep_steps(n, b, q * g)
    if not K:
        return
    tk, ak, smem = group_kernels()
    at = _zero_offsets(q + 1)                      # the kernels read group q at offsets[q]: R's start
    T = cupy.empty(K * g * g, dtype=cupy.float64)
    _allow_shared(cupy, tk, (g * g + g) * 8, g)
    ncols = Z.shape[1]
    grid = (ncols + GROUP_COLUMNS - 1) // GROUP_COLUMNS
    q32, b32, g32 = np.int32(q), np.int32(b), np.int32(g)
    tk((K,), (THREADS,), (R, at, q32, b32, g32, T), shared_mem=(g * g + g) * 8)
    ak((grid,), (GROUP_THREADS,), (R, at, T, q32, np.int32(K), np.int32(n), b32, g32, Z,
                                   np.int64(_leading_dim(Z)), np.int32(ncols)), shared_mem=smem)


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
    """flat (None: not checked) and Z as apply_q2_device needs them, or ValueError saying what is
    wrong."""
    name = "apply_q2_device" if xp is not np else "apply_q2_twin"
    need = group_offsets(n, b, g)[-1]
    if flat is not None and (flat.ndim != 1 or flat.dtype != np.float64 or flat.size != need
                             or not flat.flags.c_contiguous):
        raise ValueError(f"{name}: `flat` must be a contiguous 1-D float64 array of {need} elements "
                         f"(sb2st.group_offsets(n, b, g)[-1]); got shape {flat.shape}, {flat.dtype}")
    if Z.ndim != 2 or Z.shape[0] != n or Z.dtype != np.float64:
        raise ValueError(f"{name}: `Z` must be a float64 {n} x ncols array; got shape {Z.shape}, {Z.dtype}")
    if Z.shape[1]:
        from ._xp import _unit_rows

        if not _unit_rows(Z):
            raise ValueError(f"{name}: `Z` must be column-major (a Fortran-order array or a block of one)")


__all__ = ["apply_q2_device", "apply_q2_levels", "apply_q2_groups", "apply_q2_group", "uses_groups", "apply_q2_twin", "q2_flops",
           "schedule", "chunk_columns", "level_gemms", "Level",
           "Gemm", "WORKSPACE_BUDGET"]
