"""Stage two of the two-stage tridiagonalization on the GPU: sb2st.py's bulge chasing as one
persistent kernel (sb2st_kernels.cu), its steps the host's arithmetic, its sweeps a wavefront.

Block i of the grid runs sweeps i, i + grid, ... in order; before step k of sweep j it waits
until sweep j - 1 has finished steps 0 .. k + sb2st.LAG (sb2st.steps_needed: the CPU tests show
that this orders every pair of steps that touch a common entry).  A step waits only for a lower
sweep and a block takes its sweeps in ascending order, so the lowest unfinished sweep never
waits, provided that every block of the grid is on the GPU at once: the grid is at most
resident_blocks().  About n / (2 b) sweeps can run at once (sweep j + 1 runs 2 steps behind
sweep j), so a grid larger than that only waits.

Every sum runs in a fixed order: two runs give the same bits."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ._xp import raw_module
from .sb2st import group_offsets, group_shape, n_sweeps, sweep_steps

KERNELS = "sb2st_kernels.cu"
_SRC = (Path(__file__).resolve().parent / KERNELS).read_text()
TPB = int(re.search(r"#define SB_TPB (\d+)", _SRC).group(1))       # threads per block
B_MAX = int(re.search(r"#define SB_BMAX (\d+)", _SRC).group(1))    # the largest half-bandwidth
#: per SM at most this many of the kernel's blocks, however many fit: the rest of each SM is left
#: to other work on the GPU (another rank's kernels under MPS), which could otherwise keep a
#: block of the grid off the GPU while the blocks that wait for it spin
BLOCKS_PER_SM = 2
#: a wait for the previous sweep longer than this is an error (normal waits: microseconds to
#: milliseconds, the time of a few steps of every sweep the grid runs)
TIMEOUT_S = 60.0


def resident_blocks(func, smem: int = 0) -> int:
    """Blocks of sb2st_chase (smem bytes of dynamic shared memory each) the current GPU holds at
    once, with BLOCKS_PER_SM at most per SM: its SMs times min(BLOCKS_PER_SM, the occupancy
    calculator's blocks per SM), or one per SM where the driver cannot say (a block that
    launches fits on an SM)."""
    import cupy as cp

    sms = int(cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["multiProcessorCount"])
    try:
        per = int(cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(func.ptr, TPB, smem))
    except Exception:  # noqa: BLE001 - a CuPy without the call
        per = 1
    return sms * max(1, min(BLOCKS_PER_SM, per))


_chase: dict = {}   # CUDA device -> (sb2st_chase, its dynamic shared memory in bytes)


def chase_kernel():
    """sb2st_chase on the current device and the dynamic shared memory each block takes
    (sizeof(Smem), asked of the kernel file once; the function's limit raised to it)."""
    import cupy as cp

    dev = cp.cuda.Device().id
    if dev not in _chase:
        mod = raw_module(KERNELS)
        out = cp.zeros(1, dtype=cp.int64)
        mod.get_function("sb2st_smem_bytes")((1,), (1,), (out,))
        smem = int(out.get()[0])
        func = mod.get_function("sb2st_chase")
        func.max_dynamic_shared_size_bytes = smem
        _chase[dev] = (func, smem)
    return _chase[dev]


def working_band(band, xp):
    """The kernel's working matrix for the (b + 1) x n lower band storage `band` (an array of xp):
    n (4b + 1) doubles, A[r, c] at c (4b + 1) + r - c + 2b for |r - c| <= 2b, both triangles,
    zero beyond b (the first n (4b + 1) of sb2st._SymmetricBand(band, 2b).buf)."""
    b, n = band.shape[0] - 1, band.shape[1]
    w = 2 * b
    ld = 2 * w + 1
    A = xp.zeros(n * ld)
    full = A.reshape(n, ld)                            # row c: column c, rows c - w .. c + w
    for d in range(min(b + 1, n)):
        full[:n - d, w + d] = band[d, :n - d]          # A[c + d, c]
        full[d:, w - d] = band[d, :n - d]              # A[c - d, c] = A[c, c - d]
    return A


def sb2st_device(band, g: int | None = None, *, timeout_s: float = TIMEOUT_S, grid: int | None = None,
                 reflectors: bool = True, separate: bool = False):
    """Tridiagonalize the symmetric band in lower band storage (band[d, c] = B[c + d, c], a
    (b + 1) x n CuPy array) on the GPU: B = Q2 T Q2^T.  Returns (d, e, flat), CuPy arrays: T's
    diagonal (n) and subdiagonal (n - 1), and every group's reflectors in one array laid out by
    sb2st.group_offsets(n, b, g) (group q's (K_q, b + 1, g) array, C order, at
    flat[off[q]:off[q + 1]], what host sb2st returns as refl[q]).  g: sweeps per group (default
    b, 1 for b = 0).  n < 3 or b < 2: already tridiagonal.  grid: blocks to launch (default and at most
    resident_blocks()).  reflectors=False: the reflectors are not kept (eigenvalues only: flat is
    None, n^2 / 2 doubles fewer allocated).  separate=True: the reflectors as a list of groups
    instead, group q's (K_q, b + 1, g) array its own allocation (what host sb2st returns), so
    that the n^2 / 2 numbers need no single free block of that size and each group can be freed
    on its own.  Raises RuntimeError where a wait timed out (after timeout_s)."""
    import cupy as cp

    b, n = band.shape[0] - 1, band.shape[1]
    g = max(b, 1) if g is None else g
    if b > B_MAX:
        raise ValueError(f"sb2st_device: half-bandwidth b={b} is above {B_MAX} (the kernel's blocks are at most "
                         f"{B_MAX} x {B_MAX}); use b <= {B_MAX} or the host sb2st")
    if g < 1:
        raise ValueError(f"sb2st_device: g={g} sweeps per group; use g >= 1")
    band = cp.ascontiguousarray(cp.asarray(band, dtype=cp.float64))
    if n < 3 or b < 2:                                 # already tridiagonal
        d = band[0].copy()
        e = band[1, :max(n - 1, 0)].copy() if b >= 1 else cp.zeros(max(n - 1, 0))
        shapes = [(sweep_steps(n, max(b, 1), q * g), b + 1, g) for q in range(-(-n_sweeps(n) // g))]
        if not reflectors:
            return d, e, None
        if separate:
            return d, e, [cp.zeros(shape) for shape in shapes]
        return d, e, cp.zeros(sum(int(np.prod(shape)) for shape in shapes))
    A = working_band(band, cp)
    w = 2 * b
    full = A.reshape(n, 2 * w + 1)                     # row c: column c, rows c - w .. c + w
    off = group_offsets(n, b, g)
    groups = None
    if reflectors and separate:
        groups = [cp.zeros(group_shape(n, b, g, q)) for q in range(len(off) - 1)]
        base, starts = group_starts([a.data.ptr if a.size else None for a in groups])
    elif reflectors:
        flat = cp.zeros(off[-1])
        base, starts = flat.data.ptr, off[:-1]
    goff = cp.asarray(np.array(starts if reflectors else off[:-1], dtype=np.int64))
    progress = cp.zeros(n_sweeps(n), dtype=cp.int32)
    err = cp.zeros(5, dtype=cp.int32)
    func, smem = chase_kernel()
    most = resident_blocks(func, smem)
    blocks = min(n_sweeps(n), most if grid is None else max(1, min(grid, most)))
    keep = np.uint64(base if reflectors else 0)     # a null pointer: the kernel stores no reflector
    func((blocks,), (TPB,), (A, keep, goff, progress, err, np.int32(n), np.int32(b), np.int32(g),
                              np.uint64(int(timeout_s * 1e9))), shared_mem=smem)
    failed, j, k, seen, need = (int(v) for v in err.get())   # waits for the kernel
    if failed:
        raise RuntimeError(f"sb2st_device: sweep {j} waited {timeout_s} s before step {k} for sweep {j - 1}, "
                           f"which had finished {seen} of the {need} steps it needs (n={n}, b={b}, {blocks} "
                           f"blocks): a block of the grid never ran? pass a smaller grid=")
    d, e = full[:, w].copy(), full[:n - 1, w + 1].copy()
    return d, e, (groups if separate else flat) if reflectors else None


def group_starts(ptrs: list) -> tuple[int, list[int]]:
    """The kernel's (flat, goff) for groups in separate allocations: flat the lowest group
    address, goff[q] group q's element offset from it (ptrs[q] None for an empty group, which the
    kernel never addresses: offset 0).  The kernel writes group q's step k at flat + goff[q] +
    k (b + 1) g, so any addresses at whole elements from flat serve."""
    live = [p for p in ptrs if p is not None]
    if not live:
        return 0, [0] * len(ptrs)
    base = min(live)
    if any((p - base) % 8 for p in live):
        raise ValueError("sb2st_device: group allocations not 8-byte aligned to one another")
    return base, [0 if p is None else (p - base) // 8 for p in ptrs]


__all__ = ["sb2st_device", "group_starts", "working_band", "resident_blocks", "chase_kernel", "TPB", "B_MAX"]
