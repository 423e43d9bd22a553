"""The two-stage tridiagonalization C = Q1 Q2 T Q2^T Q1^T and its back-transformation Q1 Q2 Z.

  sy2sb   dense -> band of half-bandwidth b, BLAS-3, distributed (sy2sb.py): per panel of b
          columns one Bcast and one Allreduce.
  sb2st   band -> tridiagonal by bulge chasing (sb2st.py) on rank 0: one Allgather brings it
          the band ((b + 1) x n), one Bcast gives every rank d and e.  Rank 0 keeps Q2's
          reflectors (about n^2 / 2 numbers) until the back-transformation.
  Q1 Q2 Z Q2 by compact-WY blocks of g sweeps (sb2st.apply_q2), each group reaching the ranks by
          one Bcast from rank 0 (n / g in all); then Q1 by ormtr.ormtr with offset b (one Bcast
          per panel of reflectors, as the one-stage path).

The choice of b: the band reduction's GEMMs have inner dimension b (larger is faster), the bulge
chasing's steps number about n^2 / (2 b) with O(b^2) work each, and Q2's blocks cost (b + g) / b
times the flops of Q2 applied alone.  On the host, b = 64 gave the shortest reduction plus
back-transformation of 16, 32 and 64 at n = 1500 on a 2-core host (bench/host_solver.py
--sweep-band re-runs it): TWO_STAGE_BAND.  The GPU's: TWO_STAGE_BAND_DEVICE."""
from __future__ import annotations

import numpy as np

from ._xp import is_device, to_host
from .layout import BlockCyclic
from .ormtr import ormtr
from .sb2st import apply_q2, group_offsets, group_shape, sb2st
from .sy2sb import check_band, gather_band, sy2sb

#: the largest half-bandwidth the two-stage reduction uses: b is the largest divisor of the
#: layout's nb not above it (sy2sb needs b | nb)
TWO_STAGE_BAND = 64
#: the GPU's: at n = 16384 on an H100 the reduction (sy2sb + bulge chasing) took 0.92 s at b = 64
#: against 1.11 s at b = 32 (the band reduction's panels cost more at b = 32 than the bulge chasing
#: saves), and Q2 on n x n eigenvectors (g = b) 0.71 s against 1.77 s: b = 64 whatever the
#: eigenvector columns (docs/performance.md); bench/twostage_parts.py times every part per b
TWO_STAGE_BAND_DEVICE = 64


def device_band(nb: int) -> int:
    """The GPU's half-bandwidth for layout block nb."""
    return band_width(nb, TWO_STAGE_BAND_DEVICE)


def band_width(nb: int, target: int = TWO_STAGE_BAND) -> int:
    """The half-bandwidth for layout block nb: the largest divisor of nb that is <= target."""
    return max(d for d in range(1, min(nb, target) + 1) if nb % d == 0)


class TwoStageQ:
    """Q = Q1 Q2 of a two-stage tridiagonalization, applied by apply(Z)."""

    def __init__(self, V1, tau1, b: int, g: int, refl, desc: BlockCyclic, comm, xp):
        self.V1, self.tau1, self.b, self.g = V1, tau1, b, g
        # Q2's reflectors: on the host, rank 0's list of groups (None elsewhere), sent group by
        # group; on the GPU, every rank's copy of all groups in one flat array (group_offsets)
        self.refl = refl
        self.desc, self.comm, self.xp = desc, comm, xp

    def apply(self, Z):
        """Z <- Q1 Q2 Z on the owned columns Z (every rank calls it)."""
        xp, comm, n = self.xp, self.comm, self.desc.n
        refl, self.refl = self.refl, None      # released as it is used
        if is_device(xp):
            from .q2_device import apply_q2_device

            apply_q2_device(refl, n, self.b, self.g, Z)
        else:
            def group(q):
                shape = group_shape(n, self.b, self.g, q)
                buf = xp.empty(shape, dtype=xp.float64)
                if comm.Get_rank() == 0:
                    buf[...] = xp.asarray(refl[q])
                    refl[q] = None
                if comm.Get_size() > 1:
                    comm.Bcast(buf, root=0)
                return buf

            apply_q2(group, n, self.b, self.g, Z, xp)
        del refl
        ormtr(self.V1, self.tau1, Z, self.desc, comm, xp, offset=self.b)
        return Z


def two_stage(C, desc: BlockCyclic, comm, xp, b: int | None = None, g: int | None = None, vectors: bool = True):
    """Tridiagonalize the distributed symmetric C (lower triangle, strict upper zero) in two
    stages.  Returns (d, e, Q): T's diagonals (replicated, arrays of xp) and a TwoStageQ (None
    with vectors=False: Q2's reflectors are then dropped as they are made); C's columns then
    hold Q1's reflectors.  On the GPU the bulge chasing runs on rank 0's device
    (sb2st_device.py), and with vectors one Bcast gives every rank Q2's reflectors.  b: the
    half-bandwidth (default: TWO_STAGE_BAND on the host, device_band on the GPU)."""
    device = is_device(xp)
    if b is None:
        b = device_band(desc.nb) if device else band_width(desc.nb, TWO_STAGE_BAND)
    check_band(desc, b)
    g = b if g is None else g
    band, tau1 = sy2sb(C, desc, comm, xp, b)
    full = gather_band(band, desc, comm, xp)
    del band
    n, root = desc.n, comm.Get_rank() == 0
    de = xp.empty(2 * n, dtype=xp.float64)
    refl = None
    if root:   # the bulge chasing: the GPU kernel, or NumPy on the host
        if device:
            from .sb2st_device import sb2st_device

            d, e, refl = sb2st_device(full, g, reflectors=vectors)
        else:
            d, e, refl = sb2st(np.ascontiguousarray(to_host(full)), g)
        de[:n], de[n:2 * n - 1] = xp.asarray(d), xp.asarray(e)
        de[2 * n - 1:] = 0.0
        del d, e
    del full
    comm.Bcast(de, root=0)
    if device and vectors and comm.Get_size() > 1:   # every rank's copy of Q2's reflectors
        if not root:
            refl = xp.empty(group_offsets(n, b, g)[-1], dtype=xp.float64)
        comm.Bcast(refl, root=0)
    Q = TwoStageQ(C, tau1, b, g, refl, desc, comm, xp) if vectors else None
    return de[:n], de[n:2 * n - 1], Q


__all__ = ["two_stage", "TwoStageQ", "band_width", "device_band", "TWO_STAGE_BAND", "TWO_STAGE_BAND_DEVICE"]
