"""The band reduction's panel on one GPU: sy2sb_kernels.cu's sy2sb_panel, the Householder QR of
the m x b panel below the band and its block reflector's T in one cooperative launch (the kernel
file's header says how).  sy2sb.py takes it for every panel of a one-rank reduction whose first
panel fits (panel_grid), cuSOLVER's geqrf and block_reflector otherwise.

The grid: G = min(SMs, BLOCKS_MAX, ceil(m / MIN_ROWS)) blocks, each holding R = ceil(m / G) rows
of the panel in shared memory (more blocks where the rows do not fit, up to the SMs), so m up to
about SMs x 380 at b = 64 (227 KiB a block on an H100: n about 50000).  On an H100 the kernel
took 0.41 ms at m = 16320 and 0.23 ms at 256 against 1.17 and 0.56 ms for cuSOLVER's geqrf,
the copy of V and block_reflector.  Other grids won at some heights and lost at others: at
least 128 rows a block took 0.398 against 0.420 ms at m = 16320 and 0.312 against 0.283 at 4096,
at most 66 blocks 0.457 at 16320 (the record's Parts, docs/performance.md)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ._xp import _leading_dim, raw_module

KERNELS = "sy2sb_kernels.cu"
_SRC = (Path(__file__).resolve().parent / KERNELS).read_text()
THREADS = int(re.search(r"#define SY2SB_THREADS (\d+)", _SRC).group(1))   # threads per block
B_MAX = int(re.search(r"#define SY2SB_BMAX (\d+)", _SRC).group(1))        # the largest b
#: rows per block at least: below it more blocks only add to every barrier's arrivals and sums
MIN_ROWS = 64
#: blocks at most where the rows fit (and at most the GPU's SMs): every block reads every
#: block's partials per column, G^2 x 64 doubles through L2
BLOCKS_MAX = 132


def panel_smem(R: int, b: int) -> int:
    """Bytes of dynamic shared memory of a block holding R rows (sy2sb_panel_smem)."""
    return 8 * (max((R | 1) * b, b * b) + B_MAX * B_MAX + THREADS + 4 * B_MAX)


def panel_work(G: int) -> int:
    """Doubles of the work array of a grid of G blocks (sy2sb_panel_work)."""
    return 2 * (G + 1) * B_MAX


def panel_grid(m: int, b: int, sms: int, smem_most: int):
    """(G, R): blocks and rows per block for an m x b panel on a GPU of `sms` SMs that allows
    smem_most bytes of shared memory per block; None where the kernel does not take it (b above
    B_MAX, or R rows not fitting)."""
    if m < 1 or not 1 <= b <= B_MAX or sms < 1:
        return None
    G = max(1, min(sms, BLOCKS_MAX, -(-m // MIN_ROWS)))
    R = -(-m // G)
    while panel_smem(R, b) > smem_most and G < sms:    # too many rows a block: more blocks
        G = min(sms, G + max(1, G // 8))
        R = -(-m // G)
    return (G, R) if panel_smem(R, b) <= smem_most else None


class PanelQR:
    """sy2sb_panel for the panels of one band reduction of order n and half-bandwidth b on the
    current GPU.  fits: whether the kernel takes the first (largest) panel, n - b rows, and with
    it every later one; call(panel, tau, V, T) then factors a panel (the queue's order, no host
    sync)."""

    def __init__(self, n: int, b: int):
        import cupy as cp

        attrs = cp.cuda.Device().attributes
        self.sms = int(attrs["MultiProcessorCount"])
        self.most = int(attrs["MaxSharedMemoryPerBlockOptin"])
        self.b = b
        self.fits = n - b >= 1 and panel_grid(n - b, b, self.sms, self.most) is not None
        if not self.fits:
            return
        self.func = raw_module(KERNELS, cooperative=True).get_function("sy2sb_panel")
        self.func.max_dynamic_shared_size_bytes = self.most
        self.work = cp.empty(panel_work(self.sms), dtype=cp.float64)
        self.bar = cp.zeros(1, dtype=cp.uint32)       # the grid barrier's counter (never reset)

    def __call__(self, panel, tau, V, T) -> None:
        """panel (m x b, a column-major block of C) := geqrf's R and v; tau[:b] (a contiguous
        slice) := the reflectors' scalars (0 from min(m, b) on); V (m x b, F-order) := the unit
        lower trapezoidal V; T (b x b, F-order) := the block reflector's upper triangular T."""
        m, b = panel.shape
        grid = panel_grid(m, b, self.sms, self.most)
        if grid is None or b != self.b:
            raise ValueError(f"PanelQR: a {m} x {b} panel does not fit the kernel (b = {self.b}, "
                             f"{self.sms} SMs, {self.most} bytes of shared memory a block)")
        if V.shape != (m, b) or not V.flags.f_contiguous or T.shape != (b, b) or not T.flags.f_contiguous:
            raise ValueError(f"PanelQR: V must be F-order {m} x {b} and T F-order {b} x {b}; got {V.shape}, {T.shape}")
        if tau.size < b or not tau.flags.c_contiguous:
            raise ValueError(f"PanelQR: tau must be a contiguous slice of at least {b} entries")
        G, R = grid
        self.func((G,), (THREADS,), (panel, np.int64(_leading_dim(panel)), np.int32(m), np.int32(b), tau, V, T,
                                     self.work, self.bar), shared_mem=panel_smem(R, b))


__all__ = ["PanelQR", "panel_grid", "panel_smem", "panel_work", "B_MAX", "MIN_ROWS", "THREADS"]
